//! Watch fan-out: `watchers` watches spread over the connections the way etcd's Go client (and
//! so kube-apiserver) multiplexes them: one gRPC watch stream per connection carrying that
//! connection's share of the watches. Every watch is on one prefix ([`On::Prefix`]: each event
//! reaches every watcher) or on a key of its own ([`On::Key`]: each event reaches one watcher,
//! as with many clients each watching their own objects). Writer connections (`--writers`, on
//! `--write-endpoint` when given: a copy's origin) put at a fixed rate; each value carries its
//! send time, so every delivered event yields a delivery latency. Both ends run in this process
//! and share one clock (`origin`). The first `slow` connections do not read their streams while
//! the writers write (clients that stopped reading); their events are counted apart, and the
//! latencies reported are the other connections' only.

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

/// How long the slow connections, which start reading only then, have to catch up.
const SLOW_DRAIN: Duration = Duration::from_secs(60);

/// What each watch watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum On {
    /// All watch [`PREFIX`]; writers cycle through [`WRITTEN_KEYS`] keys each.
    Prefix,
    /// Watch `i` watches the key `<PREFIX>k/<i>`; writers put those keys in turn.
    Key,
}

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
    /// The slow connections' events: delivered, and expected but not delivered.
    pub slow_delivered: u64,
    pub slow_missed: u64,
    /// The server's resident memory once every watch was created (with `server_pid`), MiB.
    pub rss_with_watches_mib: Option<f64>,
}

/// How the watches are laid out and who reads.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub watchers: u64,
    pub on: On,
    /// Connections (the first ones) that do not read while the writers write.
    pub slow: u64,
}

/// What the writers did: their successful puts in all and, with [`On::Key`], per watched key.
#[derive(Debug, Default)]
struct Written {
    puts: u64,
    per_key: Vec<u64>,
}

/// Opens the watches (laid out as `layout` says over `clients`), waits until the server
/// confirmed every one, then puts at `rate` per second in all (shared by the `writers`) until
/// `seconds` have passed and collects the events.
pub async fn run(
    clients: Vec<Client>,
    writers: Vec<Client>,
    layout: Layout,
    rate: u64,
    value_bytes: usize,
    seconds: f64,
    server_pid: Option<u32>,
) -> Result<Outcome> {
    let n = clients.len() as u64;
    let mut streams = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        // Connection i holds the watches i, i + n, i + 2n, ...
        let mine: Vec<u64> = (i as u64..layout.watchers).step_by(n as usize).collect();
        let stream = tokio::time::timeout(Duration::from_secs(60), open(c, &mine, layout.on))
            .await
            .context("watches not created within 60 s")??;
        streams.push((stream, mine));
    }
    let rss_with_watches_mib = server_pid.and_then(crate::server::rss_mib);
    let origin = Instant::now();
    let acked = Arc::new(AtomicI64::new(0));
    let (done, finished) = watch::channel(None);
    let receivers: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, (s, mine))| {
            let slow = (i as u64) < layout.slow;
            tokio::spawn(receive(s, mine, layout.on, slow, origin, finished.clone(), acked.clone()))
        })
        .collect();
    let deadline = origin + Duration::from_secs_f64(seconds);
    let n = writers.len() as u64;
    let tasks: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let each = Duration::from_secs_f64(n as f64 / rate as f64);
            let target = Target { on: layout.on, id: i as u64, writers: n, watchers: layout.watchers };
            tokio::spawn(write(w, target, each, value_bytes, origin, deadline, acked.clone()))
        })
        .collect();
    let mut written =
        Written { puts: 0, per_key: vec![0; if layout.on == On::Key { layout.watchers as usize } else { 0 }] };
    let mut put_errors = 0;
    for t in tasks {
        let (w, e) = t.await?;
        written.puts += w.puts;
        for (total, k) in written.per_key.iter_mut().zip(w.per_key) {
            *total += k;
        }
        put_errors += e;
    }
    let puts = written.puts;
    // Receivers that lost their stream have returned already; nobody listening is fine.
    let _ = done.send(Some(Arc::new(written)));
    let mut stats = Stats::default();
    stats.errors = put_errors;
    let (mut behind, mut slow_delivered, mut slow_missed) = (Vec::new(), 0, 0);
    for (i, r) in receivers.into_iter().enumerate() {
        let (s, b) = r.await?;
        if (i as u64) < layout.slow {
            slow_delivered += s.ops() as u64;
            slow_missed += s.errors;
        } else {
            stats.merge(s);
            behind.extend(b);
        }
    }
    Ok(Outcome { stats, puts, elapsed: origin.elapsed(), behind, slow_delivered, slow_missed, rss_with_watches_mib })
}

/// The key watch `i` watches with [`On::Key`].
fn own_key(i: u64) -> String {
    format!("{PREFIX}k/{i}")
}

/// One watch stream with the watches `mine`, returned once the server confirmed all.
async fn open(mut c: Client, mine: &[u64], on: On) -> Result<WatchStream> {
    let watch = |i: u64| match on {
        On::Prefix => (PREFIX.to_string(), Some(WatchOptions::new().with_prefix())),
        On::Key => (own_key(i), None),
    };
    let (key, options) = watch(mine[0]);
    let mut stream = c.watch(key, options).await?;
    for &i in &mine[1..] {
        let (key, options) = watch(i);
        stream.watch(key, options).await?;
    }
    let share = mine.len() as u64;
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

/// Which keys one writer puts.
#[derive(Clone, Copy, Debug)]
struct Target {
    on: On,
    /// This writer, of `writers`.
    id: u64,
    writers: u64,
    watchers: u64,
}

impl Target {
    /// The key of this writer's `i`-th put, and its watched key's index with [`On::Key`].
    fn key(&self, i: u64) -> (String, Option<usize>) {
        match self.on {
            On::Prefix => (format!("{PREFIX}{}/{:04}", self.id, i % WRITTEN_KEYS), None),
            On::Key => {
                let k = (i * self.writers + self.id) % self.watchers;
                (own_key(k), Some(k as usize))
            }
        }
    }
}

/// Puts one every `period` until the deadline, one at a time (a put slower than the period
/// delays the next, so the rate achieved can fall short; the report's `puts` shows it), on the
/// keys `target` names. Returns what was written and the failed puts.
async fn write(
    mut c: Client,
    target: Target,
    period: Duration,
    value_bytes: usize,
    origin: Instant,
    deadline: Instant,
    acked: Arc<AtomicI64>,
) -> (Written, u64) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written =
        Written { puts: 0, per_key: vec![0; if target.on == On::Key { target.watchers as usize } else { 0 }] };
    let mut errors = 0;
    for i in 0.. {
        tick.tick().await;
        if Instant::now() >= deadline {
            break;
        }
        let (key, watched) = target.key(i);
        match c.put(key, value(origin.elapsed(), value_bytes), None).await {
            Ok(r) => {
                written.puts += 1;
                if let Some(k) = watched {
                    written.per_key[k] += 1;
                }
                if let Some(h) = r.header() {
                    acked.fetch_max(h.revision(), Ordering::Relaxed);
                }
            }
            Err(_) => errors += 1,
        }
    }
    (written, errors)
}

/// Receives the events of one stream's watches (`mine`) until all those of the writers' puts
/// (known when `finished` says what they wrote) arrived, or [`DRAIN`] after that. A `slow`
/// stream is not read before the writers are done, and gets [`SLOW_DRAIN`].
async fn receive(
    mut stream: WatchStream,
    mine: Vec<u64>,
    on: On,
    slow: bool,
    origin: Instant,
    mut finished: watch::Receiver<Option<Arc<Written>>>,
    acked: Arc<AtomicI64>,
) -> (Stats, Vec<i64>) {
    let mut stats = Stats::default();
    let mut behind = Vec::new();
    let (mut delivered, mut expected) = (0, None);
    let expect = |w: &Written| match on {
        On::Prefix => w.puts * mine.len() as u64,
        On::Key => mine.iter().map(|&i| w.per_key.get(i as usize).copied().unwrap_or(0)).sum(),
    };
    if slow {
        if finished.wait_for(Option::is_some).await.is_err() {
            return (stats, behind);
        }
        expected = finished.borrow().as_deref().map(expect);
    }
    // Armed when the writers stop; until then, never.
    let drain = tokio::time::sleep(if slow { SLOW_DRAIN } else { Duration::MAX });
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
            // The writers stopped and sent their counts (an error: they are gone without).
            changed = finished.changed(), if expected.is_none() => {
                let written = changed.ok().and_then(|()| finished.borrow().clone());
                expected = Some(written.as_deref().map_or(0, expect));
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

    #[test]
    fn writers_share_the_watched_keys() {
        let t = |id| Target { on: On::Key, id, writers: 3, watchers: 7 };
        let keys: Vec<_> = (0..7).flat_map(|i| (0..3).map(move |id| t(id).key(i).1.unwrap())).collect();
        // In each round the writers put consecutive keys; every key is put equally often.
        assert_eq!(&keys[..9], &[0, 1, 2, 3, 4, 5, 6, 0, 1]);
        for k in 0..7 {
            assert_eq!(keys.iter().filter(|&&x| x == k).count(), 3);
        }
        assert_eq!(t(1).key(2).0, format!("{PREFIX}k/0"));
        let p = Target { on: On::Prefix, id: 2, writers: 3, watchers: 7 };
        assert_eq!(p.key(1001), (format!("{PREFIX}2/0001"), None));
    }
}
