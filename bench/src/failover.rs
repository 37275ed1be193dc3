//! Failover of a read-only copy (docs/nats.md, "Promotion"): writers create keys on the origin
//! (`--write-endpoint`) at a fixed rate, recording every acknowledged write; after the run time
//! the origin's process (`--origin-pid`) is killed with SIGKILL while they write, and the copy
//! (`--endpoint`) is promoted at once. Reports how long until the copy was promoted and took its first write, and
//! how many acknowledged writes it does not hold (the RPO). A follower of an S3 store
//! (docs/s3.md) refuses the promotion until it takes the writer lock by itself; once it has,
//! it answers that it is no learner, and that is its promotion.

use anyhow::{Context as _, Result, bail};
use etcd_client::{Client, GetOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const PREFIX: &str = "/bench/f/";

/// How long the promotion and the first write may take (an S3 standby that restores the store
/// at its takeover may take minutes).
const LIMIT: Duration = Duration::from_secs(1800);

pub struct Outcome {
    /// Writes the origin acknowledged.
    pub acked: usize,
    /// Of those, the ones the promoted copy does not hold.
    pub lost: usize,
    /// From the kill to the promotion's answer.
    pub promoted: Duration,
    /// From the kill to the first write the promoted copy acknowledged.
    pub first_write: Duration,
    /// The newest revision the origin acknowledged, and the copy's after its promotion.
    pub origin_revision: i64,
    pub promoted_revision: i64,
}

pub async fn run(
    mut copy: Client,
    writers: Vec<Client>,
    rate: u64,
    value_bytes: usize,
    seconds: f64,
    origin_pid: u32,
) -> Result<Outcome> {
    let acked: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    // The writers go on until the origin is dead: the writes in flight at the kill are the
    // ones a copy may miss.
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let n = writers.len();
    let period = Duration::from_secs_f64(n as f64 / rate as f64);
    let tasks: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(id, mut c)| {
            let (acked, stop) = (acked.clone(), stop.clone());
            let value = vec![b'v'; value_bytes];
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for i in 0.. {
                    tick.tick().await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let key = format!("{PREFIX}{id}/{i}");
                    if let Ok(r) = c.put(key.as_str(), value.clone(), None).await
                        && let Some(h) = r.header()
                    {
                        acked.lock().unwrap_or_else(|p| p.into_inner()).push((key, h.revision()));
                    }
                }
            })
        })
        .collect();
    // The origin dies while the writers are busy.
    tokio::time::sleep_until(deadline.into()).await;
    let status = std::process::Command::new("kill").args(["-9", &origin_pid.to_string()]).status()?;
    let killed = Instant::now();
    if !status.success() {
        bail!("kill -9 {origin_pid} failed");
    }
    // Writes in flight fail now (never acknowledged); give them a moment to.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    // The copy's own member id (its MemberList names its origin's nodes too).
    let id = copy.status().await?.header().context("the copy's status has no header")?.member_id();
    let promoted_revision = loop {
        match copy.member_promote(id).await {
            Ok(r) => break r.header().map_or(0, |h| h.revision()),
            Err(e) if e.to_string().contains("can only promote a learner member") => {
                break copy.status().await?.header().map_or(0, |h| h.revision());
            }
            Err(e) if killed.elapsed() < LIMIT => {
                eprintln!("promote: {e}; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).context("promote the copy"),
        }
    };
    let promoted = killed.elapsed();
    loop {
        match copy.put(format!("{PREFIX}after"), "v", None).await {
            Ok(_) => break,
            Err(e) if killed.elapsed() < LIMIT => {
                eprintln!("first write: {e}; again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).context("write to the promoted copy"),
        }
    }
    let first_write = killed.elapsed();
    let acked = std::mem::take(&mut *acked.lock().unwrap_or_else(|p| p.into_inner()));
    let origin_revision = acked.iter().map(|(_, r)| *r).max().unwrap_or(0);
    let mut lost = 0;
    for (key, rev) in &acked {
        let r = copy.get(key.as_str(), Some(GetOptions::new().with_revision(*rev).with_serializable())).await?;
        if r.kvs().first().is_none_or(|kv| kv.mod_revision() != *rev) {
            lost += 1;
        }
    }
    Ok(Outcome { acked: acked.len(), lost, promoted, first_write, origin_revision, promoted_revision })
}
