//! Shipping: what a store committed since the last segment, as the next WAL segment.
//!
//! The shipper reads the store through the core `Backend` API (it knows nothing of SQL): the
//! changes after the last revision shipped, and the store's compact revision, leases and auth
//! record, of which a segment carries what changed (a lease granted without a write makes a
//! segment of its own, whose commit record repeats the last revision). A segment is written
//! create-only, so a second writer in the same term (which the writer lock prevents) could never
//! replace one. A checkpoint holds the leases and the auth record whole.

use crate::segment::{self, Record, Segment};
use bytes::Bytes;
use kine_core::backend::Backend;
use kine_core::{Event, EventKind, KeyRange, LeaseId, Revision};
use kine_objstore::ObjectStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Revisions one segment carries at most (a backlog ships as several).
pub const MAX_REVISIONS: i64 = 2000;

/// What the objects hold so far, as far as the shipper must know it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// The newest revision in object storage.
    pub revision: Revision,
    /// The store's compact revision recorded.
    pub compacted: Revision,
    pub leases: BTreeMap<LeaseId, i64>,
    /// The auth record's data recorded (`None`: none).
    pub auth: Option<Vec<u8>>,
    /// The number of the last segment written in this term.
    pub segment: u64,
}

/// One segment written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shipped {
    pub object: String,
    pub first: Revision,
    pub last: Revision,
    pub bytes: usize,
    pub records: usize,
}

pub struct Shipper {
    store: Arc<dyn ObjectStore>,
    backend: Arc<dyn Backend>,
    term: u64,
    position: Position,
    /// The next segment starts the lease table afresh (a new term's first).
    reset: bool,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// A change as a segment record.
pub fn record(revision: Revision, sub: usize, event: Event) -> Record {
    let kv = event.kv;
    Record::Version {
        revision,
        sub: sub as u32,
        deleted: event.kind == EventKind::Delete,
        key: kv.key,
        create_revision: kv.create_revision,
        version: kv.version,
        lease: kv.lease,
        value: kv.value,
    }
}

/// The records that take `from`'s leases and auth record to `to`'s.
pub fn state_changes(from: &Position, to: &Position) -> Vec<Record> {
    let mut records = Vec::new();
    for (&id, &ttl) in &to.leases {
        if from.leases.get(&id) != Some(&ttl) {
            records.push(Record::LeaseGrant { id, ttl });
        }
    }
    for id in from.leases.keys().filter(|id| !to.leases.contains_key(id)) {
        records.push(Record::LeaseRevoke { id: *id });
    }
    if to.auth != from.auth
        && let Some(data) = &to.auth
    {
        records.push(Record::Auth { data: data.clone() });
    }
    records
}

impl Shipper {
    /// A shipper whose objects hold `position`, writing segments of `term`.
    pub fn new(store: Arc<dyn ObjectStore>, backend: Arc<dyn Backend>, term: u64, position: Position) -> Shipper {
        Shipper { store, backend, term, position, reset: false }
    }

    /// A shipper for a new writer term, whose objects hold every revision up to `shipped` but
    /// whose lease and auth state it does not know: its first segment carries them whole.
    pub fn new_term(store: Arc<dyn ObjectStore>, backend: Arc<dyn Backend>, term: u64, shipped: Revision) -> Shipper {
        let position = Position { revision: shipped, compacted: -1, ..Position::default() };
        Shipper { store, backend, term, position, reset: true }
    }

    pub fn position(&self) -> &Position {
        &self.position
    }

    /// Sets what the objects hold (after a checkpoint recorded the leases and auth whole).
    pub fn set_position(&mut self, position: Position) {
        self.position = position;
    }

    /// The store's leases and auth record now, with `revision` and `compacted`.
    pub async fn state(backend: &dyn Backend) -> anyhow::Result<Position> {
        let revisions = backend.revisions().await.map_err(e)?;
        let leases = backend.leases().await.map_err(e)?.into_iter().collect();
        let auth = backend.auth_record().await.map_err(e)?.map(|r| r.data);
        Ok(Position { revision: revisions.current, compacted: revisions.compacted, leases, auth, segment: 0 })
    }

    /// Writes the next segment: the revisions committed since the last one (at most
    /// [`MAX_REVISIONS`]), with the compaction, lease and auth changes seen meanwhile. `None`
    /// when nothing changed.
    pub async fn ship(&mut self) -> anyhow::Result<Option<Shipped>> {
        self.ship_until(Revision::MAX).await
    }

    /// [`Shipper::ship`], with revisions up to `until` at most.
    pub async fn ship_until(&mut self, until: Revision) -> anyhow::Result<Option<Shipped>> {
        // The state first: a lease granted after this read ships with a later segment.
        let state = Self::state(self.backend.as_ref()).await?;
        let last = state.revision.min(until).min(self.position.revision + MAX_REVISIONS);
        let first = self.position.revision + 1;
        let mut records: Vec<Record> = if last >= first {
            let changes = self.backend.events(&KeyRange::all(), first - 1, last).await.map_err(|err| match err {
                kine_core::Error::Compacted { compact_revision } => anyhow::anyhow!(
                    "the store was compacted at revision {compact_revision} before revisions from {first} on were \
                     shipped: a checkpoint is needed"
                ),
                other => e(other),
            })?;
            changes
                .into_iter()
                .flat_map(|c| c.events.into_iter().enumerate().map(move |(sub, ev)| record(c.revision, sub, ev)))
                .collect()
        } else {
            Vec::new()
        };
        let last = last.max(self.position.revision);
        let mut next = Position { revision: last, segment: self.position.segment + 1, ..state };
        if next.compacted > self.position.compacted && next.compacted <= last {
            records.push(Record::Compact { revision: next.compacted });
        } else {
            next.compacted = self.position.compacted;
        }
        if self.reset {
            records.push(Record::LeasesReset);
        }
        records.extend(state_changes(&self.position, &next));
        if records.is_empty() {
            return Ok(None);
        }
        records.push(Record::Committed { revision: last });
        let segment = Segment { term: self.term, first_revision: first, records };
        let body = segment.encode();
        let object = segment::object_name(self.term, next.segment);
        let bytes = body.len();
        if self.store.put_if_absent(&object, Bytes::from(body)).await?.is_none() {
            anyhow::bail!("{object} exists already: another writer in term {} (two writers?)", self.term);
        }
        (self.position, self.reset) = (next, false);
        Ok(Some(Shipped { object, first, last, bytes, records: segment.records.len() }))
    }
}
