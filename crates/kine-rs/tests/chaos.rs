//! Fault runs (crates/chaos): a Kubernetes-shaped workload on several kine-rs nodes while their
//! datastore stalls (SIGSTOP) or a node is cut off from it by a network partition (network
//! namespaces), then every check of the harness: acknowledged writes present, one history on
//! every node, watches without gaps, lists and reads matching the history, per-key
//! linearizability. Each run prints a `CHAOS-RESULT` line (docs/reliability.md collects them).
//!
//! The partition runs need root (network namespaces); they fail, not skip, without it.

mod common;
use common::leader::place_leader;
use common::*;
use kine_chaos::{Fault, Lab, Partition, Report, Schedule, Stall, Workload, run};
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::nats::{NatsCluster, NatsServer, free_port};
use kine_testkit::postgres::PgServer;
use kine_testkit::proxy::Proxy;
use std::sync::Arc;
use std::time::Duration;

/// Two faults of 8 s (longer than the clients' 3 s request timeout), 6 s apart.
fn schedule() -> Schedule {
    Schedule { warmup: Duration::from_secs(3), hold: Duration::from_secs(8), rest: Duration::from_secs(6), rounds: 2 }
}

/// The longest a node may take to answer again after a fault ends.
const RECOVERY: Duration = Duration::from_secs(15);

/// For a NATS node cut off from the others: it serves again once its NATS server has rejoined
/// the stream's and the JetStream meta group's Raft groups (it must learn their leaders, and a
/// node that led the stream must first drop what it took alone). That takes one election
/// timeout of nats-server's Raft (4 to 9 s) when all goes well (5.5 s measured on this
/// machine), and another when an election fails: the bound allows two.
const NATS_RAFT_RECOVERY: Duration = Duration::from_secs(20);

/// [`schedule`] with a rest longer than [`NATS_RAFT_RECOVERY`]: a node still rejoining when the
/// next fault begins would have its recovery measured across that fault.
fn nats_partition_schedule() -> Schedule {
    Schedule { rest: NATS_RAFT_RECOVERY + Duration::from_secs(2), ..schedule() }
}

fn held(report: &Report, logs: impl Fn() -> String) {
    held_within(report, RECOVERY, logs)
}

/// The run held and every node answered again within `recovery` of every heal.
fn held_within(report: &Report, recovery: Duration, logs: impl Fn() -> String) {
    eprintln!("CHAOS-RESULT {report}");
    // KINE_CHAOS_LOGS=1: the servers' logs of every run, not only of runs with findings.
    if !report.findings.is_empty() || report.recovery > recovery || std::env::var_os("KINE_CHAOS_LOGS").is_some() {
        eprintln!("{}", logs());
    }
    report.assert_held();
    assert!(report.recovery <= recovery, "{report}\nrecovery took {:?}", report.recovery);
}

/// Every request got an answer from kine-rs (an error with a code, etcd's "request timed out"
/// while the datastore stalled), none ran into the client's own deadline.
fn answered_by_kine_rs(report: &Report) {
    assert!(!report.errors.contains_key("timeout"), "requests hung past kine-rs's request timeout: {report}");
    assert!(report.errors.contains_key("Unavailable"), "the stall was not noticed: {report}");
}

/// (alive async tasks, open file descriptors) of a kine-rs, from its /metrics.
async fn resources(metrics_port: u16) -> (i64, i64) {
    let (_, body) = http_get(metrics_port, "/metrics", None).await;
    let value = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
            .unwrap_or_else(|| panic!("{name} not in /metrics"))
    };
    (value("kine_runtime_alive_tasks ") as i64, value("process_open_fds ") as i64)
}

/// Two kine-rs nodes on one database whose processes stall; afterwards no task or connection
/// has leaked (counted before the run and after it).
async fn stalled_database(url: &str, what: &str, pid: u32, logs: impl Fn() -> String) {
    let ports = [free_port(), free_port()];
    let nodes: Vec<Server> = ports
        .iter()
        .map(|p| {
            let metrics = format!("127.0.0.1:{p}");
            let args = ["--endpoint", url, "--metrics-bind-address", &metrics, "--datastore-max-idle-connections", "4"];
            Server::start(&args)
        })
        .collect();
    let mut before = Vec::new();
    for p in ports {
        before.push(resources(p).await);
    }
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut fault = Stall::tree(what, pid);
    // Clients wait longer than kine-rs's request timeout (7 s): kine-rs must answer first.
    let spec = Workload { timeout: Duration::from_secs(10), ..Workload::default() };
    let report = run(&endpoints, spec, &mut fault, schedule()).await.expect("the run");
    held(&report, || format!("{}\n{}", logs(), nodes.iter().map(Server::log).collect::<String>()));
    answered_by_kine_rs(&report);
    // The run's clients are gone: the nodes hold what they held before, plus at most the 4 idle
    // pooled connections (a socket and the synchronous client's own event fds each).
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (i, p) in ports.into_iter().enumerate() {
        let after = resources(p).await;
        eprintln!("node {i}: tasks {} → {}, open files {} → {}", before[i].0, after.0, before[i].1, after.1);
        assert!(after.0 <= before[i].0 + 8, "node {i}: tasks leaked: {:?} → {after:?}", before[i]);
        assert!(after.1 <= before[i].1 + 24, "node {i}: file descriptors leaked: {:?} → {after:?}", before[i]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stalls_under_two_nodes() {
    let pg = PgServer::start();
    stalled_database(&pg.url("chaos"), "PostgreSQL", pg.pid(), || pg.log()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_stalls_under_two_nodes() {
    let db = MariaDbServer::start();
    stalled_database(&db.url("chaos"), "MariaDB", db.pid(), || db.log()).await;
}

/// Two nodes on one standalone nats-server, whose read barriers ask the stream's last message
/// with a direct get (backend/direct.rs), falling back to STREAM.INFO while the server stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standalone_nats_server_stalls_under_two_nodes() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=chaos", nats.url());
    let nodes: Vec<Server> = (0..2).map(|_| Server::start(&["--endpoint", &endpoint])).collect();
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut fault = Stall::new("nats-server", vec![nats.pid()]);
    let spec = Workload { timeout: Duration::from_secs(10), ..Workload::default() };
    let report = run(&endpoints, spec, &mut fault, schedule()).await.expect("the run");
    held(&report, || nodes.iter().map(Server::log).collect());
    answered_by_kine_rs(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_three_nats_servers_stalls() {
    let cluster = NatsCluster::start();
    let nodes: Vec<Server> = (0..3)
        .map(|i| {
            let endpoint = format!("nats://127.0.0.1:{}?noEmbed&bucket=chaos&replicas=3", cluster.nodes[i].port);
            Server::start(&["--endpoint", &endpoint])
        })
        .collect();
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut fault = Stall::new("nats-server 0 of 3", vec![cluster.nodes[0].pid().expect("running")]);
    let spec = Workload { timeout: Duration::from_secs(10), ..Workload::default() };
    let report = run(&endpoints, spec, &mut fault, schedule()).await.expect("the run");
    held(&report, || nodes.iter().map(Server::log).collect());
    assert!(!report.errors.contains_key("timeout"), "requests hung past kine-rs's request timeout: {report}");
}

/// kine-rs node i in namespace i on `endpoints[i]`, listening on its client link; all started at
/// once (a fresh JetStream cluster forms only once every server has met the others).
fn start_in_namespaces(lab: &Lab, endpoints: Vec<String>) -> Vec<Server> {
    let starting: Vec<_> = endpoints
        .into_iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let cmd = lab.command(i, server_bin());
            let listen = format!("{}:2379", lab.client_ip(i));
            std::thread::spawn(move || {
                Server::start_command(cmd, &["--endpoint", &endpoint, "--listen-address", &listen])
            })
        })
        .collect();
    starting.into_iter().map(|s| s.join().expect("kine-rs started")).collect()
}

/// Three kine-rs nodes with embedded NATS servers, each in a network namespace of its own; one
/// is cut off from the other two (its kine-rs and its clients still reach it). Before the first
/// cut the bucket's stream leader is moved to the node cut off (a leader that keeps believing it
/// leads, up to its lost-quorum check, while the others elect another and take writes: the
/// case of stale reads), before the second to another node (the cut-off node is a follower).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_embedded_nats_node_is_partitioned_from_the_others() {
    let lab = Arc::new(Lab::new(3).expect("the network namespaces"));
    let dir = TempDir::new("chaos-embedded");
    let routes: Vec<String> = (0..3).map(|i| format!("\"nats-route://{}:6222\"", lab.data_ip(i))).collect();
    let mut endpoints = Vec::new();
    for i in 0..3 {
        let conf = dir.path().join(format!("node{i}.conf"));
        let text = format!(
            "server_name: kine-{i}\ncluster {{\n  name: chaos\n  listen: {}:6222\n  routes: [{}]\n}}\n",
            lab.data_ip(i),
            routes.join(", ")
        );
        std::fs::write(&conf, text).unwrap();
        // The client port on the data network too, so that the test can place the stream leader.
        let endpoint = format!(
            "nats://kine:chaos@{}:4222?serverConfig={}&replicas=3&bucket=chaos&dataDir={}",
            lab.data_ip(i),
            conf.display(),
            dir.path().join(format!("store{i}")).display()
        );
        endpoints.push(endpoint);
    }
    let nodes = start_in_namespaces(&lab, endpoints);
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let nats = (0..3).map(|i| format!("nats://{}:4222", lab.data_ip(i))).collect();
    let partition = Partition { lab: lab.clone(), node: 0, what: "embedded NATS node 0 from nodes 1 and 2".into() };
    let credentials = Some(("kine", "chaos"));
    let mut fault = LeaderThenCut { partition, nats, credentials, leaders: vec!["kine-0", "kine-1"], round: 0 };
    let report = run(&endpoints, Workload::default(), &mut fault, nats_partition_schedule()).await.expect("the run");
    held_within(&report, NATS_RAFT_RECOVERY, || nodes.iter().map(Server::log).collect());
    drop(nodes);
    fault.partition.heal().unwrap();
}

/// A partition preceded by moving the stream `KV_chaos`'s leader to `leaders[round]`.
struct LeaderThenCut {
    partition: Partition,
    nats: Vec<String>,
    credentials: Option<(&'static str, &'static str)>,
    leaders: Vec<&'static str>,
    round: usize,
}

impl Fault for LeaderThenCut {
    fn name(&self) -> String {
        format!("{} (stream leader placed first: {})", self.partition.name(), self.leaders.join(", then "))
    }
    fn inject(&mut self) -> anyhow::Result<()> {
        let leader = self.leaders[self.round % self.leaders.len()];
        self.round += 1;
        let (nats, credentials) = (self.nats.clone(), self.credentials);
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(place_leader(&nats, credentials, "KV_chaos", leader))
        })?;
        self.partition.inject()
    }
    fn heal(&mut self) -> anyhow::Result<()> {
        self.partition.heal()
    }
}

/// Two kine-rs nodes on one PostgreSQL; node 0 lives in a namespace that reaches the database
/// through a link that the partition cuts, node 1 keeps its own link.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_is_unreachable_from_one_of_two_nodes() {
    let lab = Arc::new(Lab::new(1).expect("the network namespace"));
    let pg = PgServer::start();
    let proxy = Proxy::start_on(lab.host_data_ip().parse().unwrap(), pg.port);
    let far =
        pg.url("chaos").replace(&format!("127.0.0.1:{}", pg.port), &format!("{}:{}", lab.host_data_ip(), proxy.port));
    let listen = format!("{}:2379", lab.client_ip(0));
    let nodes = [
        Server::start_command(lab.command(0, server_bin()), &["--endpoint", &far, "--listen-address", &listen]),
        Server::start(&["--endpoint", &pg.url("chaos")]),
    ];
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut fault = Partition { lab: lab.clone(), node: 0, what: "PostgreSQL from kine-rs node 0 of 2".into() };
    let report = run(&endpoints, Workload::default(), &mut fault, schedule()).await.expect("the run");
    held(&report, || format!("{}\n{}", pg.log(), nodes.iter().map(Server::log).collect::<String>()));
}

/// A process in a namespace, killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three external nats-servers, each in a namespace with its kine-rs; one server is cut off
/// from the other two (its kine-rs still reaches it over loopback, its clients reach the node),
/// the stream leader placed on it before the first cut and on another before the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_external_nats_server_is_partitioned_from_the_others() {
    let lab = Arc::new(Lab::new(3).expect("the network namespaces"));
    let dir = TempDir::new("chaos-external");
    let routes: Vec<String> = (0..3).map(|i| format!("nats-route://{}:6222", lab.data_ip(i))).collect();
    let mut servers = Vec::new();
    for i in 0..3 {
        let store = dir.path().join(format!("store{i}"));
        let log = std::fs::File::create(dir.path().join(format!("nats{i}.log"))).unwrap();
        let child = lab
            .command(i, kine_testkit::nats::nats_server_bin())
            .args(["-a", "0.0.0.0", "-p", "4222", "-js", "-n", &format!("n{i}"), "--cluster_name", "chaos"])
            .args(["--cluster", &format!("nats://{}:6222", lab.data_ip(i)), "--routes", &routes.join(",")])
            .arg("-sd")
            .arg(&store)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server in its namespace");
        servers.push(Child(child));
    }
    let nodes = start_in_namespaces(&lab, vec!["nats://127.0.0.1:4222?noEmbed&bucket=chaos&replicas=3".into(); 3]);
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let partition = Partition { lab: lab.clone(), node: 0, what: "external nats-server 0 from servers 1 and 2".into() };
    let nats = (0..3).map(|i| format!("nats://{}:4222", lab.data_ip(i))).collect();
    let mut fault = LeaderThenCut { partition, nats, credentials: None, leaders: vec!["n0", "n1"], round: 0 };
    let report = run(&endpoints, Workload::default(), &mut fault, nats_partition_schedule()).await.expect("the run");
    held_within(&report, NATS_RAFT_RECOVERY, || {
        let mut logs: String = nodes.iter().map(Server::log).collect();
        for i in 0..3 {
            logs.push_str(&std::fs::read_to_string(dir.path().join(format!("nats{i}.log"))).unwrap_or_default());
        }
        logs
    });
    drop(nodes);
    drop(servers);
}

/// Two kine-rs nodes on one MariaDB; node 0 reaches it through a link the partition cuts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_is_unreachable_from_one_of_two_nodes() {
    let lab = Arc::new(Lab::new(1).expect("the network namespace"));
    let db = MariaDbServer::start();
    let proxy = Proxy::start_on(lab.host_data_ip().parse().unwrap(), db.port());
    let near = db.url("chaos");
    let far = near.replace(&format!("127.0.0.1:{}", db.port()), &format!("{}:{}", lab.host_data_ip(), proxy.port));
    assert_ne!(far, near, "the MariaDB URL names 127.0.0.1:{}: {near}", db.port());
    let listen = format!("{}:2379", lab.client_ip(0));
    let nodes = [
        Server::start_command(lab.command(0, server_bin()), &["--endpoint", &far, "--listen-address", &listen]),
        Server::start(&["--endpoint", &near]),
    ];
    let endpoints: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut fault = Partition { lab: lab.clone(), node: 0, what: "MariaDB from kine-rs node 0 of 2".into() };
    let report = run(&endpoints, Workload::default(), &mut fault, schedule()).await.expect("the run");
    held(&report, || format!("{}\n{}", db.log(), nodes.iter().map(Server::log).collect::<String>()));
}
