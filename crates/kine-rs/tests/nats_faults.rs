//! NATS servers dying under load: 3 NATS servers (external, or embedded in 3 kine-rs), a bucket
//! with replicas=3, concurrent writers and a watcher on every node, and one server killed with
//! SIGKILL every few seconds, in rotation, for a minute. Afterwards every acknowledged write is
//! present at its revision on every node, every node's watch stream is exactly the stream's
//! sequence of changes (read from NATS itself: no gap, no duplicate, same order), and the shared
//! counters lost no update.

mod common;
use async_nats::jetstream::{self, consumer};
use common::*;
use etcd_client::*;
use futures_util::StreamExt;
use kine_backend_nats::message::{self, Decoded};
use kine_testkit::nats::{NatsCluster, free_port};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How long servers are killed in rotation.
const CHAOS: Duration = Duration::from_secs(60);
/// Shared counters incremented with compare-and-swap from every node.
const COUNTERS: usize = 3;

/// One change as a watcher reports it: (revision, is a deletion, key, value).
type Change = (i64, bool, String, String);

/// What the writers know for sure.
#[derive(Default)]
struct Acked {
    /// (key, revision, value; None = deleted) of every acknowledged write.
    writes: Vec<(String, i64, Option<String>)>,
    /// Increments acknowledged per counter, and those whose outcome is unknown.
    increments: [u64; COUNTERS],
    unknown_increments: [u64; COUNTERS],
}

/// The nodes under test: kine-rs processes and the NATS servers they use.
trait Nodes: Send {
    fn url(&self, i: usize) -> String;
    /// Kills node `i`'s NATS server (SIGKILL).
    fn kill(&mut self, i: usize);
    /// Starts it again on the same store.
    fn revive(&mut self, i: usize);
    fn nats_url(&self) -> String;
    fn logs(&self) -> String;
}

struct External {
    cluster: NatsCluster,
    kine: Vec<Server>,
}

impl Nodes for External {
    fn url(&self, i: usize) -> String {
        self.kine[i].url.clone()
    }
    fn kill(&mut self, i: usize) {
        self.cluster.nodes[i].kill();
    }
    fn revive(&mut self, i: usize) {
        self.cluster.nodes[i].start();
    }
    fn nats_url(&self) -> String {
        self.cluster.urls(0)
    }
    fn logs(&self) -> String {
        self.kine.iter().enumerate().map(|(i, s)| format!("--- kine-rs node {i}:\n{}", s.log())).collect()
    }
}

/// kine-rs processes with embedded servers: killing the server kills its kine-rs.
struct Embedded {
    endpoints: Vec<String>,
    listen: Vec<String>,
    kine: Vec<Option<Server>>,
    client_ports: Vec<u16>,
    dead_logs: String,
}

impl Embedded {
    fn start(&self, i: usize) -> Server {
        Server::start(&["--endpoint", &self.endpoints[i], "--listen-address", &self.listen[i]])
    }
}

impl Nodes for Embedded {
    fn url(&self, i: usize) -> String {
        format!("http://{}", self.listen[i])
    }
    fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.kine[i].take() {
            let _ = s.child.kill();
            let _ = s.child.wait();
            self.dead_logs.push_str(&format!("--- killed kine-rs node {i}:\n{}", s.log()));
        }
    }
    fn revive(&mut self, i: usize) {
        self.kine[i] = Some(self.start(i));
    }
    fn nats_url(&self) -> String {
        self.client_ports.iter().map(|p| format!("nats://ha:secret@127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }
    fn logs(&self) -> String {
        let mut out = self.dead_logs.clone();
        for (i, s) in self.kine.iter().enumerate() {
            if let Some(s) = s {
                out.push_str(&format!("--- kine-rs node {i}:\n{}", s.log()));
            }
        }
        out
    }
}

async fn connect(url: &str) -> Client {
    let options =
        ConnectOptions::new().with_connect_timeout(Duration::from_secs(2)).with_timeout(Duration::from_secs(10));
    loop {
        if let Ok(c) = Client::connect([url], Some(options.clone())).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Follows `/f/` from revision 1 through node `url`; a broken stream (the node was killed) is
/// resumed after the last revision seen, as kube-apiserver would. Fails on a cancellation.
async fn watcher(url: String, done: Arc<AtomicBool>, until: Arc<AtomicI64>, out: Arc<Mutex<Vec<Change>>>) {
    let mut next = 1;
    loop {
        let mut client = connect(&url).await;
        let options = WatchOptions::new().with_prefix().with_start_revision(next);
        let Ok(mut stream) = client.watch("/f/", Some(options)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            if done.load(Ordering::SeqCst) && next > until.load(Ordering::SeqCst) {
                return;
            }
            let msg = match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
                Err(_) => continue,
                Ok(Ok(Some(m))) => m,
                Ok(_) => break,
            };
            assert!(!msg.canceled(), "watch on {url} cancelled: {:?} {}", msg.compact_revision(), msg.cancel_reason());
            let mut changes = out.lock().await;
            for e in msg.events() {
                let kv = e.kv().unwrap();
                assert!(
                    kv.mod_revision() >= next,
                    "watch on {url} went back: {} after {}",
                    kv.mod_revision(),
                    next - 1
                );
                let deleted = e.event_type() == EventType::Delete;
                changes.push((kv.mod_revision(), deleted, text(kv.key()), text(kv.value())));
                next = kv.mod_revision();
            }
            if !msg.events().is_empty() {
                // Every event of one revision arrives in one response.
                next += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes through node `node` until `done`: conditional creates, two-key transactions,
/// conditional deletes of its own keys, and compare-and-swap increments of shared counters.
async fn writer(node: usize, url: String, done: Arc<AtomicBool>, acked: Arc<Mutex<Acked>>) {
    let mut c = connect(&url).await;
    let mut n = 0u64;
    let mut mine: Vec<(String, i64)> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        n += 1;
        let result: Result<(), Error> = async {
            match n % 4 {
                0 => {
                    let j = (n as usize / 4) % COUNTERS;
                    let key = format!("/f/ctr/{j}");
                    let got = c.get(key.as_str(), None).await?;
                    let (rev, value) = got
                        .kvs()
                        .first()
                        .map_or((0, 0), |kv| (kv.mod_revision(), text(kv.value()).parse::<u64>().unwrap()));
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                        .and_then([TxnOp::put(key.as_str(), (value + 1).to_string(), None)]);
                    match c.txn(txn).await {
                        Ok(r) if r.succeeded() => {
                            let mut a = acked.lock().await;
                            a.increments[j] += 1;
                            a.writes.push((key, r.header().unwrap().revision(), Some((value + 1).to_string())));
                        }
                        Ok(_) => {}
                        Err(e) => {
                            acked.lock().await.unknown_increments[j] += 1;
                            return Err(e);
                        }
                    }
                }
                1 if mine.len() > 4 => {
                    let (key, rev) = mine.remove(0);
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    let r = c.txn(txn).await?;
                    if r.succeeded() {
                        acked.lock().await.writes.push((key, r.header().unwrap().revision(), None));
                    }
                }
                2 => {
                    let (a, b) = (format!("/f/m/{node}/{n}/a"), format!("/f/m/{node}/{n}/b"));
                    let txn = Txn::new()
                        .when([
                            Compare::mod_revision(a.as_str(), CompareOp::Equal, 0),
                            Compare::mod_revision(b.as_str(), CompareOp::Equal, 0),
                        ])
                        .and_then([TxnOp::put(a.as_str(), "a", None), TxnOp::put(b.as_str(), "b", None)]);
                    let r = c.txn(txn).await?;
                    if r.succeeded() {
                        let rev = r.header().unwrap().revision();
                        let mut acked = acked.lock().await;
                        acked.writes.push((a, rev, Some("a".into())));
                        acked.writes.push((b, rev, Some("b".into())));
                    }
                }
                _ => {
                    let key = format!("/f/c/{node}/{n}");
                    let value = format!("{node}-{n}");
                    // Conditional: an attempt whose answer was lost cannot apply twice.
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(key.as_str(), value.as_str(), None)]);
                    let r = c.txn(txn).await?;
                    if r.succeeded() {
                        let rev = r.header().unwrap().revision();
                        mine.push((key.clone(), rev));
                        acked.lock().await.writes.push((key, rev, Some(value)));
                    }
                }
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A NATS client of the servers in `nats_url` (`nats://[user:pass@]host:port,...`).
async fn nats_client(nats_url: &str) -> async_nats::Client {
    let (mut options, mut servers) = (async_nats::ConnectOptions::new(), Vec::new());
    for url in nats_url.split(',') {
        let url = match url.strip_prefix("nats://").and_then(|rest| rest.split_once('@')) {
            Some((credentials, host)) => {
                let (user, password) = credentials.split_once(':').unwrap();
                options = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into());
                format!("nats://{host}")
            }
            None => url.to_string(),
        };
        servers.push(url.parse::<async_nats::ServerAddr>().unwrap());
    }
    options.connect(servers).await.expect("connect to NATS")
}

/// When NATS serves the bucket again: its stream has a leader that answers, and a consumer can
/// be created (the JetStream meta leader answers too).
async fn nats_serves(js: jetstream::Context, bucket: String) -> Instant {
    let limit = Duration::from_secs(1);
    loop {
        if let Ok(Ok(stream)) = tokio::time::timeout(limit, js.get_stream(format!("KV_{bucket}"))).await
            && stream.cached_info().cluster.as_ref().is_some_and(|c| c.leader.is_some())
            && let Ok(Ok(c)) = tokio::time::timeout(
                limit,
                stream.create_consumer(consumer::pull::Config {
                    memory_storage: true,
                    inactive_threshold: Duration::from_secs(5),
                    ..Default::default()
                }),
            )
            .await
        {
            let at = Instant::now();
            let _ = stream.delete_consumer(&c.cached_info().name).await;
            return at;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The bucket's changes under `/f/`, read from the stream itself: (revision, deleted, key,
/// value), a multi-key batch at the sequence of its last message.
async fn stream_changes(nats_url: &str, bucket: &str) -> Vec<Change> {
    let js = jetstream::new(nats_client(nats_url).await);
    let stream = js.get_stream(format!("KV_{bucket}")).await.expect("the bucket's stream");
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("$KV.{bucket}.>"),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut out = Vec::new();
    let mut batch: Vec<Change> = Vec::new();
    let mut seen = 0;
    while seen < last {
        let msg = tokio::time::timeout(Duration::from_secs(10), messages.next()).await.unwrap().unwrap().unwrap();
        let seq = msg.info().unwrap().stream_sequence;
        seen = seq;
        let Decoded::Change(event) =
            message::decode(bucket, msg.subject.as_str(), msg.headers.as_ref(), &msg.payload, seq as i64)
        else {
            continue;
        };
        let deleted = event.kind == kine_core::EventKind::Delete;
        let change = (seq as i64, deleted, text(&event.kv.key), text(&event.kv.value));
        match message::batch_position(msg.headers.as_ref()) {
            Some((i, n)) => {
                batch.push(change);
                if i == n {
                    for (_, d, k, v) in batch.drain(..) {
                        out.push((seq as i64, d, k, v));
                    }
                }
            }
            None => out.push(change),
        }
    }
    out.retain(|c| c.2.starts_with("/f/"));
    out
}

async fn run(mut nodes: Box<dyn Nodes>, bucket: &str) {
    let done = Arc::new(AtomicBool::new(false));
    let until = Arc::new(AtomicI64::new(i64::MAX));
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut watched = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let seen = Arc::new(Mutex::new(Vec::new()));
        watched.push(seen.clone());
        tasks.push(tokio::spawn(watcher(nodes.url(i), done.clone(), until.clone(), seen)));
    }
    let mut writers = Vec::new();
    for i in 0..3 {
        for _ in 0..2 {
            writers.push(tokio::spawn(writer(i, nodes.url(i), done.clone(), acked.clone())));
        }
    }
    // Kill a server every few seconds, in rotation; measure how long its node then takes to
    // serve a linearizable read again, and how long NATS itself took to serve the bucket.
    let js = jetstream::new(nats_client(&nodes.nats_url()).await);
    let started = Instant::now();
    let mut round = 0;
    let mut recoveries = Vec::new();
    while started.elapsed() < CHAOS {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let i = round % 3;
        round += 1;
        nodes.kill(i);
        tokio::time::sleep(Duration::from_millis(300 + 400 * (round as u64 % 3))).await;
        let back = Instant::now();
        nodes = tokio::task::spawn_blocking(move || {
            nodes.revive(i);
            nodes
        })
        .await
        .unwrap();
        let nats_back = tokio::spawn(nats_serves(js.clone(), bucket.to_string()));
        let mut c = connect(&nodes.url(i)).await;
        loop {
            match c.get("/f/probe", None).await {
                Ok(_) => break,
                Err(_) if back.elapsed() < Duration::from_secs(60) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("node {i} does not serve 60 s after its server returned: {e}\n{}", nodes.logs()),
            }
        }
        let kine = back.elapsed();
        let nats = nats_back.await.unwrap().duration_since(back);
        eprintln!("round {round}: after its server returned, NATS served in {nats:?}, node {i} in {kine:?}");
        recoveries.push(kine.saturating_sub(nats));
    }
    done.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    let acked = Arc::try_unwrap(acked).ok().unwrap().into_inner();
    assert!(acked.writes.len() > 500, "the load ran ({} acknowledged writes)", acked.writes.len());
    let limit = Duration::from_secs(60);
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(connect(&nodes.url(i)).await);
    }
    let (end, _) = until_served("the final write", limit, || {
        let mut c = clients[0].clone();
        async move { c.put("/f/end", "x", None).await }
    })
    .await;
    let last = end.header().unwrap().revision();
    until.store(last, Ordering::SeqCst);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await.expect("watchers reach the final write").unwrap();
    }
    let slowest = recoveries.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} acknowledged writes, last revision {last}, {round} kills; a node served at most {slowest:?} after NATS did",
        acked.writes.len(),
    );
    assert!(slowest <= Duration::from_secs(3), "a node served {slowest:?} after NATS did\n{}", nodes.logs());
    let logs = nodes.logs();
    eprintln!(
        "consumer skips detected and read again: {}; bucket loaded again: {}",
        logs.matches("the NATS consumer skipped messages").count(),
        logs.matches("NATS bucket loaded again").count()
    );

    // The truth: the stream itself.
    let truth = stream_changes(&nodes.nats_url(), bucket).await;
    assert_eq!(truth.last().map(|c| c.0), Some(last), "the stream ends with the final write");
    let at: BTreeMap<(String, i64), (bool, String)> =
        truth.iter().map(|(r, d, k, v)| ((k.clone(), *r), (*d, v.clone()))).collect();
    for (key, rev, value) in &acked.writes {
        let got = at.get(&(key.clone(), *rev));
        let expected = (value.is_none(), value.clone().unwrap_or_default());
        assert_eq!(got, Some(&expected), "acknowledged write {key}@{rev} is not in the stream");
    }
    // Every node's watch stream is the stream's sequence of changes.
    for (i, seen) in watched.iter().enumerate() {
        let seen = seen.lock().await;
        let first_difference = seen.iter().zip(&truth).position(|(a, b)| a != b);
        assert!(
            first_difference.is_none() && seen.len() == truth.len(),
            "node {i}'s watch differs from the stream (lengths {} vs {}) at {:?}: {:?} vs {:?}\n{}",
            seen.len(),
            truth.len(),
            first_difference,
            first_difference.map(|p| &seen[p]),
            first_difference.map(|p| &truth[p]),
            nodes.logs()
        );
    }
    // Every acknowledged write is readable at its revision on every node (concurrently, 32
    // reads in flight per node).
    for (node, c) in clients.iter().enumerate() {
        let reads = futures_util::stream::iter(acked.writes.iter().cloned()).map(|(key, rev, value)| {
            let c = c.clone();
            async move {
                let (r, _) = until_served("a read at an acknowledged revision", limit, || {
                    let (mut c, key) = (c.clone(), key.clone());
                    async move { c.get(key.as_str(), Some(GetOptions::new().with_revision(rev))).await }
                })
                .await;
                match (&value, r.kvs().first()) {
                    (None, None) => {}
                    (Some(v), Some(kv)) => {
                        assert_eq!((kv.mod_revision(), text(kv.value())), (rev, v.clone()), "node {node}: {key}@{rev}")
                    }
                    (v, kv) => panic!("node {node}: {key}@{rev}: expected {v:?}, got {kv:?}"),
                }
            }
        });
        reads.buffer_unordered(32).collect::<Vec<()>>().await;
    }
    // No lost update: each counter went up by every acknowledged increment, plus at most the
    // ones whose answer was lost.
    for j in 0..COUNTERS {
        let value = clients[0]
            .get(format!("/f/ctr/{j}"), None)
            .await
            .unwrap()
            .kvs()
            .first()
            .map_or(0, |kv| text(kv.value()).parse::<u64>().unwrap());
        let (ok, unknown) = (acked.increments[j], acked.unknown_increments[j]);
        assert!(ok <= value && value <= ok + unknown, "counter {j} = {value}: {ok} acknowledged, {unknown} unknown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn external_servers_killed_in_rotation() {
    let cluster = NatsCluster::start();
    let mut kine = Vec::new();
    for i in 0..3 {
        // Each node names only its own server (it learns the others from it).
        let endpoint = format!("nats://127.0.0.1:{}?noEmbed&bucket=faults&replicas=3", cluster.nodes[i].port);
        kine.push(Server::start(&["--endpoint", &endpoint]));
    }
    run(Box::new(External { cluster, kine }), "faults").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_servers_killed_in_rotation() {
    let dir = TempDir::new("embedded-faults");
    let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let client_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let routes: Vec<String> = cluster_ports.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect();
    let mut endpoints = Vec::new();
    for i in 0..3 {
        let conf = dir.path().join(format!("node{i}.conf"));
        let text = format!(
            "server_name: kine-{i}\ncluster {{\n  name: faults\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
            cluster_ports[i],
            routes.join(", ")
        );
        std::fs::write(&conf, text).unwrap();
        endpoints.push(format!(
            "nats://ha:secret@127.0.0.1:{}?serverConfig={}&replicas=3&bucket=faults&dataDir={}",
            client_ports[i],
            conf.display(),
            dir.path().join(format!("store{i}")).display()
        ));
    }
    let listen: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let mut nodes =
        Embedded { endpoints, listen, kine: vec![None, None, None], client_ports, dead_logs: String::new() };
    // The first start needs every server (a fresh JetStream cluster forms once all have met).
    let started: Vec<_> = (0..3)
        .map(|i| {
            let (e, l) = (nodes.endpoints[i].clone(), nodes.listen[i].clone());
            std::thread::spawn(move || Server::start(&["--endpoint", &e, "--listen-address", &l]))
        })
        .collect();
    for (i, s) in started.into_iter().enumerate() {
        nodes.kine[i] = Some(s.join().unwrap());
    }
    run(Box::new(nodes), "faults").await;
    drop(dir);
}
