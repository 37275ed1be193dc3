//! Fault runs in which kine-rs nodes die: three kine-rs nodes, each with its embedded
//! nats-server, clustered by routes (bucket `replicas=3`); one at a time is killed with SIGKILL
//! (kine-rs and its nats-server: one process) and started again on the same data directory a
//! few seconds later, in rotation, and the bucket's stream leader is moved to the node that
//! returns. The workload and every check are the harness's (crates/chaos): acknowledged writes,
//! one history, watches without gaps, per-key linearizability. Each run prints a
//! `CHAOS-RESULT` line (docs/reliability.md collects them).
//!
//! `KINE_CHAOS_RUNS=N` repeats the run N times on the same cluster (each on a fresh prefix), for a
//! campaign by hand; CI runs [`RUNS`].
#![cfg(feature = "embedded-nats")]

mod common;
use common::leader::place_leader;
use common::{Server, TempDir, http_get, server_bin};
use kine_chaos::{Fault, Mix, Report, Schedule, Workload, run};
use kine_testkit::nats::free_port;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs in CI: a violation that shows in one run of five shows here with a probability of
/// 1 - 0.8^RUNS (0.89 for 10); each run is about 45 s.
const RUNS: usize = 10;

/// A node killed every `hold + rest` seconds, down for `hold`.
fn schedule() -> Schedule {
    Schedule { warmup: Duration::from_secs(3), hold: Duration::from_secs(3), rest: Duration::from_secs(7), rounds: 4 }
}

/// A node's command line and the process running it, if it runs.
struct Node {
    args: Vec<String>,
    server: Option<Server>,
    /// The logs of its earlier lives.
    earlier: String,
}

impl Node {
    fn start(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.server = Some(Server::start_command(Command::new(server_bin()), &args));
    }

    fn log(&self) -> String {
        let now = self.server.as_ref().map(Server::log).unwrap_or_default();
        format!("{}{now}", self.earlier)
    }
}

/// SIGKILL of node `next % n`, and its restart on heal, after which the stream leader is moved
/// to it.
struct KillInRotation {
    nodes: Arc<Mutex<Vec<Node>>>,
    nats: Vec<String>,
    next: usize,
    down: Option<usize>,
}

impl Fault for KillInRotation {
    fn name(&self) -> String {
        "SIGKILL of a kine-rs with its embedded nats-server in rotation, restarted on its data after 3 s, \
         stream leader moved to it"
            .into()
    }

    fn inject(&mut self) -> anyhow::Result<()> {
        let mut nodes = self.nodes.lock().unwrap();
        let i = self.next % nodes.len();
        self.next += 1;
        let node = &mut nodes[i];
        let mut server = node.server.take().expect("the node runs");
        server.child.kill()?;
        server.child.wait()?;
        node.earlier.push_str(&format!("{}--- node {i} killed (SIGKILL) ---\n", server.log()));
        self.down = Some(i);
        Ok(())
    }

    fn heal(&mut self) -> anyhow::Result<()> {
        let Some(i) = self.down.take() else { return Ok(()) };
        tokio::task::block_in_place(|| self.nodes.lock().unwrap()[i].start());
        let nats = self.nats.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(place_leader(
                &nats,
                Some(("kine", "chaos")),
                "KV_chaos",
                &format!("kine-{i}"),
            ))
        })
    }
}

/// Each node's read barriers that waited for writes the stream leader had not stored yet
/// (`kine_nats_read_barrier_waits_total`, since the node's last start): reads that the barrier
/// before issue #46 would have served without them.
async fn barrier_waits(ports: &[u16]) -> String {
    let mut out = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let (_, body) = http_get(*port, "/metrics", None).await;
        let count = |reason: &str| {
            body.lines()
                .find(|l| l.starts_with("kine_nats_read_barrier_waits_total") && l.contains(&format!("\"{reason}\"")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.push(format!("node {i}: {} leader applying, {} proposals", count("leader_applying"), count("proposals")));
    }
    format!("barrier waits since each node's start: {}", out.join("; "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_nats_nodes_are_killed_in_rotation() {
    let runs = std::env::var("KINE_CHAOS_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(RUNS);
    let dir = TempDir::new("chaos-restarts");
    let cluster: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let etcd: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let metrics: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let routes: Vec<String> = cluster.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let conf = dir.path().join(format!("node{i}.conf"));
        let text = format!(
            "server_name: kine-{i}\ncluster {{\n  name: chaos\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
            cluster[i],
            routes.join(", ")
        );
        std::fs::write(&conf, text).unwrap();
        let endpoint = format!(
            "nats://kine:chaos@127.0.0.1:{}?serverConfig={}&replicas=3&bucket=chaos&dataDir={}",
            client[i],
            conf.display(),
            dir.path().join(format!("store{i}")).display()
        );
        let args = vec![
            "--endpoint".into(),
            endpoint,
            "--listen-address".into(),
            format!("127.0.0.1:{}", etcd[i]),
            "--metrics-bind-address".into(),
            format!("127.0.0.1:{}", metrics[i]),
        ];
        nodes.push(Node { args, server: None, earlier: String::new() });
    }
    // All at once: a fresh JetStream cluster forms only once every server has met the others.
    let started: Vec<_> = nodes
        .into_iter()
        .map(|mut n| {
            std::thread::spawn(move || {
                n.start();
                n
            })
        })
        .collect();
    let nodes: Vec<Node> = started.into_iter().map(|h| h.join().expect("a node started")).collect();
    let endpoints: Vec<String> = etcd.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let nodes = Arc::new(Mutex::new(nodes));
    let nats = client.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect();
    let mut fault = KillInRotation { nodes: nodes.clone(), nats, next: 0, down: None };
    let logs = || {
        nodes.lock().unwrap().iter().enumerate().map(|(i, n)| format!("=== node {i}\n{}", n.log())).collect::<String>()
    };
    let mut reports: Vec<Report> = Vec::new();
    for r in 0..runs {
        let workload =
            Workload { prefix: format!("/registry/chaos{r}/"), keys: 8, mix: Mix::KeyValue, ..Workload::default() };
        let report = run(&endpoints, workload, &mut fault, schedule()).await.expect("the run");
        eprintln!("CHAOS-RESULT run {}/{runs}: {report} | {}", r + 1, barrier_waits(&metrics).await);
        // KINE_CHAOS_LOGS=1: the servers' logs of every run, not only of runs with findings.
        if !report.findings.is_empty() || std::env::var_os("KINE_CHAOS_LOGS").is_some() {
            eprintln!("{}", logs());
        }
        reports.push(report);
    }
    let failed: Vec<&Report> = reports.iter().filter(|r| !r.findings.is_empty()).collect();
    assert!(failed.is_empty(), "{} of {runs} runs did not hold:\n{:#?}", failed.len(), failed);
    for r in &reports {
        r.assert_held();
    }
}
