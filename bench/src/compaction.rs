//! Compaction stall: how long a physical compaction of a long history takes, and what it does
//! to the writes made meanwhile (kube-apiserver compacts every 5 minutes while clients write).
//! First, untimed, 64 connections put `--keys` keys, then `--events` updates of them
//! round-robin, so that `--events` versions are superseded. Then `--clients` writers put new
//! keys of their own (they never supersede anything compacted); after a baseline of 2 s, one
//! more connection asks for a physical compaction at the last revision of that history, and
//! the writers go on until 2 s after it returned (or until `--seconds`). The report sets the
//! writes that overlapped the compaction against those of the baseline.

use crate::connect;
use crate::keys::Shape;
use crate::stats::Stats;
use anyhow::{Context as _, Result};
use etcd_client::{Client, CompactionOptions};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections writing the history.
const HISTORY_WRITERS: u64 = 64;
/// Writing before the compaction is asked for, and after it returned.
pub const BASELINE: Duration = Duration::from_secs(2);
/// How often the writing of the history reports its progress.
const PROGRESS: Duration = Duration::from_secs(10);
/// How long the writers may take to finish their last write once told to stop.
const GRACE: Duration = Duration::from_secs(60);

/// The puts of history writer `w` in order, as (key, iteration): put `j` of the history writes
/// key `j % keys` for the `j / keys`-th time (iteration 0 creates it). Each key has one writer
/// (Go kine fails puts of one key from several connections at once), which writes its
/// versions in order.
fn history_puts(w: u64, keys: u64, events: u64) -> impl Iterator<Item = (u64, u64)> {
    let total = keys + events;
    (0..=events.div_ceil(keys)).flat_map(move |round| {
        (w..keys)
            .step_by(HISTORY_WRITERS as usize)
            .take_while(move |k| round * keys + k < total)
            .map(move |k| (k, round))
    })
}

/// Writes the history under a prefix of this run; returns the highest revision seen, the one
/// to compact at.
pub async fn write(endpoint: &str, keys: u64, events: u64, value_bytes: usize, run: u64) -> Result<i64> {
    let total = keys + events;
    let (written, target) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicI64::new(0)));
    let started = Instant::now();
    let progress = tokio::spawn({
        let written = written.clone();
        async move {
            let mut tick = tokio::time::interval_at((started + PROGRESS).into(), PROGRESS);
            loop {
                tick.tick().await;
                let (n, s) = (written.load(Ordering::Relaxed), started.elapsed().as_secs_f64());
                eprintln!("compaction history: {n}/{total} puts in {s:.0} s ({:.0} puts/s)", n as f64 / s);
            }
        }
    });
    let mut tasks = Vec::new();
    for w in 0..HISTORY_WRITERS.min(keys) {
        let mut c = connect(endpoint).await?;
        let (written, target) = (written.clone(), target.clone());
        tasks.push(tokio::spawn(async move {
            for (k, iteration) in history_puts(w, keys, events) {
                let key = format!("/bench/c/{run:x}/{k:09}");
                let value = Shape::Flat.value(Some(value_bytes), k, iteration);
                let r = c.put(key.as_str(), value, None).await.with_context(|| format!("put {key}"))?;
                target.fetch_max(r.header().context("a put answer without header")?.revision(), Ordering::Relaxed);
                written.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let done = async {
        for t in tasks {
            t.await??;
        }
        anyhow::Ok(())
    }
    .await;
    progress.abort();
    done?;
    let target = target.load(Ordering::Relaxed);
    eprintln!(
        "compaction history: {total} puts ({events} superseding) up to revision {target} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(target)
}

/// One write of the measure: when it started (from the measure's start) and how long it took.
#[derive(Clone, Copy, Debug)]
struct Write {
    start: Duration,
    latency: Duration,
}

impl Write {
    /// Whether the write started or was in flight at some time in `[from, to]`.
    fn overlaps(&self, from: Duration, to: Duration) -> bool {
        self.start <= to && self.start + self.latency >= from
    }
}

/// The latencies of the writes that `keep` selects.
fn select(writes: &[Write], keep: impl Fn(&Write) -> bool) -> Stats {
    let mut stats = Stats::default();
    writes.iter().filter(|w| keep(w)).for_each(|w| stats.record(w.latency));
    stats
}

/// What the writers share: the start, when they stop, and what they measured.
struct Shared {
    started: Instant,
    /// When the writers stop, in nanoseconds from `started`.
    stop: AtomicU64,
    writes: Mutex<Vec<Write>>,
    errors: AtomicU64,
}

/// What the measure saw.
pub struct Outcome {
    target: i64,
    /// When the compaction was asked for and when it answered, from the start.
    from: Duration,
    to: Duration,
    /// A compaction that did not end well: `failed` or `unfinished` (at `--seconds`), and why.
    failure: Option<(&'static str, String)>,
    writes: Vec<Write>,
    errors: u64,
    elapsed: Duration,
}

impl Outcome {
    /// The error to exit with: the compaction did not end well, or no write succeeded.
    pub fn error(&self) -> Option<String> {
        let none = self.writes.is_empty().then(|| "no write succeeded during the measure".to_string());
        self.failure.as_ref().map(|(_, why)| why.clone()).or(none)
    }

    /// The report's fields: the compaction, the writes during it and those of the baseline.
    pub fn fields(&self) -> String {
        let (from, to) = (self.from, self.to);
        let mut during = select(&self.writes, |w| w.overlaps(from, to));
        let mut before = select(&self.writes, |w| w.start + w.latency < from && w.start + BASELINE >= from);
        let compaction_ms = match &self.failure {
            None => format!("{:.0}", (to - from).as_secs_f64() * 1000.0),
            Some((what, _)) => what.to_string(),
        };
        format!(
            "compact_revision={} compaction_ms={compaction_ms} seconds={:.1} ops={} during_ops={} during_p50_ms={:.3} during_p99_ms={:.3} during_p999_ms={:.3} during_max_ms={:.3} before_ops={} before_p99_ms={:.3} before_max_ms={:.3} errors={}",
            self.target,
            self.elapsed.as_secs_f64(),
            self.writes.len(),
            during.ops(),
            during.percentile_ms(0.5),
            during.percentile_ms(0.99),
            during.percentile_ms(0.999),
            during.percentile_ms(1.0),
            before.ops(),
            before.percentile_ms(0.99),
            before.percentile_ms(1.0),
            self.errors,
        ) + &self.stalls(from, to)
    }

    /// Where the stalls were: the writes during the compaction that took over 100 ms, and when
    /// the slowest one started, in seconds from the compaction's start (negative: before it).
    fn stalls(&self, from: Duration, to: Duration) -> String {
        let during: Vec<&Write> = self.writes.iter().filter(|w| w.overlaps(from, to)).collect();
        let over = during.iter().filter(|w| w.latency > Duration::from_millis(100)).count();
        let at = during.iter().max_by_key(|w| w.latency).map_or(0.0, |w| w.start.as_secs_f64() - from.as_secs_f64());
        format!(" during_over_100ms={over} during_max_at_s={at:.2}")
    }
}

/// The measure: `clients` writers, and after the baseline `compactor` compacting at `target`.
pub async fn run(
    endpoint: &str,
    mut compactor: Client,
    clients: u64,
    target: i64,
    value_bytes: usize,
    run: u64,
    seconds: f64,
) -> Result<Outcome> {
    let mut connections = Vec::new();
    for _ in 0..clients {
        connections.push(connect(endpoint).await?);
    }
    let limit = Duration::from_secs_f64(seconds);
    let shared = Arc::new(Shared {
        started: Instant::now(),
        stop: AtomicU64::new(limit.as_nanos() as u64),
        writes: Mutex::new(Vec::new()),
        errors: AtomicU64::new(0),
    });
    let tasks: Vec<_> = connections
        .into_iter()
        .zip(0..)
        .map(|(c, id)| tokio::spawn(writer(c, id, run, value_bytes, shared.clone())))
        .collect();
    tokio::time::sleep_until((shared.started + BASELINE).into()).await;
    let from = shared.started.elapsed();
    let compact = compactor.compact(target, Some(CompactionOptions::new().with_physical()));
    let answer = tokio::time::timeout(limit.saturating_sub(from), compact).await;
    let to = shared.started.elapsed();
    let failure = match answer {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(("failed", format!("the compaction at revision {target} failed: {e}"))),
        Err(_) => Some((
            "unfinished",
            format!("the compaction at revision {target} had not returned within --seconds ({seconds} s)"),
        )),
    };
    let stop = if failure.is_none() { (to + BASELINE).min(limit) } else { to };
    shared.stop.store(stop.as_nanos() as u64, Ordering::Relaxed);
    let mut stuck = 0;
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout_at((shared.started + stop + GRACE).into(), t).await.is_err() {
            abort.abort();
            stuck += 1;
        }
    }
    if stuck > 0 {
        eprintln!("{stuck} writes still in flight {} s after the end: counted as errors", GRACE.as_secs());
    }
    let elapsed = shared.started.elapsed();
    let writes = std::mem::take(&mut *shared.writes.lock().expect("a writer panicked"));
    let errors = shared.errors.load(Ordering::Relaxed) + stuck;
    Ok(Outcome { target, from, to, failure, writes, errors, elapsed })
}

/// Puts of new keys of this writer until told to stop, each one's start and latency recorded.
async fn writer(mut c: Client, id: u64, run: u64, value_bytes: usize, shared: Arc<Shared>) {
    let mut n = 0;
    while shared.started.elapsed() < Duration::from_nanos(shared.stop.load(Ordering::Relaxed)) {
        let (key, value) = (format!("/bench/cw/{run:x}/{id}/{n:09}"), Shape::Flat.value(Some(value_bytes), n, id));
        let start = shared.started.elapsed();
        match c.put(key, value, None).await {
            Ok(_) => {
                let latency = shared.started.elapsed() - start;
                shared.writes.lock().expect("a writer panicked").push(Write { start, latency });
            }
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_puts_write_every_version_once_in_order() {
        for (keys, events) in [(1, 5), (10, 25), (100, 1), (200, 1000)] {
            let mut seen = vec![Vec::new(); keys as usize];
            for w in 0..HISTORY_WRITERS {
                for (k, iteration) in history_puts(w, keys, events) {
                    assert_eq!(k % HISTORY_WRITERS, w, "key {k} written by {w}");
                    seen[k as usize].push(iteration);
                }
            }
            let puts: usize = seen.iter().map(Vec::len).sum();
            assert_eq!(puts as u64, keys + events, "{keys} keys, {events} events");
            for versions in &seen {
                assert!(versions.iter().copied().eq(0..versions.len() as u64), "{versions:?}");
            }
        }
    }

    #[test]
    fn writes_in_flight_at_the_window_count_as_during() {
        let ms = Duration::from_millis;
        let w = |start, latency| Write { start: ms(start), latency: ms(latency) };
        let (from, to) = (ms(2000), ms(3000));
        assert!(w(1990, 20).overlaps(from, to), "in flight when the compaction started");
        assert!(w(2500, 1).overlaps(from, to) && w(2999, 5000).overlaps(from, to));
        assert!(w(1000, 1000).overlaps(from, to) && w(3000, 1).overlaps(from, to), "the window is closed");
        assert!(!w(1000, 999).overlaps(from, to) && !w(3001, 1).overlaps(from, to));
    }

    #[test]
    fn the_report_sets_the_writes_during_against_the_baseline() {
        let ms = Duration::from_millis;
        // 1000 writes of 1..=1000 ms during [2 s, 5 s], 100 of 3 ms before, 10 of 9 s after.
        let mut writes: Vec<Write> = (1..=1000).map(|i| Write { start: ms(2000 + i), latency: ms(i) }).collect();
        writes.extend((0..100).map(|i| Write { start: ms(i * 19), latency: ms(3) }));
        writes.extend((0..10).map(|_| Write { start: ms(5001), latency: ms(9000) }));
        let o =
            Outcome { target: 7, from: ms(2000), to: ms(5000), failure: None, writes, errors: 2, elapsed: ms(14001) };
        let f = o.fields();
        for field in [
            "compact_revision=7 compaction_ms=3000 ",
            "ops=1110 during_ops=1000 during_p50_ms=500.000 during_p99_ms=990.000 during_p999_ms=999.000 during_max_ms=1000.000 ",
            "before_ops=100 before_p99_ms=3.000 before_max_ms=3.000 errors=2",
        ] {
            assert!(f.contains(field), "{field} not in {f}");
        }
        let unfinished = Outcome { failure: Some(("unfinished", "late".into())), to: ms(14001), ..o };
        assert!(unfinished.fields().contains("compaction_ms=unfinished "), "{}", unfinished.fields());
        assert_eq!(unfinished.error().as_deref(), Some("late"));
    }
}
