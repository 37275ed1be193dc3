//! The backend contract on `nats://` against a real nats-server with JetStream.

use kine_backend_nats::{NatsBackend, NatsOptions};
use kine_core::backend::Backend;
use kine_testkit::nats::NatsServer;
use std::sync::Arc;

async fn open(server: &NatsServer, bucket: &str) -> Arc<dyn Backend> {
    let endpoint = format!("{}?bucket={bucket}", server.url());
    let config = kine_backend_nats::config::parse(&endpoint, |_| Ok(std::time::Duration::from_millis(500))).unwrap();
    Arc::new(NatsBackend::open(NatsOptions::new(config)).await.expect("open nats backend"))
}

kine_testkit::contract_tests!(
    {
        let server = NatsServer::start();
        (open(&server, "contract").await, server)
    },
    single_key_writes
);

#[tokio::test]
async fn sqlite_semantics_hold_on_nats_in_random_sequences() {
    for seed in kine_testkit::model::seeds(2) {
        println!("model seed {seed}");
        let server = NatsServer::start();
        kine_testkit::model::run_with(seed, 400, open(&server, "model").await, kine_testkit::memory(), true).await;
    }
}

/// On NATS a request that changes several keys is one atomic batch of messages: all or
/// nothing, one revision per changed key (documented in docs/nats.md and COMPAT.md).
#[tokio::test]
async fn multi_key_writes_are_atomic_at_one_revision() {
    use kine_core::KeyRange;
    use kine_core::request::*;
    let server = NatsServer::start();
    let b = open(&server, "multi").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    let mut feed = b.subscribe();
    for k in ["m/1", "m/2", "m/3"] {
        kine_testkit::contract::put(&s, k, "v").await; // 2, 3, 4
    }
    // Three deletions: one batch of three messages (5, 6, 7), all at the batch's revision 7.
    let r = s
        .delete_range(DeleteRangeRequest { range: kine_testkit::contract::prefix("m/"), prev_kv: true })
        .await
        .unwrap();
    assert_eq!((r.revision, r.value.deleted), (7, 3));
    let mut revs = Vec::new();
    for _ in 0..4 {
        let ev = feed.recv().await.unwrap();
        assert!(ev.events.iter().all(|e| e.kv.mod_revision == ev.revision));
        revs.push((ev.revision, ev.events.len()));
    }
    assert_eq!(revs, vec![(2, 1), (3, 1), (4, 1), (7, 3)]);
    let count_at = |rev| {
        let s = &s;
        async move {
            let req = RangeRequest { revision: rev, ..RangeRequest::new(kine_testkit::contract::prefix("m/")) };
            s.range(req).await.unwrap().value.count
        }
    };
    // No revision shows the request half-applied.
    assert_eq!((count_at(5).await, count_at(6).await, count_at(7).await), (3, 3, 0));
    // A txn creating two keys and updating a third: one revision; creations get it as their
    // create revision.
    kine_testkit::contract::put(&s, "t/0", "a").await; // 8
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Put(PutRequest { key: b"t/0".to_vec(), value: b"b".to_vec(), ..Default::default() }),
            RequestOp::Put(PutRequest { key: b"t/1".to_vec(), value: b"c".to_vec(), ..Default::default() }),
            RequestOp::Put(PutRequest { key: b"t/2".to_vec(), value: b"d".to_vec(), ..Default::default() }),
        ],
        failure: vec![],
    };
    let r = s.txn(txn).await.unwrap();
    assert_eq!(r.revision, 11);
    let kvs = s.range(RangeRequest::new(kine_testkit::contract::prefix("t/"))).await.unwrap().value.kvs;
    let got: Vec<_> = kvs.iter().map(|kv| (kv.create_revision, kv.mod_revision, kv.version)).collect();
    assert_eq!(got, vec![(8, 11, 2), (11, 11, 1), (11, 11, 1)]);
    // Conditional writes on batch-written keys still address the right messages...
    kine_testkit::contract::put(&s, "t/1", "e").await; // 12
    s.delete_range(DeleteRangeRequest { range: KeyRange::single("t/2"), prev_kv: false }).await.unwrap(); // 13
    // ...and compaction keeps each key's version at the compact revision.
    s.compact(11).await.unwrap();
    let at_11 = RangeRequest { revision: 11, ..RangeRequest::new(kine_testkit::contract::prefix("t/")) };
    assert_eq!(s.range(at_11).await.unwrap().value.count, 3);
    // A new process rebuilds the same state from the stream.
    let b2 = open(&server, "multi").await;
    let s2 = kine_testkit::contract::store(b2.clone()).await;
    let kvs = s2.range(RangeRequest::new(kine_testkit::contract::prefix("t/"))).await.unwrap().value.kvs;
    let got: Vec<_> = kvs.iter().map(|kv| (kv.key.clone(), kv.mod_revision)).collect();
    assert_eq!(got, vec![(b"t/0".to_vec(), 11), (b"t/1".to_vec(), 12)]);
    kine_testkit::contract::put(&s2, "t/0", "f").await; // per-key expectation on a batch member
    // A lease revoke deleting two keys: one batch, one revision.
    let (lease, _, _) = s.lease_grant(0, 60).await.unwrap();
    for k in ["l/1", "l/2"] {
        s.put(PutRequest { key: k.into(), value: b"v".to_vec(), lease, ..Default::default() }).await.unwrap();
    }
    assert_eq!(s.lease_revoke(lease).await.unwrap(), 18);
    assert_eq!(
        s.range(RangeRequest::new(KeyRange::from_etcd(b"l/".to_vec(), b"l0".to_vec()))).await.unwrap().value.count,
        0
    );
}

/// A batch whose last member (a deletion) was compacted away, at the very end of the stream:
/// a new process must still load it (and not wait for the missing member).
#[tokio::test]
async fn batch_with_a_compacted_trailing_deletion_loads() {
    use kine_core::KeyRange;
    use kine_core::request::*;
    let server = NatsServer::start();
    let b = open(&server, "trail").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    kine_testkit::contract::put(&s, "b", "1").await; // 2
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Put(PutRequest { key: b"a".to_vec(), value: b"x".to_vec(), ..Default::default() }),
            RequestOp::DeleteRange(DeleteRangeRequest { range: KeyRange::single("b"), prev_kv: false }),
        ],
        failure: vec![],
    };
    assert_eq!(s.txn(txn).await.unwrap().revision, 4); // messages 3 and 4
    s.compact(4).await.unwrap(); // removes b entirely, including message 4
    b.close().await;
    let b2 =
        tokio::time::timeout(std::time::Duration::from_secs(20), open(&server, "trail")).await.expect("open hangs");
    let s2 = kine_testkit::contract::store(b2.clone()).await;
    let kvs = s2.range(RangeRequest::new(KeyRange::from_etcd(vec![0], vec![0]))).await.unwrap().value.kvs;
    let got: Vec<_> = kvs.iter().map(|kv| (kv.key.clone(), kv.mod_revision)).collect();
    assert_eq!(got, vec![(b"a".to_vec(), 4)]);
    assert_eq!(b2.revisions().await.unwrap().current, 4);
}

/// Many writes from one process at once: writes on different keys are in flight together,
/// writes on one key queue; every one succeeds exactly once.
#[tokio::test]
async fn concurrent_writes_from_one_process() {
    use kine_core::request::*;
    let server = NatsServer::start();
    let b = open(&server, "concurrent").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let key = if i % 2 == 0 { "hot".to_string() } else { format!("k/{i}") };
            s.put(PutRequest { key: key.into_bytes(), value: format!("{i}").into_bytes(), ..Default::default() })
                .await
                .map(|r| r.revision)
        }));
    }
    let mut revs = Vec::new();
    for t in tasks {
        revs.push(t.await.unwrap().expect("every write succeeds"));
    }
    revs.sort();
    revs.dedup();
    assert_eq!(revs.len(), 64, "each write has its own revision");
    assert_eq!(*revs.last().unwrap(), 65);
    let hot = s.range(RangeRequest::new(kine_core::KeyRange::single("hot"))).await.unwrap().value;
    assert_eq!(hot.kvs[0].version, 32);
}

/// Writes go on while a compaction purges: updates and deletions of the very keys being
/// compacted, from the same process, all succeed, and the result is what they wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_during_a_compaction() {
    use kine_core::request::*;
    let server = NatsServer::start();
    let b = open(&server, "compacting").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    for v in 0..5 {
        for k in 0..100 {
            kine_testkit::contract::put(&s, &format!("k/{k}"), &format!("{v}")).await;
        }
    }
    let at = s.range(RangeRequest::new(kine_core::KeyRange::single("k/0"))).await.unwrap().revision;
    let compaction = {
        let b = b.clone();
        tokio::spawn(async move { b.compact(at).await })
    };
    let mut writes = Vec::new();
    for k in 0..100 {
        let s = s.clone();
        writes.push(tokio::spawn(async move {
            let key = format!("k/{k}");
            if k % 10 == 0 {
                s.delete_range(DeleteRangeRequest { range: kine_core::KeyRange::single(key), prev_kv: false })
                    .await
                    .map(|_| ())
            } else {
                s.put(PutRequest { key: key.into_bytes(), value: b"after".to_vec(), ..Default::default() })
                    .await
                    .map(|_| ())
            }
        }));
    }
    for w in writes {
        w.await.unwrap().expect("a write during the compaction");
    }
    compaction.await.unwrap().expect("the compaction");
    for k in 0..100 {
        let got = kine_testkit::contract::get(&s, &format!("k/{k}")).await;
        match k % 10 {
            0 => assert!(got.is_none(), "k/{k} was deleted"),
            _ => assert_eq!(got.expect("written").value, b"after"),
        }
    }
    let mut old = RangeRequest::new(kine_core::KeyRange::single("k/1"));
    old.revision = at - 1;
    assert!(matches!(s.range(old).await, Err(kine_core::Error::Compacted { .. })));
}

/// Leases live in `<bucket>-meta`: no revision spent, duplicates refused, and a new process on
/// the same bucket sees them (and the data, and the compact revision).
#[tokio::test]
async fn leases_data_and_compaction_survive_a_new_process() {
    use kine_core::request::*;
    use kine_core::{Error, KeyRange};
    let server = NatsServer::start();
    let b = open(&server, "persist").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    let (lease, _, _) = s.lease_grant(0, 60).await.unwrap();
    assert!(matches!(s.lease_grant(lease, 60).await, Err(Error::LeaseExists)));
    assert_eq!(b.revisions().await.unwrap().current, 1, "leases spend no revision");
    s.put(PutRequest { key: b"k".to_vec(), value: b"1".to_vec(), lease, ..Default::default() }).await.unwrap(); // 2
    kine_testkit::contract::put(&s, "k", "2").await; // 3, no lease
    kine_testkit::contract::put(&s, "x", "1").await; // 4
    s.delete_range(DeleteRangeRequest { range: KeyRange::single("x"), prev_kv: false }).await.unwrap(); // 5
    kine_testkit::contract::put(&s, "k", "3").await; // 6
    s.compact(5).await.unwrap();
    b.close().await;

    let b = open(&server, "persist").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    assert_eq!(b.revisions().await.unwrap(), kine_core::backend::Revisions { current: 6, compacted: 5 });
    assert_eq!(s.lease_list(), vec![lease]);
    let at = |rev| RangeRequest { revision: rev, ..RangeRequest::new(KeyRange::single("k")) };
    assert!(matches!(s.range(at(4)).await, Err(Error::Compacted { compact_revision: 5 })));
    assert_eq!(s.range(at(5)).await.unwrap().value.kvs[0].value, b"2");
    assert_eq!(s.range(at(0)).await.unwrap().value.kvs[0].value, b"3");
    assert!(s.range(RangeRequest::new(KeyRange::single("x"))).await.unwrap().value.kvs.is_empty());
    assert_eq!(kine_testkit::contract::put(&s, "k", "4").await, 7);
    // A lease revoke with no keys attached spends no revision.
    assert_eq!(s.lease_revoke(lease).await.unwrap(), 7);
}

/// While NATS is down requests fail fast with Unavailable; once it is back, service resumes
/// with nothing lost.
#[tokio::test]
async fn outage_fails_fast_and_recovers() {
    use kine_core::Error;
    let mut server = NatsServer::start();
    let b = open(&server, "outage").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    assert_eq!(kine_testkit::contract::put(&s, "a", "1").await, 2);
    server.kill();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let r = s.put(kine_testkit::contract::put_req("a", "2")).await;
    assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(6), "failed in {:?}", started.elapsed());
    let r = s.range(kine_core::request::RangeRequest::new(kine_core::KeyRange::single("a"))).await;
    assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");
    // A serializable read is served by the node as it stands, as etcd does.
    let mut serializable = kine_core::request::RangeRequest::new(kine_core::KeyRange::single("a"));
    serializable.serializable = true;
    let r = s.range(serializable).await.expect("a serializable read during an outage");
    assert_eq!((r.value.kvs[0].value.as_slice(), r.value.kvs[0].mod_revision), (b"1".as_slice(), 2));
    server.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Retry an update conditional on revision 2, so that an attempt whose acknowledgement was
    // lost cannot apply twice.
    use kine_core::request::*;
    let update = TxnRequest {
        compare: vec![Compare {
            range: kine_core::KeyRange::single("a"),
            result: CompareResult::Equal,
            target: CompareTarget::Mod(2),
        }],
        success: vec![RequestOp::Put(kine_testkit::contract::put_req("a", "3"))],
        failure: vec![],
    };
    loop {
        match s.txn(update.clone()).await {
            Ok(_) => break,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no recovery: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    let kv = kine_testkit::contract::get(&s, "a").await.unwrap();
    assert_eq!((kv.value.as_slice(), kv.mod_revision, kv.version), (b"3".as_slice(), 3, 2), "nothing lost or doubled");
}

/// Compacting away a deletion that is the stream's newest message: the key can be written
/// again (its subject is empty now), and a new process loads the bucket (its newest message is
/// gone). Found by the model test.
#[tokio::test]
async fn compaction_of_a_trailing_deletion() {
    use kine_core::KeyRange;
    use kine_core::request::*;
    let server = NatsServer::start();
    let b = open(&server, "trailing").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    kine_testkit::contract::put(&s, "x", "1").await; // 2
    s.delete_range(DeleteRangeRequest { range: KeyRange::single("x"), prev_kv: false }).await.unwrap(); // 3
    s.compact(3).await.unwrap();
    b.close().await;
    let b = open(&server, "trailing").await;
    let s = kine_testkit::contract::store(b.clone()).await;
    assert_eq!(b.revisions().await.unwrap().current, 3);
    assert_eq!(kine_testkit::contract::put(&s, "x", "2").await, 4);
    let kv = kine_testkit::contract::get(&s, "x").await.unwrap();
    assert_eq!((kv.create_revision, kv.version), (4, 1));
}

/// Three processes' worth of backends on one bucket race conditional updates of one key: every
/// round exactly one wins. (A regression test: the expectation must be the key's revision when
/// the request was evaluated, not when it is published.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_conditional_updates_have_exactly_one_winner() {
    use kine_core::KeyRange;
    use kine_core::request::*;
    let server = NatsServer::start();
    let stores = [
        kine_testkit::contract::store(open(&server, "race").await).await,
        kine_testkit::contract::store(open(&server, "race").await).await,
        kine_testkit::contract::store(open(&server, "race").await).await,
    ];
    kine_testkit::contract::put(&stores[0], "hot", "0").await;
    for round in 0..150 {
        let rev = kine_testkit::contract::get(&stores[round % 3], "hot").await.unwrap().mod_revision;
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.clone();
                tokio::spawn(async move {
                    let t = TxnRequest {
                        compare: vec![Compare {
                            range: KeyRange::single("hot"),
                            result: CompareResult::Equal,
                            target: CompareTarget::Mod(rev),
                        }],
                        success: vec![RequestOp::Put(kine_testkit::contract::put_req("hot", &format!("{round}-{i}")))],
                        failure: vec![],
                    };
                    s.txn(t).await.unwrap().value.succeeded
                })
            })
            .collect();
        let mut winners = 0;
        for t in tasks {
            winners += t.await.unwrap() as usize;
        }
        assert_eq!(winners, 1, "round {round}");
    }
}
