//! Watch replay: a watch that starts at an old revision and must first deliver the history
//! since then, as a reflector or an etcd client resuming after a restart does (`etcdctl watch
//! --rev`). `--events` updates are written first, spread over `--keys` keys (so each key has
//! events / keys versions: a long history per key, as Kubernetes objects updated for a while
//! have), by 64 connections (each key by one of them); then, until `--seconds` have passed (at least once), one watch on
//! the prefix from the first of those revisions, with previous values as kube-apiserver asks,
//! receives every one of them. An operation is a whole replay; its latency is the replay's time.

use crate::stats::Stats;
use anyhow::{Context as _, Result, ensure};
use etcd_client::{Client, WatchOptions};
use std::time::{Duration, Instant};

/// Connections writing the history.
const WRITERS: u64 = 64;

/// How long one replay may take before the run fails.
const LIMIT: Duration = Duration::from_secs(600);

/// The history written: where, from which revision, how many events.
pub struct History {
    prefix: String,
    from: i64,
    pub events: u64,
}

/// Writes `events` updates over `keys` keys under a prefix of this run.
pub async fn write(
    endpoint: &str,
    client: &mut Client,
    events: u64,
    keys: u64,
    value_bytes: usize,
    run: u64,
) -> Result<History> {
    let prefix = format!("/bench/replay/{run}/");
    let before = client.get("/bench/replay/", None).await?.header().context("no header")?.revision();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut c = Client::connect([endpoint], None).await.with_context(|| format!("connect to {endpoint}"))?;
        let (prefix, value) = (prefix.clone(), "x".repeat(value_bytes));
        tasks.push(tokio::spawn(async move {
            // Event i updates key i % keys; each key has one writer (Go kine fails puts of one
            // key from several connections at once with "required revision is a future
            // revision").
            for i in (0..events).filter(|i| (i % keys) % WRITERS == w) {
                c.put(format!("{prefix}{:08}", i % keys), value.as_str(), None).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    eprintln!("wrote {events} events over {keys} keys in {:.1} s", started.elapsed().as_secs_f64());
    Ok(History { prefix, from: before + 1, events })
}

/// Replays `history` with one watch at a time until `seconds` have passed (at least once):
/// one latency per replay, the events delivered in `items`.
pub async fn run(client: &mut Client, history: &History, seconds: f64) -> Result<(Stats, Duration)> {
    let History { prefix, from, events } = history;
    let events = *events;
    let mut stats = Stats::default();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    while stats.ops() == 0 || Instant::now() < deadline {
        let t = Instant::now();
        let seen = tokio::time::timeout(LIMIT, replay(client, prefix, *from, events))
            .await
            .with_context(|| format!("a replay of {events} events took more than {} s", LIMIT.as_secs()))??;
        ensure!(seen == events, "the replay delivered {seen} events, {events} were written");
        stats.record(t.elapsed());
        stats.items += seen;
    }
    Ok((stats, started.elapsed()))
}

/// One watch from `from` on `prefix` until `events` events have arrived; returns how many did.
async fn replay(client: &mut Client, prefix: &str, from: i64, events: u64) -> Result<u64> {
    let options = WatchOptions::new().with_prefix().with_start_revision(from).with_prev_key();
    // Dropped at the end: the stream and its one watch end with it.
    let mut stream = client.watch(prefix, Some(options)).await?;
    let mut seen = 0;
    while seen < events {
        let m = stream.message().await?.context("the watch ended early")?;
        ensure!(!m.canceled(), "the watch was canceled: {}", m.cancel_reason());
        seen += m.events().len() as u64;
    }
    Ok(seen)
}
