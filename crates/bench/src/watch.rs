//! Watch fan-out: `watchers` watches on one prefix, spread over the connections the way etcd's
//! Go client (and so kube-apiserver) multiplexes them: one gRPC watch stream per connection
//! carrying that connection's share of the watches. One more connection puts under the prefix
//! at a fixed rate; each value carries its send time, so every delivered event yields a
//! delivery latency. Both ends run in this process and share one clock (`origin`).

use crate::stats::Stats;
use anyhow::{Context as _, Result, bail};
use etcd_client::{Client, WatchOptions, WatchStream};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const PREFIX: &str = "/bench/w/";

/// How long receivers wait for the last events once the writer has stopped.
const DRAIN: Duration = Duration::from_secs(5);

/// Keys the writer cycles through: a bounded set of objects updated over and over.
const WRITTEN_KEYS: u64 = 1000;

/// What a watch run measured: `stats` holds one latency per delivered event and counts failed
/// puts and missed events (expected = successful puts × watchers) as errors.
pub struct Outcome {
    pub stats: Stats,
    pub puts: u64,
    pub elapsed: Duration,
}

/// Opens the watches (`watchers` spread over `clients`), waits until the server confirmed every
/// one, then puts at `rate` per second until `seconds` have passed and collects the events.
pub async fn run(
    clients: Vec<Client>,
    writer: Client,
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
    let (done, finished) = watch::channel(None);
    let receivers: Vec<_> =
        streams.into_iter().map(|(s, share)| tokio::spawn(receive(s, share, origin, finished.clone()))).collect();
    let deadline = origin + Duration::from_secs_f64(seconds);
    let (puts, put_errors) = write(writer, rate, value_bytes, origin, deadline).await;
    // Receivers that lost their stream have returned already; nobody listening is fine.
    let _ = done.send(Some(puts));
    let mut stats = Stats::default();
    stats.errors = put_errors;
    for r in receivers {
        stats.merge(r.await?);
    }
    Ok(Outcome { stats, puts, elapsed: origin.elapsed() })
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

/// Puts at `rate` per second until the deadline, one at a time (a put slower than the period
/// delays the next, so the rate achieved can fall short; the report's `puts` shows it).
/// Returns the successful puts and the failed ones.
async fn write(mut c: Client, rate: u64, value_bytes: usize, origin: Instant, deadline: Instant) -> (u64, u64) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut puts, mut errors) = (0, 0);
    for i in 0.. {
        tick.tick().await;
        if Instant::now() >= deadline {
            break;
        }
        let key = format!("{PREFIX}{:04}", i % WRITTEN_KEYS);
        match c.put(key, value(origin.elapsed(), value_bytes), None).await {
            Ok(_) => puts += 1,
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
) -> Stats {
    let mut stats = Stats::default();
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
                for e in r.events() {
                    match e.kv().and_then(|kv| sent(kv.value())) {
                        Some(sent) => stats.record(now.saturating_sub(sent)),
                        None => stats.errors += 1,
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
    stats
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
