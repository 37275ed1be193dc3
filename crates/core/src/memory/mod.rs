//! The in-memory backend (`memory://`): the reference implementation and test oracle.
//! Nothing survives a restart.

mod compaction;
mod events;
mod table;
mod value_file;
mod values;

#[cfg(test)]
mod apply_tests;

pub use compaction::{PlannedKey, TableCompaction};
pub use table::MemTable;

use crate::backend::{AuthRecord, Backend, BackendStatus, FEED_CAPACITY, Revisions};
use crate::error::{Error, Result};
use crate::range;
use crate::request::{RangeRequest, RangeResponse, Revisioned};
use crate::txn::WriteOp;
use crate::txn::WriteResponse;
use crate::types::{KeyRange, LeaseId, Revision, RevisionEvents};
use crate::view::WriteView;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// `memory://`: a [`MemTable`] behind a mutex, with a live feed.
pub struct MemoryBackend {
    table: Mutex<Option<MemTable>>,
    feed: broadcast::Sender<Arc<RevisionEvents>>,
    auth: Mutex<Option<AuthRecord>>,
    cluster_id: u64,
    member_id: u64,
    /// The counts of the next pages of paginated lists.
    page_counts: crate::page_counts::PageCounts,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        Self::with_table(MemTable::default())
    }

    /// A backend over `table` (e.g. one whose values live in a file: `MemTable::at_with_values_in`).
    pub fn with_table(table: MemTable) -> MemoryBackend {
        MemoryBackend {
            table: Mutex::new(Some(table)),
            feed: broadcast::channel(FEED_CAPACITY).0,
            auth: Mutex::new(None),
            cluster_id: crate::id::random_nonzero(),
            member_id: crate::id::random_nonzero(),
            page_counts: Default::default(),
        }
    }

    /// Applies changes another store committed at `revision` (a copy following it): the
    /// events get their previous values, go to the change log and out on the feed.
    pub fn apply_committed(&self, revision: Revision, events: Vec<crate::types::Event>) -> Result<()> {
        self.with(|t| {
            if revision <= t.revision() {
                return Err(Error::InvalidArgument(format!(
                    "revision {revision} is not after the store's {}",
                    t.revision()
                )));
            }
            let ev = t.apply_committed(revision, events)?;
            let _ = self.feed.send(Arc::new(ev));
            Ok(())
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut MemTable) -> Result<T>) -> Result<T> {
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(table) => f(table),
            None => Err(Error::Unavailable("etcdserver: server stopped".into())),
        }
    }
}

#[async_trait::async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }
    fn member_id(&self) -> u64 {
        self.member_id
    }
    async fn revisions(&self) -> Result<Revisions> {
        self.with(|t| Ok(t.revisions()))
    }
    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        self.with(|t| {
            let rev = range::read_revision(req.revision, t.revision(), t.compact_revision())?;
            let value = range::execute_with(t, &req, rev, Some(&self.page_counts))?;
            Ok(Revisioned { revision: t.revision(), value })
        })
    }
    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.with(|t| {
            let applied = t.apply(&op)?;
            if let Some(ev) = applied.events {
                // Published under the lock, so the feed is in revision order.
                let _ = self.feed.send(Arc::new(ev));
            }
            Ok(Revisioned { revision: t.revision(), value: applied.response })
        })
    }
    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.with(|t| {
            t.compact(revision)?;
            Ok(t.revision())
        })
    }
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        self.with(|t| t.events(range, after, until))
    }
    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.feed.subscribe()
    }
    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        self.with(|t| Ok(t.lease_list()))
    }
    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.with(|t| {
            let rev = t.revision();
            t.keys_with_lease(id, rev)
        })
    }
    async fn status(&self) -> Result<BackendStatus> {
        self.with(|t| {
            let size = t.size();
            Ok(BackendStatus { db_size: size as i64, db_size_in_use: size as i64 })
        })
    }
    async fn defragment(&self) -> Result<()> {
        self.with(|_| Ok(()))
    }
    async fn close(&self) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.with(|_| Ok(()))?;
        Ok(self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.with(|_| Ok(()))?;
        let mut record = self.auth.lock().unwrap_or_else(|p| p.into_inner());
        if record.as_ref().map(|r| r.version) != expected {
            return Ok(false);
        }
        *record = Some(AuthRecord { version: expected.unwrap_or(0) + 1, data });
        Ok(true)
    }
}
