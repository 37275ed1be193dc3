//! A node becoming the writer of a store in object storage: it takes the writer lock and brings
//! the local store and the prefix together — a restore into an empty store, the segments after
//! what a follower's local database holds (`standby.rs`), this node's own store checked against
//! the prefix; a new prefix gets a manifest and, if the store is not empty, a checkpoint — then
//! hands over to the [`Runner`], which ships. The lock is renewed from the start; once another
//! node has it, this one stops.

use crate::apply::Restored;
use crate::checkpoint;
use crate::keeper::{Held, Keeper};
use crate::lock::{Contender, Holder, Status};
use crate::manifest::{self, Manifest};
pub use crate::options::Options;
use crate::runner::{Flush, Runner};
use crate::segment::{self, Record, Segment};
use crate::ship::Shipper;
use crate::standby::{Holds, Standby};
use kine_core::Revision;
use kine_core::backend::Backend;
use kine_objstore::ObjectStore;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

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

/// What the prefix's objects reach.
struct End {
    /// The newest segment's commit record, or the revision `from` (or the checkpoint) is at
    /// when no segment follows it.
    revision: Revision,
    newest: Option<(u64, u64)>,
    /// Segments after the newest checkpoint (about, when counted from `from`: a term's are
    /// numbered from 1).
    since_checkpoint: u64,
}

/// Lists the segments after `from` (a segment the local database holds, with its revision),
/// or after the newest checkpoint: only those, since listing all of them takes a while (20,000
/// took 2.4 s on versitygw).
async fn shipped_end(
    store: &dyn ObjectStore,
    m: &Manifest,
    from: Option<((u64, u64), Revision)>,
) -> anyhow::Result<End> {
    let checkpoint = m.checkpoint.as_ref().map_or(((0, 0), m.shipped), |c| (c.after_segment, c.revision));
    let from = from.filter(|f| f.0 > checkpoint.0).unwrap_or(checkpoint);
    let listed = store.list_after("wal/", &segment::object_name(from.0.0, from.0.1)).await?;
    let names: Vec<(u64, u64)> = listed.iter().filter_map(|n| segment::parse_name(n)).filter(|n| *n > from.0).collect();
    let newest = names.iter().max().copied();
    let skipped = match (from.0, checkpoint.0) {
        (f, c) if f == c => 0,
        (f, c) if f.0 == c.0 => f.1 - c.1,
        (f, _) => f.1,
    };
    let since_checkpoint = skipped + names.len() as u64;
    let revision = match newest {
        Some(name) => {
            let object = segment::object_name(name.0, name.1);
            let body = store.get(&object).await?.ok_or_else(|| anyhow::anyhow!("{object} vanished"))?;
            let segment = Segment::decode(&body.body).map_err(|err| anyhow::anyhow!("{object}: {err}"))?;
            match segment.records.last() {
                Some(Record::Committed { revision }) => *revision,
                _ => anyhow::bail!("{object} does not end with its commit record: damaged"),
            }
        }
        None => from.1,
    };
    let newest = newest.or(Some(from.0).filter(|f| f.1 > 0));
    Ok(End { revision, newest, since_checkpoint })
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

/// Takes the writer lock and makes the prefix and `local` hold the same store (restoring into
/// it if it is empty, bringing it up to date if it holds a prefix of the store). Returns what
/// `run` needs.
pub async fn start(store: Arc<dyn ObjectStore>, local: Standby, options: &Options) -> anyhow::Result<Started> {
    let mut lock = Contender::new(store.clone(), &options.node, &options.address, options.lease);
    let (term, held_until) = acquire(&mut lock, options.lease).await?;
    start_held(store, local, options, lock, term, held_until).await
}

/// [`start`] with the writer lock taken already (as `term`, until `held_until`).
pub async fn start_held(
    store: Arc<dyn ObjectStore>,
    mut local: Standby,
    options: &Options,
    lock: Contender,
    term: u64,
    held_until: Instant,
) -> anyhow::Result<Started> {
    // Renewed from now on: a restore or a first checkpoint may take longer than the lease.
    let keeper = Keeper::start(lock, held_until, options.lease);
    let mut restored = None;
    let manifest = manifest::read(store.as_ref(), None).await?;
    local.examine(store.as_ref(), manifest.as_ref().map(|(m, _)| m)).await?;
    let mut segments = 0;
    let shipper = match manifest {
        None => {
            if !store.list("").await?.is_empty()
                && store.list("wal/").await?.iter().any(|n| segment::parse_name(n).is_some())
            {
                anyhow::bail!(
                    "the S3 prefix holds WAL segments but no {}: damaged, or another program's",
                    manifest::KEY
                );
            }
            let backend = local.backend();
            let revisions = backend.revisions().await.map_err(e)?;
            let mut m = Manifest::new(backend.cluster_id(), term);
            let mut shipper = Shipper::new_term(store.clone(), backend.clone(), term, revisions.current);
            if revisions.current > 1 {
                // Everything the store holds goes up first.
                let position = Shipper::state(backend.as_ref()).await?;
                let cp = checkpoint::write(store.as_ref(), backend.as_ref(), term, &position).await?;
                (m.checkpoint, m.shipped) = (Some(cp), position.revision);
                shipper = Shipper::new_term(store.clone(), backend.clone(), term, position.revision);
            }
            if manifest::write(store.as_ref(), &m, None).await?.is_none() {
                anyhow::bail!("another kine-rs created this S3 prefix's manifest meanwhile: two writers?");
            }
            local.adopt().await?;
            tracing::info!(revision = m.shipped, "S3 prefix initialised for this store");
            shipper
        }
        Some((m, etag)) => {
            let held = local.position().map(|at| (at.last_segment, at.revision));
            let end = shipped_end(store.as_ref(), &m, held).await?;
            if end.newest.is_some_and(|n| n.0 >= term) {
                anyhow::bail!(
                    "the S3 writer lock is at term {term} but segments of term {} exist: was the lock object removed?",
                    end.newest.map_or(0, |n| n.0)
                );
            }
            segments = end.since_checkpoint;
            let end = if local.holds() == &Holds::Own {
                own_store(local.backend().as_ref(), &m, end.revision).await?;
                end.revision
            } else {
                // An empty database takes the prefix's store (nothing, if it never wrote); a
                // follower's gets the segments it does not hold yet.
                let started = Instant::now();
                let held = local.position().map(|at| at.revision);
                let caught = local.catch_up(store.as_ref()).await?;
                let r = &caught.restored;
                let (elapsed_ms, segments) = (started.elapsed().as_millis() as u64, caught.segments);
                if caught.from_checkpoint {
                    let (checkpoint, versions) = (r.checkpoint, r.versions);
                    tracing::info!(
                        revision = r.revision,
                        ?checkpoint,
                        segments,
                        versions,
                        elapsed_ms,
                        "restored the store from S3"
                    );
                } else {
                    tracing::info!(
                        revision = r.revision,
                        held,
                        segments,
                        elapsed_ms,
                        "the local database caught up with the S3 store"
                    );
                }
                // The database is a store of its own from now on, with its own id.
                let mut m = m;
                m.cluster_id = local.backend().cluster_id();
                if manifest::write(store.as_ref(), &m, Some(&etag)).await?.is_none() {
                    anyhow::bail!("the S3 manifest changed during the restore: another writer?");
                }
                local.adopt().await?;
                restored = Some(caught.restored.clone());
                caught.restored.revision
            };
            let backend = local.backend();
            let compacted = backend.revisions().await.map_err(e)?.compacted;
            if compacted > end {
                anyhow::bail!(
                    "the local database was compacted at {compacted}, past the revisions shipped ({end}): write a \
                     checkpoint by restarting with an empty S3 prefix"
                );
            }
            Shipper::new_term(store.clone(), backend, term, end)
        }
    };
    let (flush, requests) = mpsc::channel(1024);
    let shipped = watch::channel(shipper.position().revision);
    if let Held::Lost(why) = &*keeper.held.borrow() {
        anyhow::bail!("{why}");
    }
    let backend = local.backend();
    Ok(Started {
        handle: Handle { flush, shipped: shipped.1, held: keeper.held.clone() },
        runner: Runner {
            store,
            backend: backend.clone(),
            keeper,
            shipper,
            requests,
            shipped: shipped.0,
            options: options.clone(),
            term,
            segments,
        },
        restored,
        backend,
    })
}

/// Checks that this node's own database (`backend`) can go on as the prefix's store, shipped
/// up to `end`.
async fn own_store(backend: &dyn Backend, m: &Manifest, end: Revision) -> anyhow::Result<()> {
    if m.cluster_id != backend.cluster_id() {
        anyhow::bail!(
            "the S3 prefix holds another store (cluster id {:x}; the local database is {:x}): point this node at its \
             own prefix, or move the local database away to restore from the prefix",
            m.cluster_id,
            backend.cluster_id()
        );
    }
    let current = backend.revisions().await.map_err(e)?.current;
    if current < end {
        anyhow::bail!(
            "the local database is at revision {current}, behind the S3 prefix's {end}: it lost acknowledged writes; \
             move it away and start again to restore it from S3"
        );
    }
    Ok(())
}

pub struct Started {
    pub handle: Handle,
    pub runner: Runner,
    /// What was restored, if anything.
    pub restored: Option<Restored>,
    /// The local database the node writes (another one than it started with if a follower's
    /// that could not go on was emptied).
    pub backend: Arc<dyn Backend>,
}
