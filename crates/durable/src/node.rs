//! A node writing a store to object storage: it takes the writer lock, brings the local store
//! and the prefix together (a restore into an empty store; a new prefix gets a manifest and, if
//! the store is not empty, a checkpoint), then ships every change within the ship interval,
//! writes a checkpoint each checkpoint interval and removes what the checkpoint before it made
//! unneeded. It keeps the lock renewed; once another node has it, this one stops.

use crate::checkpoint;
use crate::keeper::{Held, Keeper};
use crate::lock::{Contender, Holder, Status};
use crate::manifest::{self, Manifest};
use crate::restore::{Restored, restore};
use crate::segment::{self, Record, Segment};
use crate::ship::Shipper;
use kine_core::Revision;
use kine_core::backend::Backend;
use kine_objstore::ObjectStore;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

#[derive(Clone, Debug)]
pub struct Options {
    /// A change is in object storage at most this long after it was committed.
    pub ship_interval: Duration,
    pub checkpoint_interval: Duration,
    /// The writer lock's lease.
    pub lease: Duration,
    /// Names this node in the writer lock.
    pub node: String,
    pub address: String,
    /// With `--s3-sync`: the longest a linearizable read waits for the upload of a change it saw
    /// (`--request-timeout`); then it fails as etcd's do without a quorum.
    pub read_wait: Duration,
}

/// A request to have everything committed before it shipped; answered once it is.
pub(crate) type Flush = oneshot::Sender<()>;

/// What the running node offers the backend wrapper.
#[derive(Clone)]
pub struct Handle {
    pub(crate) flush: mpsc::Sender<Flush>,
    /// The newest revision shipped.
    pub shipped: watch::Receiver<Revision>,
    /// Whether this node may write (it holds the writer lock).
    pub held: watch::Receiver<Held>,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// The revision the prefix's objects reach: the newest segment's commit record, or the
/// checkpoint's when no segment follows it.
async fn shipped_end(store: &dyn ObjectStore, m: &Manifest) -> anyhow::Result<(Revision, Option<(u64, u64)>)> {
    let newest = store.list("wal/").await?.iter().filter_map(|n| segment::parse_name(n)).max();
    let after = m.checkpoint.as_ref().map(|c| c.after_segment);
    match newest.filter(|n| after.is_none_or(|a| *n > a)) {
        Some(name) => {
            let object = segment::object_name(name.0, name.1);
            let body = store.get(&object).await?.ok_or_else(|| anyhow::anyhow!("{object} vanished"))?;
            let segment = Segment::decode(&body.body).map_err(|err| anyhow::anyhow!("{object}: {err}"))?;
            match segment.records.last() {
                Some(Record::Committed { revision }) => Ok((*revision, Some(name))),
                _ => anyhow::bail!("{object} does not end with its commit record: damaged"),
            }
        }
        None => Ok((m.checkpoint.as_ref().map_or(m.shipped, |c| c.revision), newest)),
    }
}

/// Waits for the writer lock; returns its term and until when it is held.
async fn acquire(lock: &mut Contender, lease: Duration) -> anyhow::Result<(u64, Instant)> {
    let mut told: Option<Holder> = None;
    loop {
        match lock.tick().await? {
            Status::Writer { term, until } => return Ok((term, until)),
            Status::Follower { holder } => {
                if holder.is_some() && holder != told {
                    let h = holder.clone().unwrap_or_else(|| unreachable!());
                    tracing::warn!(
                        holder = %h.node,
                        address = %h.address,
                        term = h.term,
                        "another kine-rs holds the S3 writer lock; waiting until it stops renewing it (lease {lease:?})"
                    );
                    told = holder;
                }
                tokio::time::sleep(lease / 4).await;
            }
        }
    }
}

/// Takes the writer lock and makes the prefix and `backend` hold the same store (restoring
/// into `backend` if it is empty). Returns what `run` needs.
pub async fn start(
    store: Arc<dyn ObjectStore>,
    backend: Arc<dyn Backend>,
    options: &Options,
) -> anyhow::Result<Started> {
    let mut lock = Contender::new(store.clone(), &options.node, &options.address, options.lease);
    let (term, held_until) = acquire(&mut lock, options.lease).await?;
    start_held(store, backend, options, lock, term, held_until).await
}

/// [`start`] with the writer lock taken already (as `term`, until `held_until`).
pub async fn start_held(
    store: Arc<dyn ObjectStore>,
    backend: Arc<dyn Backend>,
    options: &Options,
    lock: Contender,
    term: u64,
    held_until: Instant,
) -> anyhow::Result<Started> {
    // Renewed from now on: a restore or a first checkpoint may take longer than the lease.
    let keeper = Keeper::start(lock, held_until, options.lease);
    let revisions = backend.revisions().await.map_err(e)?;
    let empty = revisions.current <= 1;
    let mut restored = None;
    let shipper = match manifest::read(store.as_ref(), None).await? {
        None => {
            if !store.list("").await?.is_empty()
                && store.list("wal/").await?.iter().any(|n| segment::parse_name(n).is_some())
            {
                anyhow::bail!(
                    "the S3 prefix holds WAL segments but no {}: damaged, or another program's",
                    manifest::KEY
                );
            }
            let mut m = Manifest::new(backend.cluster_id(), term);
            let mut shipper = Shipper::new_term(store.clone(), backend.clone(), term, revisions.current);
            if !empty {
                // Everything the store holds goes up first.
                let position = Shipper::state(backend.as_ref()).await?;
                let cp = checkpoint::write(store.as_ref(), backend.as_ref(), term, &position).await?;
                (m.checkpoint, m.shipped) = (Some(cp), position.revision);
                shipper = Shipper::new_term(store.clone(), backend.clone(), term, position.revision);
            }
            if manifest::write(store.as_ref(), &m, None).await?.is_none() {
                anyhow::bail!("another kine-rs created this S3 prefix's manifest meanwhile: two writers?");
            }
            tracing::info!(revision = m.shipped, "S3 prefix initialised for this store");
            shipper
        }
        Some((m, etag)) => {
            let (end, newest) = shipped_end(store.as_ref(), &m).await?;
            if newest.is_some_and(|n| n.0 >= term) {
                anyhow::bail!(
                    "the S3 writer lock is at term {term} but segments of term {} exist: was the lock object removed?",
                    newest.map_or(0, |n| n.0)
                );
            }
            // An empty database takes the prefix's store (nothing, if it never wrote).
            if empty {
                let started = Instant::now();
                let r = restore(store.as_ref(), backend.as_ref(), None).await?;
                tracing::info!(
                    revision = r.revision,
                    checkpoint = ?r.checkpoint,
                    segments = r.segments,
                    versions = r.versions,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "restored the store from S3"
                );
                // The restored store is a new database with an id of its own.
                let mut m = m;
                m.cluster_id = backend.cluster_id();
                if manifest::write(store.as_ref(), &m, Some(&etag)).await?.is_none() {
                    anyhow::bail!("the S3 manifest changed during the restore: another writer?");
                }
                restored = Some(r);
            } else {
                if m.cluster_id != backend.cluster_id() {
                    anyhow::bail!(
                        "the S3 prefix holds another store (cluster id {:x}; the local database is {:x}): point this \
                         node at its own prefix, or move the local database away to restore from the prefix",
                        m.cluster_id,
                        backend.cluster_id()
                    );
                }
                if revisions.current < end {
                    anyhow::bail!(
                        "the local database is at revision {}, behind the S3 prefix's {end}: it lost acknowledged \
                         writes; move it away and start again to restore it from S3",
                        revisions.current
                    );
                }
            }
            let end = restored.as_ref().map_or(end, |r: &Restored| r.revision);
            let compacted = backend.revisions().await.map_err(e)?.compacted;
            if compacted > end {
                anyhow::bail!(
                    "the local database was compacted at {compacted}, past the revisions shipped ({end}): write a \
                     checkpoint by restarting with an empty S3 prefix"
                );
            }
            Shipper::new_term(store.clone(), backend.clone(), term, end)
        }
    };
    let (flush, requests) = mpsc::channel(1024);
    let shipped = watch::channel(shipper.position().revision);
    if let Held::Lost(why) = &*keeper.held.borrow() {
        anyhow::bail!("{why}");
    }
    Ok(Started {
        handle: Handle { flush, shipped: shipped.1, held: keeper.held.clone() },
        runner: Runner {
            store,
            backend,
            keeper,
            shipper,
            requests,
            shipped: shipped.0,
            options: options.clone(),
            term,
        },
        restored,
    })
}

pub struct Started {
    pub handle: Handle,
    pub runner: Runner,
    /// What was restored, if anything.
    pub restored: Option<Restored>,
}

pub struct Runner {
    store: Arc<dyn ObjectStore>,
    backend: Arc<dyn Backend>,
    keeper: Keeper,
    shipper: Shipper,
    requests: mpsc::Receiver<Flush>,
    shipped: watch::Sender<Revision>,
    options: Options,
    term: u64,
}

impl Runner {
    /// Ships until `stop` resolves (then ships what is left) or the lock is lost (an error).
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
        tokio::pin!(stop);
        let mut waiting: Vec<Flush> = Vec::new();
        let mut checkpointed = Instant::now();
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
            if failing.is_none() && checkpointed.elapsed() >= self.options.checkpoint_interval {
                let written = tokio::select! {
                    r = self.checkpoint() => r,
                    why = lost(&mut held) => anyhow::bail!("{why}: this node stops"),
                };
                match written {
                    Ok(()) => checkpointed = Instant::now(),
                    Err(err) => tracing::warn!(error = format!("{err:#}"), "cannot write an S3 checkpoint; retrying"),
                }
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
            if s.last >= target {
                break;
            }
        }
        Ok(())
    }

    /// A checkpoint at the revision shipped; the manifest points at it; what only the
    /// checkpoint before it needed is removed.
    async fn checkpoint(&mut self) -> anyhow::Result<()> {
        let position = self.shipper.position().clone();
        let (mut m, etag) = manifest::read(self.store.as_ref(), Some(self.backend.cluster_id()))
            .await?
            .ok_or_else(|| anyhow::anyhow!("the S3 manifest is gone"))?;
        if m.checkpoint.as_ref().is_some_and(|c| c.revision == position.revision) {
            return Ok(());
        }
        let started = Instant::now();
        let cp = checkpoint::write(self.store.as_ref(), self.backend.as_ref(), self.term, &position).await?;
        let previous = m.checkpoint.replace(cp.clone());
        m.previous.clone_from(&previous);
        (m.shipped, m.term) = (position.revision, self.term);
        if manifest::write(self.store.as_ref(), &m, Some(&etag)).await?.is_none() {
            anyhow::bail!("the S3 manifest changed under this writer: another writer?");
        }
        tracing::info!(
            revision = cp.revision,
            parts = cp.parts,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "S3 checkpoint written"
        );
        // Kept: the previous checkpoint and the segments after it (a restore to a revision
        // before the newest checkpoint). Removed: everything older.
        if let Some(previous) = previous {
            self.prune(previous.after_segment, &previous.object).await?;
        }
        Ok(())
    }

    async fn prune(&self, keep_after: (u64, u64), keep_checkpoint: &str) -> anyhow::Result<()> {
        let mut removed = 0;
        for name in self.store.list("wal/").await? {
            if segment::parse_name(&name).is_some_and(|n| n <= keep_after) {
                self.store.delete(&name).await?;
                removed += 1;
            }
        }
        for name in self.store.list("checkpoint/").await? {
            if name.as_str() < keep_checkpoint && !name.starts_with(keep_checkpoint) {
                self.store.delete(&name).await?;
                removed += 1;
            }
        }
        tracing::debug!(removed, "removed S3 objects no checkpoint kept needs");
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
