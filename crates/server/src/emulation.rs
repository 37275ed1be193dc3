//! What differs between the etcd versions kine-rs emulates (`--emulated-etcd-version`), applied
//! to answers. etcd 3.7 builds keys-only Range results from its in-memory index, which holds no
//! lease: every key comes back with lease 0 (etcd issue #22209; 3.6 returns the lease). The
//! differential test checks kine-rs against each version.

use kine_proto::etcdserverpb as pb;
use pb::request_op::Request;
use pb::response_op::Response;

/// Leases dropped from a keys-only Range's answer, as etcd 3.7 does.
pub fn range(keys_only: bool, kvs: &mut [kine_proto::mvccpb::KeyValue]) {
    if keys_only {
        kvs.iter_mut().for_each(|kv| kv.lease = 0);
    }
}

/// The same for every keys-only Range of the branch a Txn ran.
pub fn txn(req: &pb::TxnRequest, resp: &mut pb::TxnResponse) {
    let ops = if resp.succeeded { &req.success } else { &req.failure };
    for (op, r) in ops.iter().zip(resp.responses.iter_mut()) {
        match (&op.request, &mut r.response) {
            (Some(Request::RequestRange(q)), Some(Response::ResponseRange(a))) => range(q.keys_only, &mut a.kvs),
            (Some(Request::RequestTxn(q)), Some(Response::ResponseTxn(a))) => txn(q, a),
            _ => {}
        }
    }
}
