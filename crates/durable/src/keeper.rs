//! Keeping the writer lock: a task of its own renews it every quarter of the lease, whatever
//! the shipper is doing (a large checkpoint, an upload S3 is slow to answer), and publishes
//! until when this node may write. Writes are refused past that instant (`backend.rs`), and the
//! node stops once the lock is lost.

use crate::lock::{Contender, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, watch};

/// What the keeper knows of the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// This node may write until then.
    Until(Instant),
    /// Lost, for this reason: the node must stop.
    Lost(String),
}

impl Held {
    /// Whether this node may write now.
    pub fn valid(&self) -> bool {
        matches!(self, Held::Until(until) if Instant::now() < *until)
    }
}

pub struct Keeper {
    pub held: watch::Receiver<Held>,
    lock: Arc<Mutex<Contender>>,
    task: tokio::task::JoinHandle<()>,
}

impl Keeper {
    /// Starts renewing `lock`, held until `until`.
    pub fn start(lock: Contender, until: Instant, lease: Duration) -> Keeper {
        let (tell, held) = watch::channel(Held::Until(until));
        let lock = Arc::new(Mutex::new(lock));
        let task = tokio::spawn(keep(lock.clone(), tell, until, lease));
        Keeper { held, lock, task }
    }

    /// Stops renewing and gives the lock up (at a clean stop, everything shipped).
    pub async fn release(self) -> anyhow::Result<()> {
        self.task.abort();
        self.lock.lock().await.release().await
    }

    /// Stops renewing; the lock runs out with its lease.
    pub fn abandon(self) {
        self.task.abort();
    }
}

impl Drop for Keeper {
    /// A node that fails to start, or stops, renews nothing any more.
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn keep(lock: Arc<Mutex<Contender>>, tell: watch::Sender<Held>, mut until: Instant, lease: Duration) {
    loop {
        tokio::time::sleep(lease / 4).await;
        let ticked = tokio::time::timeout(lease / 4, async { lock.lock().await.tick().await }).await;
        match ticked {
            Ok(Ok(Status::Writer { until: next, .. })) => {
                until = next;
                tell.send_replace(Held::Until(until));
                continue;
            }
            Ok(Ok(Status::Follower { holder })) => {
                let who = holder.map(|h| format!("{} at {}, term {}", h.node, h.address, h.term)).unwrap_or_default();
                tell.send_replace(Held::Lost(format!("another kine-rs took the S3 writer lock ({who})")));
                return;
            }
            Ok(Err(err)) => tracing::warn!(error = format!("{err:#}"), "cannot renew the S3 writer lock; retrying"),
            Err(_) => tracing::warn!("renewing the S3 writer lock takes long; retrying"),
        }
        if Instant::now() >= until {
            tell.send_replace(Held::Lost(
                "the S3 writer lock was not renewed within its lease (S3 unreachable?)".to_string(),
            ));
            return;
        }
    }
}
