//! etcd KV requests and responses as plain Rust types (mirroring `etcdserverpb`, minus gRPC).

use crate::types::{KeyRange, KeyValue, LeaseId, Revision};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRequest {
    pub range: KeyRange,
    /// 0 = no limit.
    pub limit: i64,
    /// 0 (or negative) = current revision.
    pub revision: Revision,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: Revision,
    pub max_mod_revision: Revision,
    pub min_create_revision: Revision,
    pub max_create_revision: Revision,
    /// `count` is every key in the range (etcd's Range). `false`: only the keys returned, with
    /// `more` still exact — for a part of a RangeStream, which counts once at the end.
    pub total_count: bool,
}

impl RangeRequest {
    pub fn new(range: KeyRange) -> RangeRequest {
        RangeRequest {
            range,
            limit: 0,
            revision: 0,
            sort_order: SortOrder::None,
            sort_target: SortTarget::Key,
            serializable: false,
            keys_only: false,
            count_only: false,
            min_mod_revision: 0,
            max_mod_revision: 0,
            min_create_revision: 0,
            max_create_revision: 0,
            total_count: true,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub lease: LeaseId,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutResponse {
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeResponse {
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the operand to compare against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    Create(Revision),
    Mod(Revision),
    Value(Vec<u8>),
    Lease(LeaseId),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub range: KeyRange,
    pub result: CompareResult,
    pub target: CompareTarget,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseOp {
    /// Each operation's answer carries the revision etcd reports in its own header: the
    /// revision at that point of the txn.
    Range(Revisioned<RangeResponse>),
    Put(Revisioned<PutResponse>),
    DeleteRange(Revisioned<DeleteRangeResponse>),
    /// A nested txn's answer has no revision of its own (etcd leaves its header empty).
    Txn(TxnResponse),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnResponse {
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

impl TxnResponse {
    /// For a backend whose write landed at another revision than the one it was evaluated for
    /// (`from`): the operations' answers report `to` instead.
    pub fn renumber(&mut self, from: Revision, to: Revision) {
        let fix = |r: &mut Revision| {
            if *r == from {
                *r = to;
            }
        };
        // Versions this txn wrote (and read back) carry its revision too.
        let fix_kv = |kv: &mut crate::types::KeyValue| {
            fix(&mut kv.create_revision);
            fix(&mut kv.mod_revision);
        };
        for op in &mut self.responses {
            match op {
                ResponseOp::Range(r) => {
                    fix(&mut r.revision);
                    r.value.kvs.iter_mut().for_each(fix_kv);
                }
                ResponseOp::Put(r) => {
                    fix(&mut r.revision);
                    r.value.prev_kv.iter_mut().for_each(fix_kv);
                }
                ResponseOp::DeleteRange(r) => {
                    fix(&mut r.revision);
                    r.value.prev_kvs.iter_mut().for_each(fix_kv);
                }
                ResponseOp::Txn(t) => t.renumber(from, to),
            }
        }
    }
}

/// A response to any KV request with the store revision to report in its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revisioned<T> {
    /// The store's current revision once the request took effect.
    pub revision: Revision,
    pub value: T,
}
