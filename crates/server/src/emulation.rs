//! What differs between the etcd versions kine-rs emulates (`--emulated-etcd-version`), applied
//! to answers. etcd 3.7 builds keys-only Range results from its in-memory index, which holds no
//! lease: every key comes back with lease 0 (etcd issue #22209; 3.6 returns the lease) — unless
//! the range is sorted by value, which needs the stored values, so the keys come from them with
//! their leases (etcd's keys-only shortcut is taken only when the sort target is not the value).
//! The differential test checks kine-rs against each version.

use kine_proto::etcdserverpb as pb;
use pb::request_op::Request;
use pb::response_op::Response;

/// Does etcd 3.7 answer this Range from its index alone (keys-only, not sorted by value)?
pub fn drops_lease(q: &pb::RangeRequest) -> bool {
    q.keys_only && q.sort_target != pb::range_request::SortTarget::Value as i32
}

/// Leases dropped from the answer of a Range for which [`drops_lease`] holds, as etcd 3.7 does.
pub fn range(drop: bool, kvs: &mut [kine_proto::mvccpb::KeyValue]) {
    if drop {
        kvs.iter_mut().for_each(|kv| kv.lease = 0);
    }
}

/// A put whose key and lease are both missing answered with the lease's error: a Put RPC
/// (every version) and a Txn from etcd 3.7 on check the lease first; 3.6's Txn checks the key
/// first, which is the error's own mapping.
pub fn lease_first(e: kine_core::Error) -> kine_core::Error {
    match e {
        kine_core::Error::KeyAndLeaseNotFound => kine_core::Error::LeaseNotFound,
        e => e,
    }
}

/// The same for every keys-only Range of the branch a Txn ran.
pub fn txn(req: &pb::TxnRequest, resp: &mut pb::TxnResponse) {
    let ops = if resp.succeeded { &req.success } else { &req.failure };
    for (op, r) in ops.iter().zip(resp.responses.iter_mut()) {
        match (&op.request, &mut r.response) {
            (Some(Request::RequestRange(q)), Some(Response::ResponseRange(a))) => range(drops_lease(q), &mut a.kvs),
            (Some(Request::RequestTxn(q)), Some(Response::ResponseTxn(a))) => txn(q, a),
            _ => {}
        }
    }
}
