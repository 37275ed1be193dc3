//! Scenarios every shared SQL database (PostgreSQL, MySQL) must pass with kine-rs processes on
//! it: two nodes on one database (conflicting conditional updates, concurrent writers, gap-free
//! revisions, identical watch streams, reads after the other node's writes, a lease kept alive
//! through one node), and a database restart under load.

use super::*;
use etcd_client::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A database server a test can stop and start again (same data, same port).
pub trait Database {
    fn stop(&mut self);
    fn restart(&mut self);
}

impl Database for kine_testkit::postgres::PgServer {
    fn stop(&mut self) {
        kine_testkit::postgres::PgServer::stop(self)
    }
    fn restart(&mut self) {
        kine_testkit::postgres::PgServer::restart(self)
    }
}

impl Database for kine_testkit::mysql::MariaDbServer {
    fn stop(&mut self) {
        kine_testkit::mysql::MariaDbServer::stop(self)
    }
    fn restart(&mut self) {
        kine_testkit::mysql::MariaDbServer::restart(self)
    }
}

pub async fn collect(w: &mut WatchStream, until: i64) -> Vec<(i64, i32, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let r =
            tokio::time::timeout(Duration::from_secs(30), w.message()).await.expect("watch in time").unwrap().unwrap();
        assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
        for e in r.events() {
            let kv = e.kv().unwrap();
            out.push((kv.mod_revision(), e.event_type() as i32, kv.key().to_vec(), kv.value().to_vec()));
        }
        if out.last().is_some_and(|e| e.0 >= until) {
            return out;
        }
    }
}

/// Two kine-rs processes on the database at `url`.
pub async fn two_nodes_on_one_database(url: &str) {
    let nodes = [Server::start(&["--endpoint", url]), Server::start(&["--endpoint", url])];
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(n.client().await);
    }
    let mut watches = Vec::new();
    for c in &mut clients {
        let mut w = c.watch("/m/", Some(WatchOptions::new().with_prefix().with_start_revision(1))).await.unwrap();
        assert!(w.message().await.unwrap().unwrap().created());
        watches.push(w);
    }

    // Read after write across nodes.
    let r = clients[0].put("/m/raw", "1", None).await.unwrap();
    let got = clients[1].get("/m/raw", None).await.unwrap();
    assert_eq!(got.kvs()[0].mod_revision(), r.header().unwrap().revision());

    // Conflicting conditional updates.
    clients[1].put("/m/hot", "0", None).await.unwrap();
    for round in 0..30 {
        let rev = clients[round % 2].get("/m/hot", None).await.unwrap().kvs()[0].mod_revision();
        let mut tasks = Vec::new();
        for (i, c) in clients.iter().enumerate() {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                let txn = Txn::new()
                    .when([Compare::mod_revision("/m/hot", CompareOp::Equal, rev)])
                    .and_then([TxnOp::put("/m/hot", format!("{round}-{i}"), None)])
                    .or_else([TxnOp::get("/m/hot", None)]);
                c.txn(txn).await.unwrap()
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let current = clients[0].get("/m/hot", None).await.unwrap();
        let winners = results.iter().filter(|r| r.succeeded()).count();
        assert_eq!(winners, 1, "round {round}: exactly one conditional update wins");
        for r in results.iter().filter(|r| !r.succeeded()) {
            match &r.op_responses()[0] {
                TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), current.kvs()[0].value()),
                other => panic!("expected get, got {other:?}"),
            }
        }
    }

    // Concurrent writers on both nodes.
    let mut writers = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let mut c = c.clone();
        writers.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for n in 0..150 {
                let r = c.put(format!("/m/load/{i}/{n}"), "v", None).await.unwrap();
                revs.push(r.header().unwrap().revision());
            }
            revs
        }));
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    let last = clients[0].put("/m/end", "x", None).await.unwrap().header().unwrap().revision();
    acked.sort_unstable();
    acked.dedup();
    assert_eq!(acked.len(), 300, "every acknowledged write has a revision of its own");

    // Both watches saw every change once, in order, with gap-free revisions.
    let a = collect(&mut watches[0], last).await;
    let b = collect(&mut watches[1], last).await;
    assert_eq!(a, b, "both nodes deliver the same events");
    let revs: Vec<i64> = a.iter().map(|e| e.0).collect();
    assert_eq!(revs, (2..=last).collect::<Vec<_>>(), "one event per revision, no gap, no repeat");

    // A lease kept alive through node 0 outlives its TTL on node 1.
    let lease = clients[0].lease_grant(2, None).await.unwrap().id();
    clients[0].put("/m/leased", "v", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    let (mut keeper, _responses) = clients[0].lease_keep_alive(lease).await.unwrap();
    for _ in 0..8 {
        keeper.keep_alive().await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert_eq!(clients[1].get("/m/leased", None).await.unwrap().count(), 1, "kept alive through the other node");
    drop(keeper);
    // Then it expires (TTL 2 s; expiry checks every 0.5 s), on whichever node: its key goes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while clients[1].get("/m/leased", None).await.unwrap().count() == 1 {
        assert!(std::time::Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ttl = clients[1].lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.ttl(), -1, "revoked everywhere");
}

/// One kine-rs on `url` writing (conditional creates) while `db` stops for 2 s and starts again:
/// errors are fast `Unavailable`s, every acknowledged write survives, the watch has no gap.
pub async fn a_restart_under_load_loses_nothing_acknowledged(db: &mut dyn Database, url: &str) {
    let node = Server::start(&["--endpoint", url]);
    let mut c = node.client().await;
    let mut w = c.watch("/r/", Some(WatchOptions::new().with_prefix().with_start_revision(1))).await.unwrap();
    assert!(w.message().await.unwrap().unwrap().created());

    let back = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut c = c.clone();
        let back = back.clone();
        tokio::spawn(async move {
            let (mut acked, mut errors, mut slowest_error) = (Vec::new(), Vec::new(), Duration::ZERO);
            let mut after_restart = 0;
            // Until 5 s after the database is back (stopping and starting it take seconds of
            // their own on a busy machine), and no longer than a minute in all.
            let give_up = std::time::Instant::now() + Duration::from_secs(60);
            let mut back_at = None;
            let mut n = 0;
            loop {
                if back.load(Ordering::SeqCst)
                    && back_at.get_or_insert_with(std::time::Instant::now).elapsed() >= Duration::from_secs(5)
                    || std::time::Instant::now() > give_up
                {
                    break;
                }
                let key = format!("/r/{n}");
                // Conditional create: an attempt whose answer was lost cannot apply twice.
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), "v", None)]);
                let started = std::time::Instant::now();
                match c.txn(txn).await {
                    Ok(r) if r.succeeded() => {
                        acked.push((key, r.header().unwrap().revision()));
                        after_restart += back.load(Ordering::SeqCst) as usize;
                        n += 1;
                    }
                    Ok(_) => n += 1,
                    Err(e) => {
                        slowest_error = slowest_error.max(started.elapsed());
                        errors.push(format!("{e}"));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            (acked, errors, slowest_error, after_restart)
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.restart();
    back.store(true, Ordering::SeqCst);
    let (acked, errors, slowest_error, after_restart) = writer.await.unwrap();

    assert!(!errors.is_empty(), "requests during the outage failed");
    assert!(
        errors.iter().all(|e| e.contains("Unavailable") || e.contains("unavailable")),
        "an outage is Unavailable, nothing else: {errors:?}"
    );
    assert!(slowest_error < Duration::from_secs(6), "errors come fast ({slowest_error:?})");
    // A few dozen in the 2 s before the outage on a busy machine (hundreds when idle).
    assert!(acked.len() > 10, "{} acknowledged writes", acked.len());
    assert!(after_restart > 0, "writes went on within 5 s of the restart");
    let end = c.put("/r/end", "x", None).await.unwrap();
    let last = end.header().unwrap().revision();
    // Every acknowledged write is there at its revision, and the watch saw each exactly once.
    for (key, rev) in &acked {
        let r = c.get(key.as_str(), None).await.unwrap();
        assert_eq!(r.kvs()[0].mod_revision(), *rev, "{key}");
    }
    let events = collect(&mut w, last).await;
    let revs: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert_eq!(revs, (2..=last).collect::<Vec<_>>(), "the watch went on through the restart, no gap, no repeat");
    for (_, rev) in &acked {
        assert!(revs.contains(rev));
    }
}
