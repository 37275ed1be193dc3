//! `kine-rs-bench`: drives any etcd v3 endpoint (kine-rs, etcd, Go kine) with one workload for
//! a fixed time and prints one report line: throughput, latency percentiles and, with
//! `--server-pid`, the server's CPU time and peak memory during the run.
//!
//! ```text
//! kine-rs-bench --endpoint http://127.0.0.1:2379 --workload get --clients 16 --keys 100000
//! ```
//! Workloads that read preloaded keys (`get`, `cas`, `list`, `count`) first make sure that
//! `--keys` keys exist under `/bench/k/` (a larger count extends a smaller one).

mod server;
mod stats;
mod workload;

use anyhow::{Context as _, Result};
use clap::{Parser, ValueEnum};
use stats::Stats;
use std::time::{Duration, Instant};
use workload::Params;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Make sure the preloaded keys exist, and nothing else.
    Load,
    /// Puts of new keys.
    Put,
    /// Gets of random preloaded keys.
    Get,
    /// Get + conditional update (kube-apiserver's optimistic update) of random preloaded keys.
    Cas,
    /// Pages of `--limit` keys of the preloaded prefix.
    List,
    /// Counts of the preloaded prefix.
    Count,
}

#[derive(Parser, Debug)]
#[command(version, about = "Load generator for etcd v3 endpoints (kine-rs, etcd, Go kine)")]
struct Args {
    /// The etcd endpoint (`http://host:port`).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    endpoint: String,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Concurrent clients (each its own gRPC connection).
    #[arg(long, default_value_t = 1)]
    clients: u64,
    /// How long the workload runs, seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Preloaded keys that reads and updates pick from.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Page size of `list`.
    #[arg(long, default_value_t = 500)]
    limit: i64,
    /// Serializable reads instead of linearizable ones.
    #[arg(long)]
    serializable: bool,
    /// The server's process id: its CPU time and peak RSS during the run are reported.
    #[arg(long)]
    server_pid: Option<u32>,
    /// A name for the system under test, printed first in the report line.
    #[arg(long, default_value = "")]
    label: String,
}

async fn connect(endpoint: &str) -> Result<etcd_client::Client> {
    etcd_client::Client::connect([endpoint], None).await.with_context(|| format!("connect to {endpoint}"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be more than 0");
    let params =
        Params { keys: args.keys, value_bytes: args.value_bytes, limit: args.limit, serializable: args.serializable };
    let first = connect(&args.endpoint).await?;
    if args.workload != Workload::Put {
        let started = Instant::now();
        let written = workload::preload(&first, 64, &params).await?;
        if written > 0 {
            eprintln!("preloaded {written} keys in {:.1} s", started.elapsed().as_secs_f64());
        }
        if args.workload == Workload::Load {
            return Ok(());
        }
    }
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        clients.push(connect(&args.endpoint).await?);
    }
    let before = args.server_pid.map(server::usage).transpose()?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let mut tasks = Vec::new();
    for (id, c) in clients.into_iter().enumerate() {
        let (p, id) = (params.clone(), id as u64);
        tasks.push(match args.workload {
            Workload::Put => tokio::spawn(workload::put(c, id, p, deadline)),
            Workload::Get => tokio::spawn(workload::get(c, id, p, deadline)),
            Workload::Cas => tokio::spawn(workload::cas(c, id, p, deadline)),
            Workload::List => tokio::spawn(workload::list(c, id, p, deadline)),
            Workload::Count => tokio::spawn(workload::count(c, id, p, deadline)),
            Workload::Load => unreachable!("handled above"),
        });
    }
    let mut stats = Stats::default();
    for t in tasks {
        stats.merge(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = args.server_pid.map(server::usage).transpose()?;
    let mut line = format!(
        "label={} workload={} clients={} keys={} value_bytes={} seconds={elapsed:.1} ops={} ops_per_s={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} errors={} conflicts={}",
        if args.label.is_empty() { "-" } else { &args.label },
        format!("{:?}", args.workload).to_lowercase(),
        args.clients,
        args.keys,
        args.value_bytes,
        stats.ops(),
        stats.ops() as f64 / elapsed,
        stats.percentile_ms(0.5),
        stats.percentile_ms(0.99),
        stats.percentile_ms(0.999),
        stats.errors,
        stats.conflicts,
    );
    if let (Some(b), Some(a)) = (before, after) {
        line.push_str(&format!(
            " server_cpu_s={:.2} server_cpu_ms_per_op={:.3} server_peak_rss_mib={:.1}",
            a.cpu_s - b.cpu_s,
            (a.cpu_s - b.cpu_s) * 1000.0 / stats.ops().max(1) as f64,
            a.peak_rss_mib
        ));
    }
    println!("{line}");
    anyhow::ensure!(stats.ops() > 0, "no operation succeeded ({} errors)", stats.errors);
    Ok(())
}
