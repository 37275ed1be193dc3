//! Differential test against real etcd 3.7 and 3.6, kine-rs emulating each
//! (`--emulated-etcd-version`): seeded random request sequences (puts, ranges and
//! deletes with every option, nested Txns with every compare, leases, compaction, HashKV,
//! alarms, watches with start revisions and filters) go to a fresh etcd and a fresh kine-rs, and
//! every answer must be equal field by field (see `differential/exec.rs` for the few fields that
//! may differ). On a difference the test prints the seed and a shrunk sequence that still
//! shows it.
//!
//! `KINE_DIFF_SEED=N` runs one seed; `KINE_DIFF_SEEDS` (seeds per backend against etcd 3.7;
//! a third of them, at least 2, against 3.6) and `KINE_DIFF_OPS` (requests per sequence) change
//! the amount of work.

mod common;
#[path = "differential/etcd.rs"]
mod etcd;
#[path = "differential/exec.rs"]
mod exec;
#[path = "differential/requests.rs"]
mod requests;
#[path = "differential/revisions.rs"]
mod revisions;

use common::{Server, TempDir};
use etcd::Version;
use exec::{Outcome, Side};
use requests::{Gen, Known, Op};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A kine-rs on a fresh datastore of one backend.
struct Kine {
    server: Server,
    _dir: TempDir,
    _nats: Option<kine_testkit::nats::NatsServer>,
    /// A database server (PostgreSQL, MariaDB), stopped on drop.
    _db: Option<Box<dyn std::any::Any>>,
}

fn kine(backend: &str, version: Version) -> Kine {
    let start =
        |endpoint: &str| Server::start(&["--endpoint", endpoint, "--emulated-etcd-version", version.emulated()]);
    let dir = TempDir::new("diff");
    let (endpoint, nats) = match backend {
        "sqlite" => (format!("sqlite://{}", dir.path().join("state.db").display()), None),
        "memory" => ("memory://".to_string(), None),
        "nats" => {
            let nats = kine_testkit::nats::NatsServer::start();
            (format!("{}?noEmbed", nats.url()), Some(nats))
        }
        "nats-embedded" => (format!("nats://?dataDir={}", dir.path().join("nats").display()), None),
        "postgres" => {
            let pg = kine_testkit::postgres::PgServer::start();
            let url = pg.url("diff");
            return Kine { server: start(&url), _dir: dir, _nats: None, _db: Some(Box::new(pg)) };
        }
        "mysql" => {
            let db = kine_testkit::mysql::MariaDbServer::start();
            let url = db.url("diff");
            return Kine { server: start(&url), _dir: dir, _nats: None, _db: Some(Box::new(db)) };
        }
        other => panic!("unknown backend {other}"),
    };
    Kine { server: start(&endpoint), _dir: dir, _nats: nats, _db: None }
}

/// A difference: the index of the first request answered differently, both answers, or the
/// watch whose events differ.
#[derive(Debug)]
struct Difference {
    at: usize,
    /// The events of a watch differ (found after the whole sequence ran).
    watch: bool,
    etcd: String,
    kine: String,
}

/// Sends `ops` to fresh servers; with `gen`, the sequence is generated as it goes (from
/// etcd's answers) and recorded into `ops`.
async fn run(
    backend: &str,
    version: Version,
    ops: &mut Vec<Op>,
    mut generator: Option<(Gen, usize)>,
) -> Result<(), Difference> {
    let etcd = etcd::Etcd::start(version);
    let kine = kine(backend, version);
    let mut e = Side::connect(&etcd.url).await;
    let mut k = Side::connect(&kine.server.url).await;
    let mut known = Known { revision: 1, compacted: 0 };
    // NATS numbers revisions differently (a request changing n keys takes n): compare through a
    // renaming learnt from the answers (see `differential/revisions.rs`).
    let mut renaming = backend.starts_with("nats").then(revisions::Renaming::new);
    let mut i = 0;
    loop {
        if let Some((g, n)) = generator.as_mut() {
            if i == *n {
                break;
            }
            ops.push(g.op(known));
        } else if i == ops.len() {
            break;
        }
        // A watch from a revision still ahead would start, under a renaming, somewhere that
        // cannot be known in advance.
        if let (Some(_), Op::Watch(w)) = (&renaming, &mut ops[i])
            && w.start_revision > known.revision
        {
            w.start_revision = 0;
        }
        let op = &ops[i];
        let mut kine_op = op.clone();
        if let Some(r) = &renaming {
            r.request(&mut kine_op);
        }
        let (a, mut b) = (e.run(op).await, k.run(&kine_op).await);
        if let Some(r) = renaming.as_mut() {
            if let (Some(re), Some(rk)) = (a.revision(), b.revision()) {
                r.record(re, rk);
            }
            r.outcome(&mut b);
        }
        if a != b {
            return Err(Difference { at: i, watch: false, etcd: format!("{a:#?}"), kine: format!("{b:#?}") });
        }
        if let Some(rev) = a.revision() {
            known.revision = known.revision.max(rev);
        }
        if let (Op::Compact(c), Outcome::Compact(_)) = (op, &a) {
            known.compacted = c.revision;
        }
        // A new watch catches up before anything else happens: what it delivers must not
        // depend on how fast each server catches up (a compaction right after it, say).
        if matches!(op, Op::Watch(_)) {
            let w = e.watches.len() - 1;
            e.sync_watch(w, known.revision, None).await;
            k.sync_watch(w, known.revision, renaming.as_ref()).await;
        }
        i += 1;
    }
    // Every watch delivered the same events and ended the same way.
    let last = known.revision;
    for w in 0..e.watches.len() {
        let a = e.drain_watch(w, last, None).await;
        let b = k.drain_watch(w, last, renaming.as_ref()).await;
        if a != b {
            let at = ops.iter().enumerate().filter(|(_, op)| matches!(op, Op::Watch(_))).nth(w).map_or(0, |(i, _)| i);
            return Err(Difference { at, watch: true, etcd: a.join("\n"), kine: b.join("\n") });
        }
    }
    Ok(())
}

/// How long shrinking may take before the shortest sequence found so far is reported.
const SHRINK_BUDGET: std::time::Duration = std::time::Duration::from_secs(180);

/// Removes requests from a failing sequence while it still fails (chunks, then single ones),
/// within [`SHRINK_BUDGET`].
async fn shrink(backend: &str, version: Version, mut ops: Vec<Op>, first: Difference) -> (Vec<Op>, Difference) {
    let started = std::time::Instant::now();
    let mut diff = first;
    if !diff.watch {
        ops.truncate(diff.at + 1);
    }
    let mut chunk = ops.len() / 2;
    while chunk >= 1 {
        let mut start = 0;
        while start < ops.len() {
            if started.elapsed() > SHRINK_BUDGET {
                return (ops, diff);
            }
            let mut candidate: Vec<Op> =
                ops[..start].iter().chain(ops[(start + chunk).min(ops.len())..].iter()).cloned().collect();
            if candidate.is_empty() {
                start += chunk;
                continue;
            }
            match run(backend, version, &mut candidate, None).await {
                Err(d) => {
                    ops = candidate;
                    diff = d;
                }
                Ok(()) => start += chunk,
            }
        }
        chunk /= 2;
    }
    (ops, diff)
}

/// The lines where two answers differ, with three lines of context.
fn differing_lines(a: &str, b: &str) -> (String, String) {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let first = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let same_tail = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
    let cut = |lines: &[&str]| {
        let from = first.saturating_sub(3);
        let to = (lines.len().saturating_sub(same_tail) + 3).clamp(from, lines.len());
        lines[from..to].join("\n")
    };
    (cut(&a), cut(&b))
}

async fn differential(backend: &str, version: Version) {
    let seeds: Vec<u64> = match std::env::var("KINE_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("KINE_DIFF_SEED is a number")],
        Err(_) => {
            let base = env("KINE_DIFF_BASE", 1);
            let n = env("KINE_DIFF_SEEDS", 10);
            let n = if version == Version::V3_6 { (n / 3).max(2) } else { n };
            (base..base + n).collect()
        }
    };
    let n = env("KINE_DIFF_OPS", 250) as usize;
    for seed in seeds {
        let mut ops = Vec::new();
        if let Err(first) = run(backend, version, &mut ops, Some((Gen::new(seed), n))).await {
            let (etcd, kine) = differing_lines(&first.etcd, &first.kine);
            eprintln!(
                "difference on {backend} against etcd {}, seed {seed}, request {}: {:?}\netcd:\n{etcd}\nkine-rs:\n{kine}\nshrinking…",
                version.emulated(),
                first.at,
                ops[first.at]
            );
            let at = first.at;
            let (ops, diff) = shrink(backend, version, ops, first).await;
            let listing: Vec<String> = ops.iter().enumerate().map(|(i, op)| format!("{i}: {op:?}")).collect();
            let (etcd, kine) = differing_lines(&diff.etcd, &diff.kine);
            panic!(
                "etcd {} and kine-rs ({backend}) differ: seed {seed} (KINE_DIFF_SEED={seed}), first at request {at}.\n\
                 Shortest sequence found ({} requests), differing at request {}:\n{}\n\n\
                 etcd answered (the differing part):\n{etcd}\n\nkine-rs answered:\n{kine}",
                version.emulated(),
                ops.len(),
                diff.at,
                listing.join("\n"),
            );
        }
        eprintln!("{backend} against etcd {}: seed {seed}: {n} requests, no difference", version.emulated());
    }
}

/// One test per backend and etcd version.
macro_rules! differential_tests {
    ($($name:ident: $backend:literal, $version:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                differential($backend, $version).await;
            }
        )*
    };
}

differential_tests! {
    same_answers_as_etcd_3_7_on_sqlite: "sqlite", Version::V3_7;
    same_answers_as_etcd_3_7_on_memory: "memory", Version::V3_7;
    same_answers_as_etcd_3_7_on_nats: "nats", Version::V3_7;
    same_answers_as_etcd_3_7_on_postgres: "postgres", Version::V3_7;
    same_answers_as_etcd_3_7_on_mysql: "mysql", Version::V3_7;
    same_answers_as_etcd_3_6_on_sqlite: "sqlite", Version::V3_6;
    same_answers_as_etcd_3_6_on_memory: "memory", Version::V3_6;
    same_answers_as_etcd_3_6_on_nats: "nats", Version::V3_6;
    same_answers_as_etcd_3_6_on_postgres: "postgres", Version::V3_6;
    same_answers_as_etcd_3_6_on_mysql: "mysql", Version::V3_6;
}

#[cfg(feature = "embedded-nats")]
differential_tests! {
    same_answers_as_etcd_3_7_on_embedded_nats: "nats-embedded", Version::V3_7;
    same_answers_as_etcd_3_6_on_embedded_nats: "nats-embedded", Version::V3_6;
}
