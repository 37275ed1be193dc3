//! Fault run on S3 durability (crates/chaos): two kine-rs nodes on one S3 folder, each in a
//! network namespace reaching a real S3-compatible server (versitygw) through the host; the
//! writer (`--s3-sync`) takes the workload's writes, the follower refuses them and serves its
//! read-only copy. The writer is killed in the first round and cut off from S3 in the second
//! (it stops once it can no longer renew the writer lock); each time the follower takes over,
//! and the lost node comes back on an empty data directory as the new follower. Then every
//! check of the harness: acknowledged writes present, one history on both nodes, watches
//! without gaps, lists and reads matching the history, per-key linearizability — reads on the
//! follower included. Prints `CHAOS-RESULT`; needs root (network namespaces), fails without it.

mod common;
use common::*;
use kine_chaos::{Fault, Lab, Schedule, Workload, run};
use kine_testkit::s3::S3Server;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The writer lock's lease: renewals must get through a busy S3 server (versitygw beside two
/// debug builds, a restore and the workload on two cores) within it.
const LEASE: &str = "5s";

/// A node in namespace `i`, on a new data directory, listening on its client link.
fn start_node(lab: &Lab, i: usize, s3: &str, dirs: &mut Vec<TempDir>) -> Server {
    let dir = TempDir::new(&format!("chaos-s3-{i}"));
    let (endpoint, listen) = (db_endpoint(dir.path()), format!("{}:2379", lab.client_ip(i)));
    dirs.push(dir);
    let mut args = vec!["--endpoint", &endpoint, "--listen-address", &listen, "--s3-sync"];
    let flags = common::s3::s3_flags(s3, "chaos", LEASE);
    args.extend(flags.iter().map(String::as_str));
    Server::start_command(lab.command(i, server_bin()), &args)
}

/// Round 0 kills the writer, round 1 cuts it off from S3; each heal brings the lost node back
/// on an empty data directory once the other node writes.
struct LoseTheWriter {
    lab: Arc<Lab>,
    s3: String,
    nodes: Arc<Mutex<Vec<Server>>>,
    /// The logs of the nodes replaced.
    past: Arc<Mutex<String>>,
    dirs: Vec<TempDir>,
    writer: usize,
    round: usize,
}

/// The time of day (UTC), as the servers' logs print it.
fn chrono_now() -> String {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (s, ms) = (since.as_secs() % 86_400, since.subsec_millis());
    format!("{:02}:{:02}:{:02}.{ms:03} UTC", s / 3600, s / 60 % 60, s % 60)
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let began = Instant::now();
    while !done() {
        if began.elapsed() > limit {
            anyhow::bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

impl Fault for LoseTheWriter {
    fn name(&self) -> String {
        "S3 writer killed, then cut off from S3 (2 nodes, --s3-sync)".into()
    }

    fn inject(&mut self) -> anyhow::Result<()> {
        let nodes = self.nodes.lock().unwrap();
        let writer = &nodes[self.writer];
        let log = writer.log();
        let writes = log.contains("shipping the datastore to S3") || log.contains("took the S3 writer lock");
        anyhow::ensure!(writes, "node {} is not the writer: {log}", self.writer);
        match self.round {
            0 => writer.signal("KILL"),
            _ => self.lab.cut(self.writer)?,
        }
        eprintln!("{}: round {}: node {} lost", chrono_now(), self.round, self.writer);
        Ok(())
    }

    fn heal(&mut self) -> anyhow::Result<()> {
        let (lost, other) = (self.writer, 1 - self.writer);
        {
            let mut nodes = self.nodes.lock().unwrap();
            wait_for("the follower takes over", Duration::from_secs(20), || {
                nodes[other].log().contains("took the S3 writer lock")
            })?;
            if self.round > 0 {
                // Cut off from S3, the writer stops once its lease runs out.
                let node = &mut nodes[lost];
                wait_for("the writer cut off from S3 stops", Duration::from_secs(20), || {
                    node.child.try_wait().ok().flatten().is_some()
                })?;
                self.lab.heal(lost)?;
            }
        }
        let node = start_node(&self.lab, lost, &self.s3, &mut self.dirs);
        anyhow::ensure!(node.log().contains("serving a read-only copy"), "{}", node.log());
        let old = std::mem::replace(&mut self.nodes.lock().unwrap()[lost], node);
        self.past.lock().unwrap().push_str(&old.log());
        eprintln!("{}: round {}: node {other} writes, node {lost} follows again", chrono_now(), self.round);
        (self.writer, self.round) = (other, self.round + 1);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_s3_writer_is_killed_then_cut_off_from_s3() {
    let lab = Arc::new(Lab::new(2).expect("the network namespaces"));
    let server = S3Server::start_on(&lab.host_data_ip(), &["kine"]);
    let s3 = server.endpoint();
    let mut dirs = Vec::new();
    let first = start_node(&lab, 0, &s3, &mut dirs);
    let second = start_node(&lab, 1, &s3, &mut dirs);
    assert!(second.log().contains("serving a read-only copy"), "{}", second.log());
    let endpoints = vec![first.url.clone(), second.url.clone()];
    let nodes = Arc::new(Mutex::new(vec![first, second]));
    let past = Arc::new(Mutex::new(String::new()));
    let mut fault =
        LoseTheWriter { lab: lab.clone(), s3, nodes: nodes.clone(), past: past.clone(), dirs, writer: 0, round: 0 };
    let schedule = Schedule {
        warmup: Duration::from_secs(3),
        hold: Duration::from_secs(8),
        rest: Duration::from_secs(6),
        rounds: 2,
    };
    let spec = Workload { timeout: Duration::from_secs(10), ..Workload::default() };
    let logs = || past.lock().unwrap().clone() + &nodes.lock().unwrap().iter().map(Server::log).collect::<String>();
    let report = match run(&endpoints, spec, &mut fault, schedule).await {
        Ok(report) => report,
        Err(err) => panic!("the run: {err:#}\n{}", logs()),
    };
    eprintln!("CHAOS-RESULT {report}");
    if !report.findings.is_empty() || std::env::var_os("KINE_CHAOS_LOGS").is_some() {
        eprintln!("{}", logs());
    }
    report.assert_held();
    assert_eq!(fault.round, 2, "both rounds ran");
    assert!(report.recovery <= Duration::from_secs(15), "{report}");
    // The learner's refusals were counted, not taken for writes of unknown outcome.
    assert!(report.errors.contains_key("FailedPrecondition"), "{report}");
}
