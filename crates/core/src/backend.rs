//! The one seam between the etcd semantics and a datastore.

use crate::error::Result;
use crate::request::{RangeRequest, RangeResponse, Revisioned};
use crate::txn::{WriteOp, WriteResponse};
use crate::types::{KeyRange, LeaseId, Revision, RevisionEvents};
use std::sync::Arc;
use tokio::sync::broadcast;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Revisions {
    /// The last committed revision (1 for an empty store).
    pub current: Revision,
    /// Reads below this revision fail with "compacted"; -1 when never compacted (as etcd's
    /// first revision: `Compact(0)` then succeeds once, and a Txn's Range at revision -1 works).
    pub compacted: Revision,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendStatus {
    /// Bytes the datastore occupies.
    pub db_size: i64,
    /// Bytes of it holding live data (the rest is reclaimable by defragmentation).
    pub db_size_in_use: i64,
}

/// A datastore holding the revisioned key space, leases and the event feed.
///
/// Architecture invariants every implementation keeps:
/// - it is the source of truth for revisions, which are gap-free: one per write that changes
///   a key, none for anything else (leases, bookkeeping);
/// - `write` is atomic: on error nothing changed;
/// - the current revision is advanced *before* that revision's events are published, and
///   events are published in revision order, so a subscriber that reads `revisions()` after
///   subscribing misses nothing.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short name for logs and status ("sqlite", "memory").
    fn name(&self) -> &'static str;
    /// Stable, non-zero id of the datastore.
    fn cluster_id(&self) -> u64;
    /// Stable, non-zero id of this node.
    fn member_id(&self) -> u64;
    /// The revisions a read issued now would see (after any write acknowledged before the call).
    async fn revisions(&self) -> Result<Revisions>;
    /// A Range (already validated). The revision is the store's current revision.
    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>>;
    /// A write through the serialized writer. The revision is the store's revision after it.
    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>>;
    /// Physically removes every version superseded at or before `revision`, and every deletion
    /// at or before it. Returns the current revision.
    async fn compact(&self, revision: Revision) -> Result<Revision>;
    /// Committed events in `range` with `after < revision <= until`, grouped by revision.
    /// Fails with `Compacted` if `after + 1` is below the compact revision.
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>>;
    /// The live feed: every committed revision's events, in order.
    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>>;
    /// Every granted lease with its TTL in seconds.
    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>>;
    /// Keys whose current version is attached to the lease.
    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>>;
    async fn status(&self) -> Result<BackendStatus>;
    /// Gives unused space back to the operating system.
    async fn defragment(&self) -> Result<()>;
    /// Flushes and releases resources; later calls fail with `Unavailable`.
    async fn close(&self);

    /// For datastores shared by several kine-rs nodes: records a keep-alive so that every
    /// node extends the lease. Single-node backends need nothing.
    async fn lease_renew(&self, _id: LeaseId, _ttl: i64) -> Result<()> {
        Ok(())
    }

    /// For shared datastores: lease changes made by any node (grants, renewals, revocations).
    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        None
    }
}

/// A lease change seen in a shared datastore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseUpdate {
    /// Granted or renewed (by any node): the TTL starts again.
    Renewed {
        id: LeaseId,
        ttl: i64,
    },
    Revoked {
        id: LeaseId,
    },
}

/// Capacity of a backend's live feed. A subscriber that falls further behind re-reads the gap
/// from history (see `watch`), so this bounds memory, not correctness.
pub const FEED_CAPACITY: usize = 1024;
