//! Conversions between the etcd protobuf messages and kine-core's plain types.
//! Out-of-range enum values are rejected here, never silently mapped.

use kine_core::request as core;
use kine_core::{Error, Event, EventKind, KeyRange, KeyValue, Result, Revision};
use kine_proto::etcdserverpb as pb;
use kine_proto::mvccpb;

pub fn range_request(r: pb::RangeRequest) -> Result<core::RangeRequest> {
    let sort_order = match pb::range_request::SortOrder::try_from(r.sort_order) {
        Ok(pb::range_request::SortOrder::None) => core::SortOrder::None,
        Ok(pb::range_request::SortOrder::Ascend) => core::SortOrder::Ascend,
        Ok(pb::range_request::SortOrder::Descend) => core::SortOrder::Descend,
        Err(_) => return Err(Error::InvalidSortOption),
    };
    let sort_target = match pb::range_request::SortTarget::try_from(r.sort_target) {
        Ok(pb::range_request::SortTarget::Key) => core::SortTarget::Key,
        Ok(pb::range_request::SortTarget::Version) => core::SortTarget::Version,
        Ok(pb::range_request::SortTarget::Create) => core::SortTarget::Create,
        Ok(pb::range_request::SortTarget::Mod) => core::SortTarget::Mod,
        Ok(pb::range_request::SortTarget::Value) => core::SortTarget::Value,
        Err(_) => return Err(Error::InvalidSortOption),
    };
    Ok(core::RangeRequest {
        range: KeyRange::from_etcd(r.key, r.range_end),
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
        total_count: true,
    })
}

pub fn put_request(r: pb::PutRequest) -> core::PutRequest {
    core::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn delete_request(r: pb::DeleteRangeRequest) -> core::DeleteRangeRequest {
    core::DeleteRangeRequest { range: KeyRange::from_etcd(r.key, r.range_end), prev_kv: r.prev_kv }
}

fn compare(c: pb::Compare) -> Result<core::Compare> {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result) {
        Ok(R::Equal) => core::CompareResult::Equal,
        Ok(R::Greater) => core::CompareResult::Greater,
        Ok(R::Less) => core::CompareResult::Less,
        Ok(R::NotEqual) => core::CompareResult::NotEqual,
        Err(_) => return Err(Error::InvalidArgument(format!("etcdserver: unknown compare result {}", c.result))),
    };
    // As etcd: an operand missing from the union compares as the zero value.
    let u = c.target_union;
    let target = match T::try_from(c.target) {
        Ok(T::Version) => core::CompareTarget::Version(match u {
            Some(U::Version(v)) => v,
            _ => 0,
        }),
        Ok(T::Create) => core::CompareTarget::Create(match u {
            Some(U::CreateRevision(v)) => v,
            _ => 0,
        }),
        Ok(T::Mod) => core::CompareTarget::Mod(match u {
            Some(U::ModRevision(v)) => v,
            _ => 0,
        }),
        Ok(T::Value) => core::CompareTarget::Value(match u {
            Some(U::Value(v)) => v,
            _ => Vec::new(),
        }),
        Ok(T::Lease) => core::CompareTarget::Lease(match u {
            Some(U::Lease(v)) => v,
            _ => 0,
        }),
        Err(_) => return Err(Error::InvalidArgument(format!("etcdserver: unknown compare target {}", c.target))),
    };
    Ok(core::Compare { range: KeyRange::from_etcd(c.key, c.range_end), result, target })
}

fn request_op(op: pb::RequestOp) -> Result<core::RequestOp> {
    use pb::request_op::Request;
    match op.request {
        Some(Request::RequestRange(r)) => Ok(core::RequestOp::Range(range_request(r)?)),
        Some(Request::RequestPut(r)) => Ok(core::RequestOp::Put(put_request(r))),
        Some(Request::RequestDeleteRange(r)) => Ok(core::RequestOp::DeleteRange(delete_request(r))),
        Some(Request::RequestTxn(t)) => Ok(core::RequestOp::Txn(txn_request(t)?)),
        None => Err(Error::InvalidArgument("etcdserver: txn operation has no request".into())),
    }
}

pub fn txn_request(t: pb::TxnRequest) -> Result<core::TxnRequest> {
    Ok(core::TxnRequest {
        compare: t.compare.into_iter().map(compare).collect::<Result<_>>()?,
        success: t.success.into_iter().map(request_op).collect::<Result<_>>()?,
        failure: t.failure.into_iter().map(request_op).collect::<Result<_>>()?,
    })
}

pub fn kv(kv: KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

pub fn kv_from_proto(kv: mvccpb::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

pub fn event(e: Event) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match e.kind {
            EventKind::Put => mvccpb::event::EventType::Put as i32,
            EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(kv(e.kv)),
        prev_kv: e.prev_kv.map(kv),
    }
}

/// Builds response headers: stable cluster and member ids, and the store revision.
#[derive(Clone, Copy, Debug)]
pub struct Headers {
    pub cluster_id: u64,
    pub member_id: u64,
}

impl Headers {
    pub fn at(&self, revision: Revision) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader { cluster_id: self.cluster_id, member_id: self.member_id, revision, raft_term: 0 })
    }

    pub fn range_response(&self, r: core::RangeResponse, revision: Revision) -> pb::RangeResponse {
        pb::RangeResponse {
            header: self.at(revision),
            kvs: r.kvs.into_iter().map(kv).collect(),
            more: r.more,
            count: r.count,
        }
    }

    pub fn put_response(&self, r: core::PutResponse, revision: Revision) -> pb::PutResponse {
        pb::PutResponse { header: self.at(revision), prev_kv: r.prev_kv.map(kv) }
    }

    pub fn delete_response(&self, r: core::DeleteRangeResponse, revision: Revision) -> pb::DeleteRangeResponse {
        pb::DeleteRangeResponse {
            header: self.at(revision),
            deleted: r.deleted,
            prev_kvs: r.prev_kvs.into_iter().map(kv).collect(),
        }
    }

    pub fn txn_response(&self, r: core::TxnResponse, revision: Revision) -> pb::TxnResponse {
        pb::TxnResponse { header: self.at(revision), ..self.inner_txn(r) }
    }

    /// The operations' answers of a txn. As in etcd, each carries only the revision at its
    /// point of the txn (no cluster or member id), and a nested txn's own header is empty.
    fn inner_txn(&self, r: core::TxnResponse) -> pb::TxnResponse {
        use pb::response_op::Response;
        let op_header = |revision| Some(pb::ResponseHeader { revision, ..Default::default() });
        let responses = r
            .responses
            .into_iter()
            .map(|op| pb::ResponseOp {
                response: Some(match op {
                    core::ResponseOp::Range(r) => Response::ResponseRange(pb::RangeResponse {
                        header: op_header(r.revision),
                        ..self.range_response(r.value, r.revision)
                    }),
                    core::ResponseOp::Put(r) => Response::ResponsePut(pb::PutResponse {
                        header: op_header(r.revision),
                        ..self.put_response(r.value, r.revision)
                    }),
                    core::ResponseOp::DeleteRange(r) => Response::ResponseDeleteRange(pb::DeleteRangeResponse {
                        header: op_header(r.revision),
                        ..self.delete_response(r.value, r.revision)
                    }),
                    core::ResponseOp::Txn(r) => Response::ResponseTxn(pb::TxnResponse {
                        header: Some(pb::ResponseHeader::default()),
                        ..self.inner_txn(r)
                    }),
                }),
            })
            .collect();
        pb::TxnResponse { header: None, succeeded: r.succeeded, responses }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_enums_are_rejected() {
        let bad_target = pb::TxnRequest {
            compare: vec![pb::Compare { key: b"k".to_vec(), target: 42, ..Default::default() }],
            ..Default::default()
        };
        let err = txn_request(bad_target).unwrap_err();
        assert_eq!(err.to_string(), "etcdserver: unknown compare target 42");
        let bad_result = pb::TxnRequest {
            compare: vec![pb::Compare { key: b"k".to_vec(), result: 9, ..Default::default() }],
            ..Default::default()
        };
        assert_eq!(txn_request(bad_result).unwrap_err().to_string(), "etcdserver: unknown compare result 9");
        let bad_sort = pb::RangeRequest { key: b"k".to_vec(), sort_order: 7, ..Default::default() };
        assert!(matches!(range_request(bad_sort), Err(Error::InvalidSortOption)));
        let empty_op = pb::TxnRequest { success: vec![pb::RequestOp { request: None }], ..Default::default() };
        assert!(txn_request(empty_op).is_err());
    }

    #[test]
    fn a_missing_operand_compares_as_zero() {
        let t = pb::TxnRequest {
            compare: vec![pb::Compare {
                key: b"k".to_vec(),
                target: pb::compare::CompareTarget::Mod as i32,
                target_union: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = txn_request(t).unwrap();
        assert_eq!(t.compare[0].target, core::CompareTarget::Mod(0));
    }
}
