//! kine-rs on PostgreSQL end to end. Two processes on one database: conflicting conditional
//! updates from both (exactly one wins each round, the loser sees the winner's value),
//! concurrent writers on both, gap-free revisions, identical watch streams on both nodes, reads
//! after the other node's writes, and a lease kept alive through one node that the other does
//! not expire. A wrong password fails at once, and never shows in the log.

mod common;
use common::*;
use etcd_client::*;
use kine_testkit::postgres::PgServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

async fn collect(w: &mut WatchStream, until: i64) -> Vec<(i64, i32, Vec<u8>, Vec<u8>)> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_database() {
    let pg = PgServer::start();
    let url = pg.url("multi");
    let nodes = [Server::start(&["--endpoint", &url]), Server::start(&["--endpoint", &url])];
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

#[test]
fn a_wrong_password_fails_at_once_and_is_never_shown() {
    let pg = PgServer::start();
    let url = pg.url("db").replace(kine_testkit::postgres::PASSWORD, "not-the-password");
    let started = std::time::Instant::now();
    let (ok, _, stderr) =
        run(std::process::Command::new(server_bin()).args(["--listen-address", "127.0.0.1:0", "--endpoint", &url]));
    assert!(!ok, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "a refusal is not retried");
    assert!(stderr.contains("--endpoint postgres://kine:***@127.0.0.1"), "{stderr}");
    assert!(stderr.contains("password authentication failed"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "the password leaked: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_loses_nothing_acknowledged() {
    let mut pg = PgServer::start();
    let url = pg.url("restart");
    let node = Server::start(&["--endpoint", &url]);
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
            let deadline = std::time::Instant::now() + Duration::from_secs(9);
            let mut n = 0;
            while std::time::Instant::now() < deadline {
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
    pg.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.restart();
    back.store(true, Ordering::SeqCst);
    let (acked, errors, slowest_error, after_restart) = writer.await.unwrap();

    assert!(!errors.is_empty(), "requests during the outage failed");
    assert!(
        errors.iter().all(|e| e.contains("Unavailable") || e.contains("unavailable")),
        "an outage is Unavailable, nothing else: {errors:?}"
    );
    assert!(slowest_error < Duration::from_secs(6), "errors come fast ({slowest_error:?})");
    assert!(acked.len() > 50, "{} acknowledged writes", acked.len());
    assert!(after_restart > 0, "writes went on after the restart (within the 5 s left)");
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

#[tokio::test]
async fn tls_with_a_client_certificate() {
    let certs = TempDir::new("pg-certs");
    kine_testkit::certs::make_certs(certs.path());
    let pg = PgServer::start_tls(certs.path());
    let url = pg.url("tls").replace("sslmode=disable", "sslmode=verify-full");
    let file = |name: &str| certs.path().join(name).display().to_string();
    let node = Server::start(&[
        "--endpoint",
        &url,
        "--ca-file",
        &file("ca.crt"),
        "--cert-file",
        &file("client.crt"),
        "--key-file",
        &file("client.key"),
    ]);
    let mut c = node.client().await;
    c.put("k", "over TLS", None).await.unwrap();
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"over TLS");
    drop(node);

    // Without the client certificate the server refuses (hostssl … clientcert=verify-ca), and
    // without TLS too: kine-rs says so and stops.
    let plain = pg.url("tls");
    for args in [vec!["--endpoint", url.as_str(), "--ca-file", &file("ca.crt")], vec!["--endpoint", plain.as_str()]] {
        let (ok, _, stderr) =
            run(std::process::Command::new(server_bin()).args(["--listen-address", "127.0.0.1:0"]).args(&args));
        assert!(!ok, "{args:?}: {stderr}");
        assert!(stderr.contains("--endpoint postgres://kine:***@"), "{stderr}");
    }
    // A server certificate from another CA is refused.
    let other = TempDir::new("pg-other-certs");
    kine_testkit::certs::make_certs(other.path());
    let (ok, _, stderr) = run(std::process::Command::new(server_bin()).args([
        "--listen-address",
        "127.0.0.1:0",
        "--endpoint",
        &url,
        "--ca-file",
        &other.path().join("ca.crt").display().to_string(),
        "--cert-file",
        &file("client.crt"),
        "--key-file",
        &file("client.key"),
    ]));
    assert!(!ok && stderr.to_lowercase().contains("certificate"), "{stderr}");
}
