//! A writer at work: it ships every change within the ship interval (or at once when a write
//! waits for it), writes a checkpoint each checkpoint interval or once enough segments were
//! shipped since the last one (in a task of its own: shipping goes on meanwhile), removes what
//! the checkpoint before it made unneeded, and stops once another node has the writer lock (or,
//! at a clean stop, ships what is left and releases it).

use crate::checkpoint;
use crate::keeper::{Held, Keeper};
use crate::manifest;
use crate::options::Options;
use crate::segment;
use crate::ship::{Position, Shipper};
use kine_core::Revision;
use kine_core::backend::Backend;
use kine_objstore::ObjectStore;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, watch};

/// A request to have everything committed before it shipped; answered once it is.
pub(crate) type Flush = oneshot::Sender<()>;

pub struct Runner {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) keeper: Keeper,
    pub(crate) shipper: Shipper,
    pub(crate) requests: mpsc::Receiver<Flush>,
    pub(crate) shipped: watch::Sender<Revision>,
    pub(crate) options: Options,
    pub(crate) term: u64,
    /// Segments shipped since the newest checkpoint (by any term).
    pub(crate) segments: u64,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// A checkpoint being written, aborted if dropped (the node stops, or lost the lock).
struct Checkpointing {
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// When it began, and the segments shipped since the one before until then.
    began: Instant,
    segments: u64,
}

impl Drop for Checkpointing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Runner {
    /// Ships until `stop` resolves (then ships what is left) or the lock is lost (an error).
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
        tokio::pin!(stop);
        let mut waiting: Vec<Flush> = Vec::new();
        let mut checkpointed = Instant::now();
        let mut checkpointing: Option<Checkpointing> = None;
        let mut failing: Option<Instant> = None;
        let mut held = self.keeper.held.clone();
        loop {
            let stopping = tokio::select! {
                _ = &mut stop => true,
                Some(f) = self.requests.recv() => { waiting.push(f); false }
                _ = held.changed() => false,
                _ = tokio::time::sleep(self.options.ship_interval) => false,
            };
            if let Held::Lost(why) = &*held.borrow() {
                anyhow::bail!("{why}: this node stops");
            }
            while let Ok(f) = self.requests.try_recv() {
                waiting.push(f);
            }
            // A lost lock ends the node even while an upload hangs.
            let shipped = tokio::select! {
                r = self.ship_all() => r,
                why = lost(&mut held) => anyhow::bail!("{why}: this node stops"),
            };
            match shipped {
                Ok(()) => {
                    if failing.take().is_some() {
                        tracing::info!("shipping to S3 again");
                    }
                }
                Err(err) => {
                    if failing.is_none() {
                        tracing::warn!(error = format!("{err:#}"), "cannot ship to S3; retrying");
                    }
                    failing.get_or_insert_with(Instant::now);
                }
            }
            if failing.is_none() {
                // Everything committed before these requests came in is shipped.
                for tell in waiting.drain(..) {
                    let _ = tell.send(());
                }
            }
            if stopping {
                if failing.is_none() {
                    // Everything is shipped: the next node need not wait for the lease.
                    self.keeper.release().await?;
                    tracing::info!(
                        revision = self.shipper.position().revision,
                        "S3 shipping stopped; writer lock released"
                    );
                } else {
                    self.keeper.abandon();
                    tracing::warn!(
                        "stopping with changes not shipped to S3; the writer lock is kept until its lease runs out"
                    );
                }
                return Ok(());
            }
            if let Some(c) = checkpointing.as_mut().filter(|c| c.task.is_finished()) {
                match (&mut c.task).await.unwrap_or_else(|err| Err(anyhow::anyhow!("{err}"))) {
                    Ok(()) => (checkpointed, self.segments) = (c.began, self.segments.saturating_sub(c.segments)),
                    Err(err) => tracing::warn!(error = format!("{err:#}"), "cannot write an S3 checkpoint; retrying"),
                }
                checkpointing = None;
            }
            let due = checkpointed.elapsed() >= self.options.checkpoint_interval
                || self.segments >= self.options.checkpoint_segments;
            if failing.is_none() && due && checkpointing.is_none() {
                let (store, backend) = (self.store.clone(), self.backend.clone());
                let write = write_checkpoint(store, backend, self.term, self.shipper.position().clone(), self.segments);
                checkpointing =
                    Some(Checkpointing { task: tokio::spawn(write), began: Instant::now(), segments: self.segments });
            }
        }
    }

    /// Ships what was committed before the call: one segment, or several for a backlog of more
    /// than [`crate::ship::MAX_REVISIONS`] (writes committed meanwhile wait for the next call,
    /// so that a busy store still ships one segment per interval).
    async fn ship_all(&mut self) -> anyhow::Result<()> {
        let target = self.backend.revisions().await.map_err(e)?.current;
        while let Some(s) = self.shipper.ship_until(target).await? {
            tracing::trace!(object = %s.object, first = s.first, last = s.last, bytes = s.bytes, "shipped");
            self.shipped.send_replace(s.last);
            self.segments += 1;
            if s.last >= target {
                break;
            }
        }
        Ok(())
    }
}

/// Resolves once the lock is lost, with the reason.
async fn lost(held: &mut watch::Receiver<Held>) -> String {
    loop {
        if let Held::Lost(why) = &*held.borrow_and_update() {
            return why.clone();
        }
        if held.changed().await.is_err() {
            return "the S3 writer lock's keeper ended".to_string();
        }
    }
}

/// A checkpoint at `position` (shipped; `segments` shipped since the one before); the manifest
/// points at it; what only the checkpoint before it needed is removed.
async fn write_checkpoint(
    store: Arc<dyn ObjectStore>,
    backend: Arc<dyn Backend>,
    term: u64,
    position: Position,
    segments: u64,
) -> anyhow::Result<()> {
    let (mut m, etag) = manifest::read(store.as_ref(), Some(backend.cluster_id()))
        .await?
        .ok_or_else(|| anyhow::anyhow!("the S3 manifest is gone"))?;
    if m.checkpoint.as_ref().is_some_and(|c| c.revision == position.revision) {
        return Ok(());
    }
    let started = Instant::now();
    let cp = checkpoint::write(store.as_ref(), backend.as_ref(), term, &position).await?;
    let previous = m.checkpoint.replace(cp.clone());
    m.previous.clone_from(&previous);
    (m.shipped, m.term) = (position.revision, term);
    if manifest::write(store.as_ref(), &m, Some(&etag)).await?.is_none() {
        anyhow::bail!("the S3 manifest changed under this writer: another writer?");
    }
    tracing::info!(
        revision = cp.revision,
        parts = cp.parts,
        segments_since = segments,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "S3 checkpoint written"
    );
    // Kept: the previous checkpoint and the segments after it (a restore to a revision
    // before the newest checkpoint). Removed: everything older.
    if let Some(previous) = previous {
        prune(store.as_ref(), previous.after_segment, &previous.object).await?;
    }
    Ok(())
}

async fn prune(store: &dyn ObjectStore, keep_after: (u64, u64), keep_checkpoint: &str) -> anyhow::Result<()> {
    let mut removed = 0;
    for name in store.list("wal/").await? {
        if segment::parse_name(&name).is_some_and(|n| n <= keep_after) {
            store.delete(&name).await?;
            removed += 1;
        }
    }
    for name in store.list("checkpoint/").await? {
        if name.as_str() < keep_checkpoint && !name.starts_with(keep_checkpoint) {
            store.delete(&name).await?;
            removed += 1;
        }
    }
    tracing::debug!(removed, "removed S3 objects no checkpoint kept needs");
    Ok(())
}
