//! The Maintenance RPCs beyond Status: a snapshot saved with `etcdctl snapshot save` and
//! restored with `kine-rs snapshot restore`; Hash/HashKV (following the data, equal on two
//! nodes of one NATS bucket); alarms as etcd applies them, and NOSPACE raised by a full NATS
//! stream.

mod common;
use common::*;
use etcd_client::*;
use kine_testkit::nats::NatsServer;
use std::process::Command;

fn code_and_text(e: etcd_client::Error) -> (tonic::Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

#[tokio::test]
async fn a_snapshot_saved_with_etcdctl_restores_into_a_new_database() {
    let (server, dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    c.put("a", "1", None).await.unwrap();
    c.put("a", "2", None).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("b", "leased", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    // Two keys at one revision.
    c.txn(Txn::new().and_then([TxnOp::put("c", "x", None), TxnOp::put("d", vec![0u8, 255, 7], None)])).await.unwrap();
    c.put("e", "gone", None).await.unwrap();
    c.delete("e", None).await.unwrap();
    c.put("f", vec![9u8; 100_000], None).await.unwrap();
    c.compact(3, None).await.unwrap();
    let (revision, before) = everything(&mut c).await;
    let past = keys_at(&mut c, revision - 2).await;

    let file = dir.path().join("backup.db");
    let (ok, out, err) = run(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &server.url, "snapshot", "save"])
        .arg(&file));
    assert!(ok, "etcdctl snapshot save failed: {out}{err}");
    assert!(format!("{out}{err}").contains("Snapshot saved"), "{out}{err}");

    let restored = dir.path().join("restored").join("state.db");
    let endpoint = format!("sqlite://{}", restored.display());
    let restore = |file: &std::path::Path| {
        run(Command::new(server_bin()).args(["--endpoint", &endpoint, "snapshot", "restore"]).arg(file))
    };
    let (ok, _, err) = restore(&file);
    assert!(ok, "restore failed: {err}");
    assert!(err.contains("snapshot restored"), "{err}");
    // Never over an existing database; a damaged file is refused.
    let (ok, _, err) = restore(&file);
    assert!(!ok && err.contains("already exists"), "{err}");
    let mut damaged = std::fs::read(&file).unwrap();
    damaged[100] ^= 1;
    let damaged_file = dir.path().join("damaged.db");
    std::fs::write(&damaged_file, damaged).unwrap();
    std::fs::remove_file(&restored).unwrap();
    let (ok, _, err) = restore(&damaged_file);
    assert!(!ok && err.contains("sha256"), "{err}");
    assert!(!restored.exists(), "a refused restore writes nothing");
    let (ok, _, err) = restore(&file);
    assert!(ok, "restore failed: {err}");
    drop(server);

    let server = Server::start(&["--endpoint", &endpoint]);
    let mut c = server.client().await;
    assert_eq!(everything(&mut c).await, (revision, before), "the same keys, versions and revisions");
    // The history since the compaction came along (etcd's format holds it), not before.
    assert_eq!(keys_at(&mut c, revision - 2).await, past);
    let (code, text) = code_and_text(c.get("a", Some(GetOptions::new().with_revision(2))).await.unwrap_err());
    assert_eq!(
        (code, text.as_str()),
        (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted")
    );
    let ttl = c.lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
    assert_eq!((ttl.granted_ttl(), ttl.keys().to_vec()), (600, vec![b"b".to_vec()]));
    let r = c.put("g", "next", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), revision + 1);
}

#[tokio::test]
async fn hash_kv_follows_the_data_and_checks_revisions() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let empty = c.hash_kv(0).await.unwrap();
    assert_eq!((empty.compact_version(), empty.header().unwrap().revision()), (-1, 1));
    c.put("k", "1", None).await.unwrap();
    let one = c.hash_kv(0).await.unwrap();
    assert_ne!(one.hash(), empty.hash());
    assert_eq!(c.hash_kv(0).await.unwrap().hash(), one.hash(), "no change, same hash");
    c.put("k", "2", None).await.unwrap();
    let two = c.hash_kv(0).await.unwrap();
    assert_ne!(two.hash(), one.hash());
    assert_eq!(c.hash_kv(2).await.unwrap().hash(), one.hash(), "a past revision hashes as it was");
    let (code, text) = code_and_text(c.hash_kv(4).await.unwrap_err());
    assert_eq!(
        (code, text.as_str()),
        (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision")
    );
    c.compact(3, None).await.unwrap();
    let (code, text) = code_and_text(c.hash_kv(2).await.unwrap_err());
    assert_eq!(
        (code, text.as_str()),
        (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted")
    );
    let after = c.hash_kv(3).await.unwrap();
    assert_eq!((after.hash(), after.compact_version()), (two.hash(), 3), "compaction does not change the key space");
    let h = c.hash().await.unwrap();
    assert_eq!(h.header().unwrap().revision(), 3);
    c.lease_grant(60, None).await.unwrap();
    assert_ne!(c.hash().await.unwrap().hash(), h.hash(), "Hash covers the leases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashes_are_equal_on_two_nodes_of_one_nats_bucket() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=hash", nats.url());
    let (a, b) = (Server::start(&["--endpoint", &endpoint]), Server::start(&["--endpoint", &endpoint]));
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    for i in 0..50 {
        ca.put(format!("/h/{i}"), format!("v{i}"), None).await.unwrap();
    }
    cb.txn(Txn::new().and_then([TxnOp::put("/h/x", "1", None), TxnOp::delete("/h/3", None)])).await.unwrap();
    // Linearizable reads: each node has applied everything acknowledged before.
    let (rev_a, kvs_a) = everything(&mut ca).await;
    let (rev_b, kvs_b) = everything(&mut cb).await;
    assert_eq!((rev_a, &kvs_a), (rev_b, &kvs_b));
    let (ha, hb) = (ca.hash_kv(rev_a).await.unwrap(), cb.hash_kv(rev_a).await.unwrap());
    assert_eq!((ha.hash(), ha.compact_version()), (hb.hash(), hb.compact_version()));
    assert_eq!(ca.hash().await.unwrap().hash(), cb.hash().await.unwrap().hash());
    cb.put("/h/0", "changed", None).await.unwrap();
    let now = ca.hash_kv(0).await.unwrap();
    assert_ne!(now.hash(), ha.hash());
    assert_eq!(now.hash(), cb.hash_kv(0).await.unwrap().hash());
}

#[tokio::test]
async fn alarms_refuse_what_etcd_refuses() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    c.put("k", "v", None).await.unwrap();
    let member = c.status().await.unwrap().header().unwrap().member_id();
    assert!(c.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap().alarms().is_empty());
    let mut on = AlarmOptions::new();
    on.with_member(member);
    let r = c.alarm(AlarmAction::Activate, AlarmType::Nospace, Some(on.clone())).await.unwrap();
    assert_eq!(r.alarms().len(), 1);
    assert_eq!((r.alarms()[0].member_id(), r.alarms()[0].alarm()), (member, AlarmType::Nospace));

    let nospace = (tonic::Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded".to_string());
    assert_eq!(code_and_text(c.put("k", "w", None).await.unwrap_err()), nospace);
    // The alarm answers before a missing lease is looked at.
    let unknown_lease = || Some(PutOptions::new().with_lease(424242).with_ignore_value());
    assert_eq!(code_and_text(c.put("k", "", unknown_lease()).await.unwrap_err()), nospace);
    assert_eq!(code_and_text(c.lease_grant(60, None).await.unwrap_err()), nospace);
    // A put in a branch that would not run still counts, as in etcd.
    let txn = Txn::new().when([Compare::version("k", CompareOp::Equal, 99)]).or_else([TxnOp::put("k", "x", None)]);
    let (code, _) = code_and_text(c.txn(txn).await.unwrap_err());
    assert_eq!(code, tonic::Code::ResourceExhausted);
    // Reads, read-only Txns, deletes and compaction go on.
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"v");
    c.txn(Txn::new().and_then([TxnOp::get("k", None)])).await.unwrap();
    c.put("gone", "x", None).await.unwrap_err();
    c.delete("k", None).await.unwrap();
    c.compact(2, None).await.unwrap();

    let r = c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(on.clone())).await.unwrap();
    assert_eq!(r.alarms().len(), 1);
    c.put("k", "again", None).await.unwrap();

    let r = c.alarm(AlarmAction::Activate, AlarmType::Corrupt, Some(on.clone())).await.unwrap();
    assert_eq!(r.alarms()[0].alarm(), AlarmType::Corrupt);
    let corrupt = (tonic::Code::DataLoss, "etcdserver: corrupt cluster".to_string());
    assert_eq!(code_and_text(c.delete("k", None).await.unwrap_err()), corrupt);
    assert_eq!(code_and_text(c.put("k", "w", None).await.unwrap_err()), corrupt);
    assert_eq!(code_and_text(c.put("k", "", unknown_lease()).await.unwrap_err()), corrupt);
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"again");
    let listed = c.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap();
    assert_eq!(listed.alarms().len(), 1);
    c.alarm(AlarmAction::Deactivate, AlarmType::Corrupt, Some(on)).await.unwrap();
    c.delete("k", None).await.unwrap();
    assert!(c.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap().alarms().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_nats_stream_raises_nospace() {
    let nats = NatsServer::start_with_config("jetstream { max_file_store: 1MB }\n");
    let server = Server::start(&["--endpoint", &format!("{}?noEmbed", nats.url())]);
    let mut c = server.client().await;
    let member = c.status().await.unwrap().header().unwrap().member_id();
    let value = vec![b'x'; 60_000];
    let mut error = None;
    for i in 0..40 {
        if let Err(e) = c.put(format!("/full/{i}"), value.clone(), None).await {
            error = Some((i, code_and_text(e)));
            break;
        }
    }
    let (written, (code, text)) = error.expect("a 1 MB JetStream store fills up within 40 puts of 60 kB");
    assert!(written > 5, "{written} puts before the store was full");
    assert_eq!((code, text.as_str()), (tonic::Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"));
    let alarms = c.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap();
    assert_eq!(alarms.alarms().len(), 1);
    assert_eq!((alarms.alarms()[0].member_id(), alarms.alarms()[0].alarm()), (member, AlarmType::Nospace));
    // Reads go on; writes stay refused until the alarm is cleared.
    assert_eq!(c.get("/full/0", None).await.unwrap().kvs()[0].value(), value.as_slice());
    let (code, _) = code_and_text(c.put("small", "v", None).await.unwrap_err());
    assert_eq!(code, tonic::Code::ResourceExhausted);
    assert!(server.log().contains("alarm raised"), "{}", server.log());
}
