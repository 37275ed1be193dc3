//! Several kine-rs processes on one NATS bucket: a 3-node NATS cluster with the bucket at
//! replicas=3 and three kine-rs nodes. Conflicting updates from every node (exactly one wins
//! each round, the losers see the current value), identical watch streams on every node,
//! reads after another node's write, and a NATS server killed mid-load.

mod common;
use common::*;
use etcd_client::*;
use kine_testkit::nats::{NatsCluster, NatsServer};
use std::time::Duration;

async fn collect(w: &mut WatchStream, until: i64) -> Vec<(i64, i32, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let r =
            tokio::time::timeout(Duration::from_secs(30), w.message()).await.expect("watch in time").unwrap().unwrap();
        assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
        for e in r.events() {
            let kv = e.kv().unwrap();
            out.push((kv.mod_revision(), e.event_type() as i32, kv.key().to_vec()));
        }
        if out.last().is_some_and(|e| e.0 >= until) {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kine_nodes_on_a_three_node_nats_cluster() {
    let mut cluster = NatsCluster::start();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let endpoint = format!("{}?noEmbed&bucket=multi&replicas=3", cluster.urls(i));
        nodes.push(Server::start(&["--endpoint", &endpoint]));
    }
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(n.client().await);
    }
    // A watcher on every node, from the start.
    let mut watches = Vec::new();
    for c in &mut clients {
        let mut w = c.watch("/m/", Some(WatchOptions::new().with_prefix().with_start_revision(1))).await.unwrap();
        assert!(w.message().await.unwrap().unwrap().created());
        watches.push(w);
    }
    // Read-after-write across nodes.
    let r = clients[0].put("/m/raw", "1", None).await.unwrap();
    let got = clients[1].get("/m/raw", None).await.unwrap();
    assert_eq!(got.kvs()[0].mod_revision(), r.header().unwrap().revision());

    // Conflicting updates: every round, all three nodes update the same key conditionally on
    // the revision they read; exactly one wins, the others get the winner's value back.
    clients[0].put("/m/hot", "0", None).await.unwrap();
    for round in 0..50 {
        let rev = clients[round % 3].get("/m/hot", None).await.unwrap().kvs()[0].mod_revision();
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
        let mut winners = 0;
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let current = clients[0].get("/m/hot", None).await.unwrap();
        for r in &results {
            if r.succeeded() {
                winners += 1;
            } else {
                match &r.op_responses()[0] {
                    TxnOpResponse::Get(g) => {
                        assert_eq!(g.kvs()[0].value(), current.kvs()[0].value(), "loser sees the winner's value")
                    }
                    other => panic!("expected get, got {other:?}"),
                }
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one conditional update wins");
    }

    // Load from every node while one NATS server is killed and restarted.
    let mut writers = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let mut c = c.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(8);
            let mut n = 0;
            while std::time::Instant::now() < deadline {
                let key = format!("/m/load/{i}/{n}");
                // Conditional create: an attempt whose acknowledgement was lost cannot apply twice.
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), "v", None)]);
                match c.txn(txn).await {
                    Ok(r) if r.succeeded() => {
                        acked.push((key, r.header().unwrap().revision()));
                        n += 1;
                    }
                    // An earlier attempt committed although its answer was lost: the key
                    // exists, but that write was never acknowledged.
                    Ok(_) => n += 1,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.nodes[1].kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.nodes[1].restart();
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(acked.len() > 30, "the load ran ({} acknowledged writes)", acked.len());
    // The restarted server may still be rejoining, and the cluster electing leaders: requests
    // can be refused (Unavailable) for a moment, never lost.
    let limit = Duration::from_secs(30);
    let (end, _) = until_served("write after the restart", limit, || {
        let mut c = clients[0].clone();
        async move { c.put("/m/end", "x", None).await }
    })
    .await;
    let last = end.header().unwrap().revision();
    for (key, rev) in &acked {
        for c in &clients {
            let (r, _) = until_served("read after the restart", limit, || {
                let mut c = c.clone();
                async move { c.get(key.as_str(), None).await }
            })
            .await;
            assert_eq!(r.kvs().len(), 1, "acknowledged write {key} lost");
            assert_eq!(r.kvs()[0].mod_revision(), *rev);
        }
    }
    // Every node's watcher saw the same events, in the same order, each once.
    let mut streams = Vec::new();
    for w in &mut watches {
        streams.push(collect(w, last).await);
    }
    let revs: Vec<i64> = streams[0].iter().map(|e| e.0).collect();
    assert_eq!(revs, (2..=last).collect::<Vec<_>>(), "every revision once, in order, no gaps");
    assert_eq!(streams[0], streams[1]);
    assert_eq!(streams[0], streams[2]);
    drop(nodes);
}

/// Leases and compaction are shared: a lease kept alive through one node stays alive on all;
/// once it expires it is revoked once (one delete event per key, not one per node); a
/// compaction done through one node is seen by the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_compaction_are_shared_between_nodes() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=shared", nats.url());
    let nodes: Vec<Server> = (0..3).map(|_| Server::start(&["--endpoint", &endpoint])).collect();
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(n.client().await);
    }
    let mut w = clients[0].watch("/l/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    assert!(w.message().await.unwrap().unwrap().created());
    let lease = clients[0].lease_grant(3, None).await.unwrap().id();
    clients[1].put("/l/k", "v", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    // Keep it alive through node 2 for twice its TTL.
    let (mut keeper, mut responses) = clients[2].lease_keep_alive(lease).await.unwrap();
    for _ in 0..6 {
        keeper.keep_alive().await.unwrap();
        assert_eq!(responses.message().await.unwrap().unwrap().ttl(), 3);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for c in &mut clients {
        assert_eq!(
            c.get("/l/k", None).await.unwrap().count(),
            1,
            "renewals on one node keep the lease alive everywhere"
        );
    }
    drop(keeper);
    // Now it expires: exactly one delete event.
    let r = tokio::time::timeout(Duration::from_secs(10), w.message()).await.expect("put event").unwrap().unwrap();
    assert_eq!(r.events()[0].event_type(), EventType::Put);
    let r = tokio::time::timeout(Duration::from_secs(10), w.message()).await.expect("expiry").unwrap().unwrap();
    assert_eq!(r.events().len(), 1);
    assert_eq!(r.events()[0].event_type(), EventType::Delete);
    let deleted_at = r.events()[0].kv().unwrap().mod_revision();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let next = clients[1].put("/l/after", "x", None).await.unwrap().header().unwrap().revision();
    assert_eq!(next, deleted_at + 1, "the expiry cost one revision, not one per node");
    for c in &mut clients {
        assert_eq!(c.lease_time_to_live(lease, None).await.unwrap().ttl(), -1);
    }
    // Compaction through node 0 is seen by node 1.
    clients[0].compact(next, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let e = clients[1].get("/l/after", Some(GetOptions::new().with_revision(next - 1))).await.unwrap_err();
    assert!(e.to_string().contains("required revision has been compacted"), "{e}");
}

/// kine-rs started while its NATS cluster is still forming (2 of 3 fresh servers up; the bucket
/// needs all 3 replicas) waits for JetStream instead of failing, and opens the bucket once the
/// third server joins.
#[tokio::test]
async fn waits_for_a_forming_cluster() {
    let mut cluster = NatsCluster::start_partly(2);
    let endpoint = format!("{}?noEmbed&bucket=forming&replicas=3", cluster.urls(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let starting = std::thread::spawn(move || {
        let server = Server::start(&["--endpoint", &endpoint]);
        let _ = tx.send(());
        server
    });
    // Not ready while a server is missing (and not exited: `Server::start` would panic).
    assert!(rx.recv_timeout(Duration::from_secs(4)).is_err(), "ready without the third server");
    assert!(!starting.is_finished(), "kine-rs gave up while the cluster was forming");
    cluster.nodes[2].start();
    let server = starting.join().expect("kine-rs opens the bucket once the cluster has formed");
    let mut client = server.client().await;
    let rev = client.put("k", "v", None).await.unwrap().header().unwrap().revision();
    assert_eq!(rev, 2);
}

/// Node A (frozen with SIGSTOP) misses
/// what node B does meanwhile, and B's `action` removes some of it from the stream. When A runs
/// again it finds the hole, loads the bucket again, and cancels its watch, which is behind the
/// hole, with the revision below which history is gone (as etcd cancels a watch behind a
/// compaction); it never serves what it last knew. Returns A's client, the revision the watch
/// was cancelled at, and what must live while A's client is used.
async fn miss_a_removal<F, Fut>(params: &str, action: F) -> (Client, i64, (Server, Server, NatsServer))
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=behind{params}", nats.url());
    let (a, b) = (Server::start(&["--endpoint", &endpoint]), Server::start(&["--endpoint", &endpoint]));
    let (ca, cb) = (a.client().await, b.client().await);
    let put = cb.clone().put("/h/k", "0", None).await.unwrap().header().unwrap().revision();
    assert_eq!(ca.clone().get("/h/k", None).await.unwrap().kvs()[0].mod_revision(), put);
    let options = WatchOptions::new().with_prefix().with_start_revision(put + 1);
    let mut w = ca.clone().watch("/h/", Some(options)).await.unwrap();
    assert!(w.message().await.unwrap().unwrap().created());

    a.signal("STOP");
    // Long enough for A's pending pull request (5 s) to expire: the server then pushes nothing
    // to A while it is frozen, so A can only read what the stream still holds when it runs.
    tokio::time::sleep(Duration::from_secs(7)).await;
    action(cb.clone()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.signal("CONT");

    let r = tokio::time::timeout(Duration::from_secs(30), w.message()).await.expect("the watch ends").unwrap().unwrap();
    assert!(r.canceled() && r.events().is_empty(), "{r:?}\n{}", a.log());
    assert!(a.log().contains("loading the bucket again"), "{}", a.log());
    // A serves on (once its NATS connection, dropped by the server while A was frozen, is back).
    let (y, _) = until_served("a write on A", Duration::from_secs(30), || {
        let mut c = ca.clone();
        async move { c.put("/h/y", "3", None).await }
    })
    .await;
    let y = y.header().unwrap().revision();
    assert_eq!(cb.clone().get("/h/y", None).await.unwrap().kvs()[0].mod_revision(), y);
    (ca, r.compact_revision(), (a, b, nats))
}

/// A get on a node whose NATS connection may still be coming back (Unavailable is retried).
async fn get(c: &Client, key: &str, options: Option<GetOptions>) -> Result<GetResponse, Error> {
    let limit = Duration::from_secs(30);
    let started = std::time::Instant::now();
    loop {
        match c.clone().get(key, options.clone()).await {
            Err(Error::GRpcStatus(s)) if s.code() == tonic::Code::Unavailable && started.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// B deletes a key and compacts the deletion away while A is frozen: A must not keep serving
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_a_compaction_loads_the_bucket_again() {
    let compacted = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let at = compacted.clone();
    let (ca, cancelled, _running) = miss_a_removal("", |mut cb| async move {
        cb.delete("/h/k", None).await.unwrap();
        let rev = cb.put("/h/x", "1", None).await.unwrap().header().unwrap().revision();
        cb.compact(rev, None).await.unwrap();
        at.store(rev, std::sync::atomic::Ordering::SeqCst);
    })
    .await;
    assert_eq!(cancelled, compacted.load(std::sync::atomic::Ordering::SeqCst));
    assert!(get(&ca, "/h/k", None).await.unwrap().kvs().is_empty(), "a deleted key is served");
}

/// With a per-key message limit (`revHistory=2`), B's updates push A's unseen versions out of
/// the stream: A reads below the oldest version it could load as compacted, never as the older
/// value it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_per_key_limit_loads_the_bucket_again() {
    let (ca, floor, _running) = miss_a_removal("&revHistory=2", |mut cb| async move {
        for i in 1..=5 {
            cb.put("/h/k", i.to_string(), None).await.unwrap();
        }
    })
    .await;
    let now = get(&ca, "/h/k", None).await.unwrap();
    assert_eq!((now.kvs()[0].value(), now.kvs()[0].version()), (&b"5"[..], 6));
    // The two newest versions are held; below the older of them history counts as compacted.
    assert_eq!(floor, now.kvs()[0].mod_revision() - 1);
    let e = get(&ca, "/h/k", Some(GetOptions::new().with_revision(floor - 1))).await.unwrap_err();
    assert!(e.to_string().contains("required revision has been compacted"), "{e}");
    let old = get(&ca, "/h/k", Some(GetOptions::new().with_revision(floor))).await.unwrap();
    assert_eq!(old.kvs()[0].value(), b"4");
}

/// Subjects emptied behind kine-rs's back (a purge by hand, or a stream leader still catching
/// up after a restart that answers "no message" for a subject it does not hold yet): a deleted
/// key whose subject is empty can be created again; a key this node holds a value for keeps its
/// whole history (it was once dropped on such an answer, losing old revisions on that node), and
/// a write to it fails with an error naming the cause instead of guessing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emptied_subjects_never_drop_history() {
    let nats = NatsServer::start();
    let node = Server::start(&["--endpoint", &format!("{}?noEmbed&bucket=emptied", nats.url())]);
    let mut c = node.client().await;
    let first = c.put("/e/live", "1", None).await.unwrap().header().unwrap().revision();
    c.put("/e/live", "2", None).await.unwrap();
    c.put("/e/gone", "x", None).await.unwrap();
    c.delete("/e/gone", None).await.unwrap();

    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let stream = js.get_stream("KV_emptied").await.unwrap();
    for key in ["/e/live", "/e/gone"] {
        let subject = kine_backend_nats::message::subject("emptied", key.as_bytes());
        stream.purge().filter(subject).await.unwrap();
    }

    // The deleted key: created again, expecting an empty subject.
    let create = Txn::new()
        .when([Compare::mod_revision("/e/gone", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("/e/gone", "y", None)]);
    assert!(c.txn(create).await.unwrap().succeeded());
    assert_eq!(c.get("/e/gone", None).await.unwrap().kvs()[0].value(), b"y");

    // The live key: history intact, and a write says what is wrong.
    let old = c.get("/e/live", Some(GetOptions::new().with_revision(first))).await.unwrap();
    assert_eq!(old.kvs()[0].value(), b"1");
    let e = c.put("/e/live", "3", None).await.unwrap_err();
    assert!(e.to_string().contains("has no message in the NATS stream"), "{e}");
    let old = c.get("/e/live", Some(GetOptions::new().with_revision(first))).await.unwrap();
    assert_eq!(old.kvs()[0].value(), b"1", "history survives the failed write");
    assert_eq!(c.get("/e/live", None).await.unwrap().kvs()[0].value(), b"2");
}
