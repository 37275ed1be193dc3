//! What a node waiting for the S3 writer lock serves meanwhile: a read-only copy of the store,
//! held in memory and brought up to date from the segments the writer ships. It starts from
//! the newest checkpoint (compacted there: the history before it is not in the prefix), then
//! applies each segment's revisions as the writer committed them, so that they reach its
//! watchers in order and with their previous values, and watches from any revision since the
//! checkpoint replay them.
//!
//! A catch-up round lists the segments after the last one applied and applies them. Reads that
//! must be linearizable share rounds: a read waits for one that began after it arrived, so it
//! sees everything that was in the prefix when it came (with `--s3-sync` on the writer, every
//! write it acknowledged). Once the node's local database holds a prefix of the store
//! (`standby.rs`), the segments each round fetched go to a task of its own that applies them to
//! that database after the round: reads wait for the copy only.

use crate::apply::{Given, Restored, Sink, Target, apply_segments};
use crate::manifest;
use crate::restore::{restore_checkpoint, segments_after};
use crate::segment::Record;
use crate::standby::{Batch, Standby};
use kine_core::backend::{Backend, LeaseUpdate, Replication};
use kine_core::memory::MemoryBackend;
use kine_core::txn::{Import, WriteOp};
use kine_core::{Event, EventKind, KeyValue, Revision};
use kine_objstore::ObjectStore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{broadcast, mpsc};

pub struct Copy {
    store: Arc<dyn ObjectStore>,
    /// The store's cluster id, from its manifest.
    cluster_id: u64,
    replica: Arc<MemoryBackend>,
    /// Where the copy is; held for the whole of a catch-up round.
    position: tokio::sync::Mutex<Restored>,
    /// The local database kept current with the copy, if one was attached.
    feeder: Mutex<Option<Feeder>>,
    /// Rounds begun, and the number of the newest one that succeeded.
    begun: AtomicU64,
    succeeded: AtomicU64,
    contact: Mutex<Contact>,
    leases: broadcast::Sender<LeaseUpdate>,
}

/// The task that applies each round's segments to the local database, and its queue. A round
/// whose segments do not fit in the queue leaves them out; the task fetches what it missed.
struct Feeder {
    batches: mpsc::Sender<Batch>,
    task: tokio::task::JoinHandle<Standby>,
}

/// Rounds whose segments may wait for the local database.
const QUEUED: usize = 64;

#[derive(Default)]
struct Contact {
    /// When the newest successful round began.
    at: Option<Instant>,
    /// Why the newest round failed, if it did.
    error: Option<String>,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

impl Copy {
    /// The prefix's store, read into memory; `None` while the prefix holds none yet (its
    /// writer is still setting it up). Lease changes it applies later go to `leases`.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        leases: broadcast::Sender<LeaseUpdate>,
    ) -> anyhow::Result<Option<Copy>> {
        let Some((manifest, _)) = manifest::read(store.as_ref(), None).await? else {
            return Ok(None);
        };
        let replica = Arc::new(MemoryBackend::new());
        let done = restore_checkpoint(store.as_ref(), replica.as_ref(), Revision::MAX).await?;
        if let Some(at) = done.checkpoint
            && replica.revisions().await.map_err(e)?.compacted < at
        {
            replica.compact(at).await.map_err(e)?;
        }
        let copy = Copy {
            store,
            cluster_id: manifest.cluster_id,
            replica,
            position: tokio::sync::Mutex::new(done),
            feeder: Mutex::new(None),
            begun: AtomicU64::new(0),
            succeeded: AtomicU64::new(0),
            contact: Mutex::new(Contact::default()),
            leases,
        };
        copy.catch_up().await?;
        Ok(Some(copy))
    }

    /// The cluster id of the store the copy follows.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    pub fn replica(&self) -> Arc<MemoryBackend> {
        self.replica.clone()
    }

    /// Applies the segments shipped since the last round; returns the revision reached.
    pub async fn catch_up(&self) -> anyhow::Result<Revision> {
        let mut position = self.position.lock().await;
        self.counted(&mut position).await
    }

    async fn counted(&self, position: &mut Restored) -> anyhow::Result<Revision> {
        let round = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let started = Instant::now();
        let result = self.round(position).await;
        let mut contact = self.contact.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(_) => {
                self.succeeded.store(round, Ordering::SeqCst);
                (contact.at, contact.error) = (Some(started), None);
            }
            Err(err) => contact.error = Some(format!("{err:#}")),
        }
        result
    }

    async fn round(&self, position: &mut Restored) -> anyhow::Result<Revision> {
        let from = position.last_segment;
        let names = segments_after(self.store.as_ref(), from).await?;
        let feeding = self.feeder.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| f.batches.clone());
        let mut target = Committing { replica: self.replica.as_ref(), leases: &self.leases };
        let mut sinks = [Sink::new(&mut target, position, Revision::MAX)];
        let fetched = apply_segments(self.store.as_ref(), &names, &Given::new(), &mut sinks, feeding.is_some()).await;
        if let Some(batches) = feeding.filter(|_| !fetched.is_empty()) {
            // A full queue: the task finds the gap and fetches these itself.
            let _ = batches.try_send(Batch { from, names, fetched });
        }
        match sinks[0].failed.take() {
            Some(err) => Err(err),
            None => Ok(position.revision),
        }
    }

    /// From now on the segments each round fetches are applied to `standby` (a local database
    /// holding a prefix of the store) too, by a task of its own.
    pub fn attach(&self, standby: Standby) {
        let (batches, queue) = mpsc::channel(QUEUED);
        let task = tokio::spawn(standby.feed(self.store.clone(), queue));
        *self.feeder.lock().unwrap_or_else(|p| p.into_inner()) = Some(Feeder { batches, task });
    }

    /// The local database, once every round's segments queued for it are applied; `None` if
    /// none was attached.
    pub async fn detach(&self) -> Option<Standby> {
        let feeder = self.feeder.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        drop(feeder.batches);
        feeder.task.await.ok()
    }

    /// Returns once a round that began after the call succeeded (or this call's own round did):
    /// the copy then holds everything the prefix held when the call came.
    ///
    /// The round runs in a task of its own: a read that gives up (its deadline passed) does not
    /// cut it short.
    pub async fn barrier(self: &Arc<Self>) -> kine_core::Result<()> {
        let arrived = self.begun.load(Ordering::SeqCst);
        if self.succeeded.load(Ordering::SeqCst) > arrived {
            return Ok(());
        }
        let this = self.clone();
        let round = tokio::spawn(async move {
            let mut position = this.position.lock().await;
            if this.succeeded.load(Ordering::SeqCst) > arrived {
                return Ok(());
            }
            this.counted(&mut position).await.map(|_| ())
        });
        let done = round.await.unwrap_or_else(|err| Err(anyhow::anyhow!("the catch-up round failed: {err}")));
        done.map_err(|err| {
            kine_core::Error::Unavailable(format!(
                "etcdserver: request timed out (this node follows the store through S3 and cannot read it: {err:#})"
            ))
        })
    }

    /// How far behind the prefix the copy may be.
    pub fn replication(&self, origin: Arc<str>) -> Replication {
        let contact = self.contact.lock().unwrap_or_else(|p| p.into_inner());
        let since = contact.at.map(|at| at.elapsed().as_secs_f64());
        Replication {
            origin,
            lag_revisions: 0,
            lag_seconds: since.unwrap_or(0.0),
            link_up: contact.error.is_none(),
            link_error: contact.error.clone(),
            last_contact_seconds: since,
        }
    }

    /// The position reached: (revision, last segment applied).
    pub async fn position(&self) -> (Revision, (u64, u64)) {
        let p = self.position.lock().await;
        (p.revision, p.last_segment)
    }
}

/// The copy as where segments are applied: each revision as committed ([`apply_committed`]).
struct Committing<'a> {
    replica: &'a MemoryBackend,
    leases: &'a broadcast::Sender<LeaseUpdate>,
}

#[async_trait::async_trait]
impl Target for Committing<'_> {
    async fn apply(
        &mut self,
        _object: &str,
        records: Vec<Record>,
        _first: Revision,
        end: Revision,
    ) -> anyhow::Result<usize> {
        apply_committed(self.replica, self.leases, records, end).await
    }
}

/// Applies one segment's records to the copy, each revision as it was committed (so that the
/// change log and the watchers get its events); leases, compaction and auth as they come.
async fn apply_committed(
    replica: &MemoryBackend,
    leases: &broadcast::Sender<LeaseUpdate>,
    records: Vec<Record>,
    end: Revision,
) -> anyhow::Result<usize> {
    let mut n = 0;
    let mut pending: Option<(Revision, Vec<Event>)> = None;
    // Consecutive grants (or revokes) go to the copy as one change: a segment of Kubernetes
    // events holds one grant per event.
    let mut granted: Vec<(i64, i64)> = Vec::new();
    let mut revoked: Vec<i64> = Vec::new();
    let flush = |pending: &mut Option<(Revision, Vec<Event>)>| -> anyhow::Result<()> {
        if let Some((revision, events)) = pending.take() {
            replica.apply_committed(revision, events).map_err(e)?;
        }
        Ok(())
    };
    for record in records {
        if !matches!(record, Record::LeaseGrant { .. }) {
            grant(replica, leases, &mut granted).await?;
        }
        if !matches!(record, Record::LeaseRevoke { .. }) {
            revoke(replica, leases, &mut revoked).await?;
        }
        match record {
            Record::Version { revision, deleted, key, create_revision, version, lease, value, .. } => {
                n += 1;
                let kind = if deleted { EventKind::Delete } else { EventKind::Put };
                let kv = KeyValue { key, create_revision, mod_revision: revision, version, value, lease };
                let event = Event { kind, kv, prev_kv: None };
                match &mut pending {
                    Some((r, events)) if *r == revision => events.push(event),
                    _ => {
                        flush(&mut pending)?;
                        pending = Some((revision, vec![event]));
                    }
                }
            }
            Record::LeaseGrant { id, ttl } => {
                flush(&mut pending)?;
                granted.push((id, ttl));
            }
            Record::LeaseRevoke { id } => {
                flush(&mut pending)?;
                revoked.push(id);
            }
            Record::LeasesReset => {
                flush(&mut pending)?;
                let held: Vec<i64> = replica.leases().await.map_err(e)?.into_iter().map(|(id, _)| id).collect();
                for id in &held {
                    let _ = leases.send(LeaseUpdate::Revoked { id: *id });
                }
                lease_change(replica, vec![], held).await?;
            }
            Record::Compact { revision } => {
                flush(&mut pending)?;
                let revisions = replica.revisions().await.map_err(e)?;
                if revision > revisions.compacted && revision <= revisions.current {
                    replica.compact(revision).await.map_err(e)?;
                }
            }
            Record::Auth { data } => {
                flush(&mut pending)?;
                let current = replica.auth_record().await.map_err(e)?;
                replica.auth_replace(current.map(|c| c.version), data).await.map_err(e)?;
            }
            Record::Committed { .. } => flush(&mut pending)?,
        }
    }
    flush(&mut pending)?;
    grant(replica, leases, &mut granted).await?;
    revoke(replica, leases, &mut revoked).await?;
    let current = replica.revisions().await.map_err(e)?.current;
    if current < end {
        // Revisions without a version (none are written today): the store's revision moves on.
        replica
            .write(WriteOp::Import(Import {
                versions: vec![],
                revision: end,
                add_leases: vec![],
                remove_leases: vec![],
            }))
            .await
            .map_err(e)?;
    }
    Ok(n)
}

/// Grants the leases collected in `granted` in the copy, then tells its lease keeper.
async fn grant(
    replica: &MemoryBackend,
    leases: &broadcast::Sender<LeaseUpdate>,
    granted: &mut Vec<(i64, i64)>,
) -> anyhow::Result<()> {
    if granted.is_empty() {
        return Ok(());
    }
    let add = std::mem::take(granted);
    lease_change(replica, add.clone(), vec![]).await?;
    for (id, ttl) in add {
        let _ = leases.send(LeaseUpdate::Renewed { id, ttl });
    }
    Ok(())
}

/// Revokes the leases collected in `revoked` in the copy, then tells its lease keeper.
async fn revoke(
    replica: &MemoryBackend,
    leases: &broadcast::Sender<LeaseUpdate>,
    revoked: &mut Vec<i64>,
) -> anyhow::Result<()> {
    if revoked.is_empty() {
        return Ok(());
    }
    let remove = std::mem::take(revoked);
    lease_change(replica, vec![], remove.clone()).await?;
    for id in remove {
        let _ = leases.send(LeaseUpdate::Revoked { id });
    }
    Ok(())
}

/// Grants or revokes leases in the copy without a revision (an import of no version).
async fn lease_change(replica: &MemoryBackend, add: Vec<(i64, i64)>, remove: Vec<i64>) -> anyhow::Result<()> {
    let revision = replica.revisions().await.map_err(e)?.current;
    let import = Import { versions: vec![], revision, add_leases: add, remove_leases: remove };
    replica.write(WriteOp::Import(import)).await.map_err(e)?;
    Ok(())
}
