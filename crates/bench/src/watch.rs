//! Watch fan-out: `watchers` watches on one prefix, spread over the connections the way etcd's
//! Go client (and so kube-apiserver) multiplexes them: one gRPC watch stream per connection
//! carrying that connection's share of the watches. Writer connections (`--writers`, on
//! `--write-endpoint` when given: a copy's origin) put under the prefix at a fixed rate; each
//! value carries its send time, so every delivered event yields a delivery latency. Both ends
//! run in this process and share one clock (`origin`).

use crate::stats::Stats;
use anyhow::{Context as _, Result, bail};
use etcd_client::{Client, WatchOptions, WatchStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const PREFIX: &str = "/bench/w/";

/// How long receivers wait for the last events once the writer has stopped.
const DRAIN: Duration = Duration::from_secs(5);

/// Keys the writer cycles through: a bounded set of objects updated over and over.
const WRITTEN_KEYS: u64 = 1000;

/// What a watch run measured: `stats` holds one latency per delivered event and counts failed
/// puts and missed events (expected = successful puts × watchers) as errors; `behind` holds, per
/// delivered event, how many revisions the writers' newest acknowledged revision was ahead of
/// it when it arrived (a read-only copy's lag behind its origin, with `--write-endpoint`).
pub struct Outcome {
    pub stats: Stats,
    pub puts: u64,
    pub elapsed: Duration,
    pub behind: Vec<i64>,
}

/// Opens the watches (`watchers` spread over `clients`), waits until the server confirmed every
/// one, then puts at `rate` per second in all (shared by the `writers`) until `seconds` have
/// passed and collects the events.
pub async fn run(
    clients: Vec<Client>,
    writers: Vec<Client>,
    watchers: u64,
    rate: u64,
    value_bytes: usize,
    seconds: f64,
) -> Result<Outcome> {
    let n = clients.len() as u64;
    let mut streams = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let share = watchers / n + u64::from((i as u64) < watchers % n);
        let stream = tokio::time::timeout(Duration::from_secs(60), open(c, share))
            .await
            .context("watches not created within 60 s")??;
        streams.push((stream, share));
    }
    let origin = Instant::now();
    let acked = Arc::new(AtomicI64::new(0));
    let (done, finished) = watch::channel(None);
    let receivers: Vec<_> = streams
        .into_iter()
        .map(|(s, share)| tokio::spawn(receive(s, share, origin, finished.clone(), acked.clone())))
        .collect();
    let deadline = origin + Duration::from_secs_f64(seconds);
    let n = writers.len() as u64;
    let tasks: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let each = Duration::from_secs_f64(n as f64 / rate as f64);
            tokio::spawn(write(w, i as u64, each, value_bytes, origin, deadline, acked.clone()))
        })
        .collect();
    let (mut puts, mut put_errors) = (0, 0);
    for t in tasks {
        let (p, e) = t.await?;
        puts += p;
        put_errors += e;
    }
    // Receivers that lost their stream have returned already; nobody listening is fine.
    let _ = done.send(Some(puts));
    let mut stats = Stats::default();
    stats.errors = put_errors;
    let mut behind = Vec::new();
    for r in receivers {
        let (s, b) = r.await?;
        stats.merge(s);
        behind.extend(b);
    }
    Ok(Outcome { stats, puts, elapsed: origin.elapsed(), behind })
}

/// One watch stream with `share` watches on [`PREFIX`], returned once the server confirmed all.
async fn open(mut c: Client, share: u64) -> Result<WatchStream> {
    let options = || Some(WatchOptions::new().with_prefix());
    let mut stream = c.watch(PREFIX, options()).await?;
    for _ in 1..share {
        stream.watch(PREFIX, options()).await?;
    }
    let mut created = 0;
    while created < share {
        let r = stream.message().await?.context("watch stream closed before the watches were created")?;
        if r.canceled() {
            bail!("watch canceled at creation: {}", r.cancel_reason());
        }
        created += u64::from(r.created());
    }
    Ok(stream)
}

/// The value of a put sent `sent` after `origin`: the nanoseconds, then filler.
fn value(sent: Duration, value_bytes: usize) -> Vec<u8> {
    let mut v = format!("{}:", sent.as_nanos()).into_bytes();
    v.resize(value_bytes.max(v.len()), b'x');
    v
}

/// The send time carried by a value, if it holds one.
fn sent(value: &[u8]) -> Option<Duration> {
    let end = value.iter().position(|&b| b == b':')?;
    let nanos = std::str::from_utf8(&value[..end]).ok()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Puts one every `period` until the deadline, one at a time (a put slower than the period
/// delays the next, so the rate achieved can fall short; the report's `puts` shows it), on keys
/// of its own (writer `id`). Returns the successful puts and the failed ones.
async fn write(
    mut c: Client,
    id: u64,
    period: Duration,
    value_bytes: usize,
    origin: Instant,
    deadline: Instant,
    acked: Arc<AtomicI64>,
) -> (u64, u64) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut puts, mut errors) = (0, 0);
    for i in 0.. {
        tick.tick().await;
        if Instant::now() >= deadline {
            break;
        }
        let key = format!("{PREFIX}{id}/{:04}", i % WRITTEN_KEYS);
        match c.put(key, value(origin.elapsed(), value_bytes), None).await {
            Ok(r) => {
                puts += 1;
                if let Some(h) = r.header() {
                    acked.fetch_max(h.revision(), Ordering::Relaxed);
                }
            }
            Err(_) => errors += 1,
        }
    }
    (puts, errors)
}

/// Receives the events of one stream's `share` watches until all those of the writer's puts
/// (known when `finished` says how many there were) arrived, or [`DRAIN`] after that.
async fn receive(
    mut stream: WatchStream,
    share: u64,
    origin: Instant,
    mut finished: watch::Receiver<Option<u64>>,
    acked: Arc<AtomicI64>,
) -> (Stats, Vec<i64>) {
    let mut stats = Stats::default();
    let mut behind = Vec::new();
    let (mut delivered, mut expected) = (0, None);
    // Armed when the writer stops; until then, never.
    let drain = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drain);
    while expected.is_none_or(|e| delivered < e) {
        tokio::select! {
            m = stream.message() => {
                let Ok(Some(r)) = m else {
                    stats.errors += 1; // the stream failed or ended: the rest count as missed
                    break;
                };
                let now = origin.elapsed();
                let newest = acked.load(Ordering::Relaxed);
                for e in r.events() {
                    match e.kv().and_then(|kv| sent(kv.value())) {
                        Some(sent) => stats.record(now.saturating_sub(sent)),
                        None => stats.errors += 1,
                    }
                    if let Some(kv) = e.kv() {
                        behind.push((newest - kv.mod_revision()).max(0));
                    }
                    delivered += 1;
                }
            }
            // The writer stopped and sent its count (an error: it is gone without one).
            changed = finished.changed(), if expected.is_none() => {
                let puts = changed.ok().and_then(|()| *finished.borrow()).unwrap_or(0);
                expected = Some(puts * share);
                drain.as_mut().reset((Instant::now() + DRAIN).into());
            }
            () = &mut drain => break,
        }
    }
    stats.errors += expected.unwrap_or(0).saturating_sub(delivered);
    (stats, behind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_carry_their_send_time() {
        let t = Duration::from_nanos(1_234_567_890_123);
        let v = value(t, 256);
        assert_eq!((v.len(), sent(&v)), (256, Some(t)));
        assert_eq!(sent(&value(t, 0)), Some(t));
        assert_eq!(sent(b"no time here"), None);
        assert_eq!(sent(b"12x:"), None);
    }
}
