//! `kine-rs-bench`: drives any etcd v3 endpoint (kine-rs, etcd, Go kine) with one workload for
//! a fixed time and prints one report line: throughput, latency percentiles and, with
//! `--server-pid`, the server's CPU time and peak memory during the run.
//!
//! ```text
//! kine-rs-bench --endpoint http://127.0.0.1:2379 --workload get --clients 16 --keys 100000
//! kine-rs-bench --endpoint http://127.0.0.1:2379 --workload list --shape k8s --keys 10000
//! kine-rs-bench --endpoint http://127.0.0.1:2379 --workload watch --watchers 1000 --clients 10
//! kine-rs-bench --endpoint http://127.0.0.1:2379 --workload watch --watch-on key --watchers 10000 --clients 100 --rate 1000 --slow-clients 10
//! kine-rs-bench --endpoint http://COPY --write-endpoint http://ORIGIN --workload watch --rate 2000
//! kine-rs-bench --endpoint http://COPY --write-endpoint http://ORIGIN --workload failover --origin-pid PID
//! kine-rs-bench --endpoint http://127.0.0.1:2379 --workload compaction --keys 100000 --events 1000000 --clients 16 --seconds 1800
//! ```
//! Workloads that read preloaded keys (`get`, `cas`, `list`, `count`) first make sure that
//! `--keys` keys of the shape's key space exist (a larger count extends a smaller one).

mod compaction;
mod failover;
mod keys;
mod replay;
mod server;
mod stats;
mod watch;
mod workload;

use anyhow::{Context as _, Result, ensure};
use clap::{Parser, ValueEnum};
use keys::Shape;
use stats::Stats;
use std::time::{Duration, Instant};
use workload::Params;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Make sure the preloaded keys exist, and nothing else.
    Load,
    /// Puts of new keys (flat shape only: etcd's benchmark).
    Put,
    /// Creates of new keys: a Txn putting only if the key's mod revision is 0 (kube-apiserver's create).
    Create,
    /// Gets of random preloaded keys.
    Get,
    /// Get + conditional update (kube-apiserver's optimistic update) of random preloaded keys.
    Cas,
    /// Deletes of `--keys` keys made before the clock starts: a get, then a Txn deleting only
    /// if the key's mod revision is the one read (kube-apiserver's delete); the run ends when
    /// they are gone or at `--seconds`.
    Delete,
    /// Pages of `--limit` keys of the preloaded prefix.
    List,
    /// Counts of the preloaded prefix.
    Count,
    /// The whole preloaded prefix in pages of `--limit` (kube-apiserver without RangeStream);
    /// an operation is a whole list.
    ListAll,
    /// The whole preloaded prefix through one RangeStream (etcd 3.7); an operation is a whole
    /// list.
    StreamAll,
    /// Watch progress requests, each client on one watch stream with one watch, each request
    /// waiting for its answer: what kube-apiserver asks before it serves a consistent list from
    /// its watch cache (an operation is a request and its progress notification).
    Progress,
    /// `--watchers` watches (on a prefix, or each on its own key: `--watch-on`) and writers at
    /// `--rate` puts/s; reports event delivery: ops = events delivered, latency = delivery
    /// latency; events not delivered 5 s after the last put count as errors (flat shape only).
    /// With `--write-endpoint`, the puts go there (a read-only copy's origin) and the report
    /// adds how many revisions behind the writers each event arrived. With `--slow-clients`,
    /// that many connections do not read until the writers stop; their events are reported
    /// apart (slow_events, slow_missed).
    Watch,
    /// A read-only copy's failover: `--writers` put new keys on `--write-endpoint` (the origin)
    /// at `--rate` for `--seconds`, then `--origin-pid` is killed and the copy (`--endpoint`)
    /// promoted; reports the time to the promotion and to its first write, and the
    /// acknowledged writes it lost.
    Failover,
    /// `--events` updates over `--keys` keys, then watches from the first of them on the
    /// prefix (with previous values) until every event arrived: a reflector resuming from an
    /// old revision; an operation is a whole replay, `items` the events (flat shape only).
    Replay,
    /// `--keys` keys and `--events` updates of them round-robin (`--events` superseded
    /// versions; untimed), then `--clients` writers putting new keys, and after 2 s a physical
    /// compaction at the last revision of that history; the writers stop 2 s after it returned
    /// (or at `--seconds`: the compaction is then reported unfinished, and the run fails).
    /// Reports the compaction's time and the latency of the writes that overlapped it against
    /// the 2 s before (flat shape only).
    Compaction,
}

/// The name clap gives a value on the command line (`k8s`, `cas`).
fn name(v: impl ValueEnum) -> String {
    v.to_possible_value().expect("no skipped values").get_name().to_string()
}

impl Workload {
    /// Whether the workload reads the preloaded key space.
    fn reads_keys(self) -> bool {
        matches!(
            self,
            Workload::Load
                | Workload::Get
                | Workload::Cas
                | Workload::List
                | Workload::Count
                | Workload::ListAll
                | Workload::StreamAll
        )
    }
}

#[derive(Parser, Debug)]
#[command(version, about = "Load generator for etcd v3 endpoints (kine-rs, etcd, Go kine)")]
struct Args {
    /// The etcd endpoint (`http://host:port`).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    endpoint: String,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Key space and values: `flat` (`/bench/k/<i>`, `--value-bytes`) or `k8s` (pods under
    /// `/registry/pods/<ns>/`, values of 1–4 KiB).
    #[arg(long, value_enum, default_value = "flat")]
    shape: Shape,
    /// Concurrent clients (each its own gRPC connection); for `watch`, the connections the
    /// watches are spread over.
    #[arg(long, default_value_t = 1)]
    clients: u64,
    /// How long the workload runs, seconds (`compaction`: its measure at most).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Preloaded keys that reads and updates pick from.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Value size: of the flat shape and every flat-only workload 256 by default; the k8s
    /// shape's values are of 1–4 KiB unless this fixes their size (pseudo-random bytes either
    /// way: a large store of smaller objects fits the disk).
    #[arg(long)]
    value_bytes: Option<usize>,
    /// Page size of `list`.
    #[arg(long, default_value_t = 500)]
    limit: i64,
    /// Serializable reads instead of linearizable ones.
    #[arg(long)]
    serializable: bool,
    /// `watch`: watches on the prefix.
    #[arg(long, default_value_t = 100)]
    watchers: u64,
    /// `watch`: puts per second of the writer.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// `watch`: every watch on one prefix (each event reaches all) or each on a key of its own
    /// (each event reaches one).
    #[arg(long, value_enum, default_value = "prefix")]
    watch_on: watch::On,
    /// `watch`: connections that stop reading while the writers write.
    #[arg(long, default_value_t = 0)]
    slow_clients: u64,
    /// `watch` and `failover`: where the writers write (a read-only copy's origin); `--endpoint`
    /// by default.
    #[arg(long)]
    write_endpoint: Option<String>,
    /// `watch` and `failover`: writer connections sharing `--rate`.
    #[arg(long, default_value_t = 1)]
    writers: u64,
    /// `replay`: the events written, then replayed; `compaction`: the updates written, then
    /// compacted.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// `failover`: the origin's process, killed with SIGKILL after `--seconds`.
    #[arg(long)]
    origin_pid: Option<u32>,
    /// The server's process id: its CPU time and peak RSS during the run are reported.
    #[arg(long)]
    server_pid: Option<u32>,
    /// A name for the system under test, printed first in the report line.
    #[arg(long, default_value = "")]
    label: String,
}

impl Args {
    /// The value size of the flat-only workloads.
    fn flat_bytes(&self) -> usize {
        self.value_bytes.unwrap_or(keys::FLAT_VALUE_BYTES)
    }

    /// Refuses combinations that would measure nothing or something else than asked.
    fn check(&self) -> Result<()> {
        ensure!(self.clients > 0, "--clients must be at least 1");
        ensure!(self.seconds > 0.0 && self.seconds.is_finite(), "--seconds must be a number more than 0");
        if self.workload.reads_keys() {
            ensure!(self.keys > 0, "--keys must be at least 1 for {}", name(self.workload));
            ensure!(
                self.keys <= self.shape.max_keys(),
                "--keys must be at most {} with --shape {}",
                self.shape.max_keys(),
                name(self.shape)
            );
        }
        ensure!(self.limit > 0 || self.workload != Workload::List, "--limit must be at least 1");
        if matches!(
            self.workload,
            Workload::Put | Workload::Watch | Workload::Failover | Workload::Replay | Workload::Compaction
        ) {
            ensure!(
                self.shape == Shape::Flat,
                "--shape {} does not apply to {} (use create for Kubernetes-shaped writes)",
                name(self.shape),
                name(self.workload)
            );
        }
        if matches!(self.workload, Workload::Watch | Workload::Failover) {
            ensure!(self.rate > 0, "--rate must be at least 1 put per second");
            ensure!(self.writers > 0 && self.writers <= self.rate, "--writers must be from 1 to --rate");
        }
        if self.workload == Workload::Failover {
            ensure!(self.write_endpoint.is_some(), "failover needs --write-endpoint (the origin)");
            ensure!(self.origin_pid.is_some(), "failover needs --origin-pid (the origin's process, killed)");
        }
        if self.workload == Workload::Delete {
            ensure!(self.keys > 0, "--keys must be at least 1 for delete (the keys it creates, then deletes)");
        }
        if self.workload == Workload::Replay {
            ensure!(self.events > 0 && self.keys > 0, "replay needs --events and --keys of at least 1");
        }
        if self.workload == Workload::Compaction {
            ensure!(self.events > 0 && self.keys > 0, "compaction needs --events and --keys of at least 1");
            ensure!(self.keys <= Shape::Flat.max_keys(), "--keys must be at most {}", Shape::Flat.max_keys());
            ensure!(
                self.seconds > compaction::BASELINE.as_secs_f64(),
                "--seconds must be more than {} for compaction (its writes before the compaction)",
                compaction::BASELINE.as_secs()
            );
        }
        if self.workload == Workload::Watch {
            ensure!(self.watchers > 0, "--watchers must be at least 1");
            ensure!(self.watchers >= self.clients, "--watchers must be at least --clients (each connection watches)");
            ensure!(
                self.slow_clients < self.clients,
                "--slow-clients must be fewer than --clients (someone must read)"
            );
        } else {
            ensure!(self.slow_clients == 0, "--slow-clients applies to watch only");
            ensure!(self.watch_on == watch::On::Prefix, "--watch-on applies to watch only");
        }
        Ok(())
    }
}

async fn connect(endpoint: &str) -> Result<etcd_client::Client> {
    etcd_client::Client::connect([endpoint], None).await.with_context(|| format!("connect to {endpoint}"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    args.check()?;
    let params = Params {
        shape: args.shape,
        keys: args.keys,
        value_bytes: args.value_bytes,
        limit: args.limit,
        serializable: args.serializable,
        run: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64,
    };
    let first = connect(&args.endpoint).await?;
    if args.workload.reads_keys() {
        let started = Instant::now();
        let written = workload::preload(&first, 64, &params).await?;
        if written > 0 {
            eprintln!("preloaded {written} keys in {:.1} s", started.elapsed().as_secs_f64());
        }
        if args.workload == Workload::Load {
            return Ok(());
        }
    }
    if args.workload == Workload::Failover {
        let writers = writers(&args).await?;
        let pid = args.origin_pid.context("--origin-pid")?;
        let o = failover::run(first, writers, args.rate, args.flat_bytes(), args.seconds, pid).await?;
        println!(
            "label={} workload=failover rate={} writers={} acked={} lost={} origin_revision={} promoted_revision={} promoted_ms={:.0} first_write_ms={:.0}",
            if args.label.is_empty() { "-" } else { &args.label },
            args.rate,
            args.writers,
            o.acked,
            o.lost,
            o.origin_revision,
            o.promoted_revision,
            o.promoted.as_secs_f64() * 1000.0,
            o.first_write.as_secs_f64() * 1000.0
        );
        return Ok(());
    }
    if args.workload == Workload::Compaction {
        return compaction(&args, &params, first).await;
    }
    let history = if args.workload == Workload::Replay {
        let mut c = first.clone();
        Some(replay::write(&args.endpoint, &mut c, args.events, args.keys, args.flat_bytes(), params.run).await?)
    } else {
        None
    };
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(connect(&args.endpoint).await?);
    }
    if args.workload == Workload::Delete {
        let n = clients.len() as u64;
        let setup: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(id, c)| tokio::spawn(workload::delete_setup(c.clone(), id as u64, n, params.clone())))
            .collect();
        for t in setup {
            t.await??;
        }
    }
    // The peak resident memory reported is the run's own.
    if let Some(pid) = args.server_pid {
        server::reset_peak(pid);
    }
    let before = args.server_pid.map(server::usage).transpose()?;
    let rss_before = args.server_pid.and_then(server::rss_mib);
    let (mut stats, elapsed, extra) = if args.workload == Workload::Watch {
        let writers = writers(&args).await?;
        let layout = watch::Layout { watchers: args.watchers, on: args.watch_on, slow: args.slow_clients };
        let o =
            watch::run(clients, writers, layout, args.rate, args.flat_bytes(), args.seconds, args.server_pid).await?;
        let mut extra =
            format!(" watchers={} watch_on={} rate={} puts={}", args.watchers, name(args.watch_on), args.rate, o.puts);
        if args.slow_clients > 0 {
            extra.push_str(&format!(
                " slow_clients={} slow_events={} slow_missed={}",
                args.slow_clients, o.slow_delivered, o.slow_missed
            ));
        }
        if let (Some(with), Some(before)) = (o.rss_with_watches_mib, rss_before) {
            let per = (with - before) * 1024.0 / args.watchers as f64;
            extra.push_str(&format!(" server_rss_watches_mib={with:.1} server_kib_per_watcher={per:.2}"));
        }
        if args.write_endpoint.is_some() {
            let mut behind = o.behind;
            behind.sort_unstable();
            let at = |p: f64| {
                behind.get(((behind.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0)
            };
            extra.push_str(&format!(" behind_p50_revs={} behind_p99_revs={}", at(0.5), at(0.99)));
        }
        (o.stats, o.elapsed, extra)
    } else if let Some(history) = &history {
        let (mut stats, elapsed) = replay::run(&mut first.clone(), history, args.seconds).await?;
        let per_s = history.events as f64 / stats.percentile_ms(1.0).max(f64::MIN_POSITIVE) * 1000.0;
        (stats, elapsed, format!(" events={} slowest_events_per_s={per_s:.0}", history.events))
    } else {
        let (stats, elapsed) = run_clients(args.workload, clients, &params, args.seconds).await?;
        (stats, elapsed, String::new())
    };
    let after = args.server_pid.map(server::usage).transpose()?;
    let elapsed = elapsed.as_secs_f64();
    // One line of key=value fields; bench/summarize.py parses it.
    let mut line = format!(
        "label={} workload={} shape={} clients={} keys={} value_bytes={} seconds={elapsed:.1} ops={} ops_per_s={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} errors={} conflicts={}{extra}",
        if args.label.is_empty() { "-" } else { &args.label },
        name(args.workload),
        name(args.shape),
        args.clients,
        if args.workload.reads_keys() || matches!(args.workload, Workload::Replay | Workload::Delete) {
            args.keys
        } else {
            0
        },
        match (args.shape, args.value_bytes) {
            (Shape::K8s, None) => format!("{}-{}", keys::K8S_VALUE_BYTES.start(), keys::K8S_VALUE_BYTES.end()),
            _ => args.flat_bytes().to_string(),
        },
        stats.ops(),
        stats.ops() as f64 / elapsed,
        stats.percentile_ms(0.5),
        stats.percentile_ms(0.99),
        stats.percentile_ms(0.999),
        stats.errors,
        stats.conflicts,
    );
    if matches!(args.workload, Workload::ListAll | Workload::StreamAll | Workload::Replay) {
        line.push_str(&format!(" items={}", stats.items));
    }
    if let (Some(b), Some(a)) = (before, after) {
        let cpu_s = a.cpu_s - b.cpu_s;
        let per_op = if stats.ops() > 0 { cpu_s * 1000.0 / stats.ops() as f64 } else { f64::NAN };
        line.push_str(&format!(
            " server_cpu_s={cpu_s:.2} server_cpu_ms_per_op={per_op:.3} server_rss_before_mib={:.1} server_peak_rss_mib={:.1} server_rss_anon_mib={:.1}",
            rss_before.unwrap_or(f64::NAN),
            a.peak_rss_mib,
            a.rss_anon_mib
        ));
    }
    println!("{line}");
    ensure!(stats.ops() > 0, "no operation succeeded ({} errors)", stats.errors);
    Ok(())
}

/// The `compaction` workload: the history (untimed), then the measure with the server's usage
/// during it; one report line, and an error if the compaction failed or did not finish.
async fn compaction(args: &Args, params: &Params, first: etcd_client::Client) -> Result<()> {
    let target = compaction::write(&args.endpoint, args.keys, args.events, args.flat_bytes(), params.run).await?;
    if let Some(pid) = args.server_pid {
        server::reset_peak(pid);
    }
    let before = args.server_pid.map(server::usage).transpose()?;
    let rss_before = args.server_pid.and_then(server::rss_mib);
    let o = compaction::run(&args.endpoint, first, args.clients, target, args.flat_bytes(), params.run, args.seconds)
        .await?;
    let after = args.server_pid.map(server::usage).transpose()?;
    let mut line = format!(
        "label={} workload=compaction shape=flat clients={} keys={} value_bytes={} superseded={} {}",
        if args.label.is_empty() { "-" } else { &args.label },
        args.clients,
        args.keys,
        args.flat_bytes(),
        args.events,
        o.fields()
    );
    if let (Some(b), Some(a)) = (before, after) {
        line.push_str(&format!(
            " server_cpu_s={:.2} server_rss_before_mib={:.1} server_peak_rss_mib={:.1} server_rss_anon_mib={:.1}",
            a.cpu_s - b.cpu_s,
            rss_before.unwrap_or(f64::NAN),
            a.peak_rss_mib,
            a.rss_anon_mib
        ));
    }
    println!("{line}");
    o.error().map_or(Ok(()), |e| Err(anyhow::anyhow!(e)))
}

/// The writer connections of `watch` and `failover`.
async fn writers(args: &Args) -> Result<Vec<etcd_client::Client>> {
    let endpoint = args.write_endpoint.as_deref().unwrap_or(&args.endpoint);
    let mut writers = Vec::new();
    for _ in 0..args.writers {
        writers.push(connect(endpoint).await?);
    }
    Ok(writers)
}

/// Runs a request/response workload on every client until `seconds` have passed.
async fn run_clients(
    workload: Workload,
    clients: Vec<etcd_client::Client>,
    params: &Params,
    seconds: f64,
) -> Result<(Stats, Duration)> {
    let count = clients.len() as u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for (id, c) in clients.into_iter().enumerate() {
        let (p, id) = (params.clone(), id as u64);
        tasks.push(match workload {
            Workload::Put => tokio::spawn(workload::put(c, id, p, deadline)),
            Workload::Create => tokio::spawn(workload::create(c, id, p, deadline)),
            Workload::Get => tokio::spawn(workload::get(c, id, p, deadline)),
            Workload::Cas => tokio::spawn(workload::cas(c, id, p, deadline)),
            Workload::Delete => tokio::spawn(workload::delete(c, id, count, p, deadline)),
            Workload::List => tokio::spawn(workload::list(c, id, p, deadline)),
            Workload::Count => tokio::spawn(workload::count(c, id, p, deadline)),
            Workload::ListAll => tokio::spawn(workload::list_all(c, id, p, deadline)),
            Workload::StreamAll => tokio::spawn(workload::stream_all(c, id, p, deadline)),
            Workload::Progress => tokio::spawn(workload::progress(c, id, deadline)),
            Workload::Load | Workload::Watch | Workload::Failover | Workload::Replay | Workload::Compaction => {
                unreachable!("handled by the caller")
            }
        });
    }
    let mut stats = Stats::default();
    for t in tasks {
        stats.merge(t.await?);
    }
    Ok((stats, started.elapsed()))
}
