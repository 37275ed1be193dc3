//! KV over real gRPC with the etcd-client crate: revisions, txn shapes, pagination,
//! historical reads, compaction and bad input.

mod common;
use common::*;
use etcd_client::*;

fn code(e: &Error) -> (tonic::Code, String) {
    match e {
        Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

#[tokio::test]
async fn revisions_follow_etcd() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let r = c.get("/registry/health", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 1);
    assert_ne!(r.header().unwrap().cluster_id(), 0);
    assert_ne!(r.header().unwrap().member_id(), 0);
    let r = c.put("a", "1", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 2);
    let r = c.put("a", "2", Some(PutOptions::new().with_prev_key())).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 3);
    assert_eq!(r.prev_key().unwrap().value(), b"1");
    let r = c.get("a", None).await.unwrap();
    let kv = &r.kvs()[0];
    assert_eq!((kv.create_revision(), kv.mod_revision(), kv.version()), (2, 3, 2));
    // A delete costs exactly one revision; a delete of nothing costs none.
    let r = c.delete("a", Some(DeleteOptions::new().with_prev_key())).await.unwrap();
    assert_eq!((r.deleted(), r.header().unwrap().revision()), (1, 4));
    assert_eq!(r.prev_kvs()[0].value(), b"2");
    let r = c.delete("a", None).await.unwrap();
    assert_eq!((r.deleted(), r.header().unwrap().revision()), (0, 4));
    // Historical read: header carries the current revision.
    let r = c.get("a", Some(GetOptions::new().with_revision(2))).await.unwrap();
    assert_eq!((r.kvs()[0].value(), r.header().unwrap().revision()), (b"1".as_slice(), 4));
    // A negative revision reads the current one, as in etcd.
    let r = c.get("a", Some(GetOptions::new().with_revision(-1))).await.unwrap();
    assert_eq!(r.count(), 0);
}

#[tokio::test]
async fn kubernetes_txn_shapes() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let key = "/registry/pods/default/p";
    let create = |v: &str| {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, v, None)])
            .or_else([TxnOp::get(key, None)])
    };
    let r = c.txn(create("v1")).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(r.header().unwrap().revision(), 2);
    let r = c.txn(create("v2")).await.unwrap();
    assert!(!r.succeeded());
    match &r.op_responses()[0] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), b"v1"),
        other => panic!("expected get, got {other:?}"),
    }
    let update = |rev, v: &str| {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, rev)])
            .and_then([TxnOp::put(key, v, None)])
            .or_else([TxnOp::get(key, None)])
    };
    assert!(c.txn(update(2, "v3")).await.unwrap().succeeded());
    let r = c.txn(update(2, "stale")).await.unwrap();
    assert!(!r.succeeded());
    match &r.op_responses()[0] {
        TxnOpResponse::Get(g) => assert_eq!((g.kvs()[0].value(), g.kvs()[0].mod_revision()), (b"v3".as_slice(), 3)),
        other => panic!("expected get, got {other:?}"),
    }
    let delete = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, 3)])
        .and_then([TxnOp::delete(key, None)])
        .or_else([TxnOp::get(key, None)]);
    let r = c.txn(delete).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(r.header().unwrap().revision(), 4);
    // The apiserver's compaction bookkeeping: a version CAS on compact_rev_key.
    let cas = |ver, v: &str| {
        Txn::new()
            .when([Compare::version("compact_rev_key", CompareOp::Equal, ver)])
            .and_then([TxnOp::put("compact_rev_key", v, None)])
            .or_else([TxnOp::get("compact_rev_key", None)])
    };
    assert!(c.txn(cas(0, "4")).await.unwrap().succeeded());
    assert!(!c.txn(cas(0, "5")).await.unwrap().succeeded());
    assert!(c.txn(cas(1, "5")).await.unwrap().succeeded());
    let r = c.compact(4, None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 6);
}

#[tokio::test]
async fn pagination_count_and_range_options() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    for i in 0..25 {
        c.put(format!("/registry/cm/{i:02}"), format!("{i}"), None).await.unwrap();
    }
    c.put("/registry/other", "x", None).await.unwrap();
    let mut seen = Vec::new();
    let mut start = b"/registry/cm/".to_vec();
    let end = b"/registry/cm0".to_vec();
    let mut rev = 0;
    loop {
        let r = c
            .get(start.clone(), Some(GetOptions::new().with_range(end.clone()).with_limit(10).with_revision(rev)))
            .await
            .unwrap();
        rev = r.header().unwrap().revision();
        seen.extend(r.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()));
        assert_eq!(r.count() as usize, 25 - (seen.len() - r.kvs().len()));
        if !r.more() {
            break;
        }
        start = r.kvs().last().unwrap().key().to_vec();
        start.push(0);
    }
    assert_eq!(seen.len(), 25);
    assert_eq!(seen[0], "/registry/cm/00");
    let r = c.get("/registry/cm/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert_eq!((r.count(), r.kvs().len()), (25, 0));
    let r = c
        .get(
            "/registry/cm/",
            Some(GetOptions::new().with_prefix().with_sort(SortTarget::Mod, SortOrder::Descend).with_limit(1)),
        )
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].key(), b"/registry/cm/24");
    let r = c.get("/registry/", Some(GetOptions::new().with_from_key().with_keys_only())).await.unwrap();
    assert_eq!(r.count(), 26);
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));
    let r = c.get("", Some(GetOptions::new().with_all_keys().with_serializable())).await.unwrap();
    assert_eq!(r.count(), 26);
}

#[tokio::test]
async fn compaction_errors_and_survivors() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    for i in 0..5 {
        c.put("k", format!("{i}"), None).await.unwrap(); // revisions 2..=6
    }
    let e = c.compact(7, None).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision".into()));
    c.compact(4, Some(CompactionOptions::new().with_physical())).await.unwrap();
    let e = c.get("k", Some(GetOptions::new().with_revision(3))).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted".into()));
    let e = c.compact(4, None).await.unwrap_err();
    assert_eq!(code(&e).1, "etcdserver: mvcc: required revision has been compacted");
    assert_eq!(c.get("k", Some(GetOptions::new().with_revision(4))).await.unwrap().kvs()[0].value(), b"2");
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"4");
    let e = c.get("k", Some(GetOptions::new().with_revision(100))).await.unwrap_err();
    assert_eq!(code(&e).1, "etcdserver: mvcc: required revision is a future revision");
}

#[tokio::test]
async fn bad_input_gets_etcd_errors_and_no_panic() {
    let (server, _dir) = sqlite_server(&["--max-request-bytes", "1048576"]);
    let mut c = server.client().await;
    let e = c.put("", "v", None).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::InvalidArgument, "etcdserver: key is not provided".into()));
    let e = c.get("", None).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::InvalidArgument, "etcdserver: key is not provided".into()));
    let big = vec![b'x'; 1_100_000];
    let e = c.put("big", big, None).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::InvalidArgument, "etcdserver: request is too large".into()));
    // Far beyond the gRPC limit: refused by the transport, server unharmed.
    let huge = vec![b'x'; 3_000_000];
    assert!(c.put("huge", huge, None).await.is_err());
    let e = c.put("k", "v", Some(PutOptions::new().with_lease(12345))).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::NotFound, "etcdserver: requested lease not found".into()));
    let e = c.put("missing", "", Some(PutOptions::new().with_ignore_value())).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::InvalidArgument, "etcdserver: key not found".into()));
    let dup = Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]);
    let e = c.txn(dup).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::InvalidArgument, "etcdserver: duplicate key given in txn request".into()));
    let many: Vec<TxnOp> = (0..129).map(|i| TxnOp::put(format!("m{i}"), "v", None)).collect();
    let e = c.txn(Txn::new().and_then(many)).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::InvalidArgument, "etcdserver: too many operations in txn request".into()));
    // A range whose end sorts before its key is empty, not an error.
    let r = c.get("b", Some(GetOptions::new().with_range("a"))).await.unwrap();
    assert_eq!(r.count(), 0);
    // Still serving.
    assert_eq!(c.put("ok", "v", None).await.unwrap().header().unwrap().revision(), 2);
}

#[tokio::test]
async fn unsupported_rpcs_are_rejected_precisely() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let e = c.move_leader(1).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::Unimplemented, "Maintenance.MoveLeader is not supported by kine-rs".into()));
    let e = c.member_add(["http://127.0.0.1:1"], None).await.unwrap_err();
    assert_eq!(code(&e).0, tonic::Code::Unimplemented);
    // Auth is served (auth.rs, auth_differential.rs): enabling it without a root user fails as in etcd.
    let e = c.auth_enable().await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::FailedPrecondition, "etcdserver: root user does not exist".into()));
    // MemberPromote answers as etcd does for a member that is not a learner (only a read-only
    // copy of a NATS bucket is one, nats_copy.rs).
    let id = c.member_list().await.unwrap().members()[0].id();
    let e = c.member_promote(id).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::FailedPrecondition, "etcdserver: can only promote a learner member".into()));
    let e = c.member_promote(id ^ 1).await.unwrap_err();
    assert_eq!(code(&e), (tonic::Code::NotFound, "etcdserver: member not found".into()));
}

/// The write system calls the server process has made (`syscw` in /proc/PID/io: write and
/// writev, all threads).
fn writes_of(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("read /proc/PID/io");
    let line = io.lines().find(|l| l.starts_with("syscw:")).expect("syscw in /proc/PID/io");
    line["syscw:".len()..].trim().parse().expect("syscw is a number")
}

/// A unary response (HEADERS, DATA, trailers) leaves in one write when its message fits in the
/// HTTP/2 write buffer (vendor/h2, patch 2): stock h2 writes a DATA payload of 256 bytes or more
/// on its own and the trailers after it, two writes per response, and the client reads two
/// segments.
#[tokio::test]
async fn a_response_leaves_in_one_write() {
    let server = Server::start(&["--endpoint", "memory://"]);
    let mut c = server.client().await;
    let pid = server.child.id();
    for size in [300, 4096, 12_000] {
        let key = format!("value-of-{size}");
        c.put(key.as_str(), vec![b'v'; size], None).await.unwrap();
        for _ in 0..20 {
            c.get(key.as_str(), None).await.unwrap();
        }
        let before = writes_of(pid);
        let gets = 200;
        for _ in 0..gets {
            let r = c.get(key.as_str(), None).await.unwrap();
            assert_eq!(r.kvs()[0].value().len(), size);
        }
        let writes = writes_of(pid) - before;
        assert!(writes <= gets + gets / 10, "{writes} writes for {gets} gets of {size}-byte values");
    }
}

/// A put with `ignore_value` on a missing key naming a missing lease: a Put RPC answers that
/// the lease is missing (every etcd version); in a Txn etcd 3.6 answers that the key is, etcd
/// 3.7 that the lease is (it checks the lease first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_on_a_missing_key_and_lease_fails_as_the_emulated_version_does() {
    let lease_missing = (tonic::Code::NotFound, "etcdserver: requested lease not found".to_string());
    let key_missing = (tonic::Code::InvalidArgument, "etcdserver: key not found".to_string());
    for (version, in_txn) in [("3.7.3", &lease_missing), ("3.6.16", &key_missing)] {
        let (server, _dir) = sqlite_server(&["--emulated-etcd-version", version]);
        let mut c = server.client().await;
        let put = || PutOptions::new().with_ignore_value().with_lease(4242);
        assert_eq!(code(&c.put("missing", "", Some(put())).await.unwrap_err()), lease_missing, "{version}: Put");
        let txn = Txn::new().and_then([TxnOp::put("missing", "", Some(put()))]);
        assert_eq!(code(&c.txn(txn).await.unwrap_err()), *in_txn, "{version}: Txn");
        // In a nested Txn of the branch taken (the compare fails: the failure branch).
        let inner = Txn::new().and_then([TxnOp::put("missing", "", Some(put()))]);
        let outer = Txn::new().when([Compare::version("x", CompareOp::Greater, 5)]).or_else([TxnOp::txn(inner)]);
        assert_eq!(code(&c.txn(outer).await.unwrap_err()), *in_txn, "{version}: nested Txn");
        // Only the missing key: every version says so.
        let txn = Txn::new().and_then([TxnOp::put("missing", "", Some(PutOptions::new().with_ignore_value()))]);
        assert_eq!(code(&c.txn(txn).await.unwrap_err()), key_missing, "{version}: Txn, key only");
    }
}
