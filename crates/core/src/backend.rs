//! The one seam between the etcd semantics and a datastore.

use crate::error::{Error, Result};
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
    /// etcd's Compact without `physical`: may answer once reads below `revision` fail with
    /// "compacted", while the superseded versions are still being removed. Returns the current
    /// revision.
    async fn compact_logically(&self, revision: Revision) -> Result<Revision> {
        self.compact(revision).await
    }
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

    /// The auth record (etcd's users, roles and auth settings, encoded by `auth::state`) with
    /// its version, or `None` if none was ever written. Not part of the key space: writing it
    /// spends no revision. Every node on the datastore sees the same record.
    async fn auth_record(&self) -> Result<Option<AuthRecord>>;
    /// Replaces the auth record if its version is still `expected` (`None`: no record yet).
    /// Returns `false`, changing nothing, when another writer got there first. A read-only
    /// copy refuses (its `Role::refusal`).
    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool>;

    /// For datastores shared by several nodes: stores this node's member record (opaque bytes,
    /// made by `members`), replacing the one it stored before. Outside the key space (no
    /// revision, no event). A read-only copy stores nothing and answers `Ok`.
    async fn member_put(&self, _id: u64, _record: Vec<u8>) -> Result<()> {
        Ok(())
    }

    /// For shared datastores: every member record stored by any node (`None`: the datastore
    /// serves one node only, this one). A copy lists its origin's.
    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        Ok(None)
    }

    /// For shared datastores: removes a member record (this node's at shutdown, or a long-dead
    /// node's). Removing a missing record is `Ok`.
    async fn member_delete(&self, _id: u64) -> Result<()> {
        Ok(())
    }

    /// For datastores shared by several kine-rs nodes: records a keep-alive so that every
    /// node extends the lease. Single-node backends need nothing.
    async fn lease_renew(&self, _id: LeaseId, _ttl: i64) -> Result<()> {
        Ok(())
    }

    /// For shared datastores: lease changes made by any node (grants, renewals, revocations).
    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        None
    }

    /// What this node may do with its datastore (cheap: asked before every write).
    fn role(&self) -> Role {
        Role::Primary
    }

    /// For a copy: how far it is behind its origin.
    fn replication(&self) -> Option<Replication> {
        None
    }

    /// Turns a copy into a writable primary (etcd's MemberPromote of a learner). Returns once
    /// this node accepts writes.
    async fn promote(&self) -> Result<Promotion> {
        Err(Error::NotLearner)
    }
}

/// The stored auth record: opaque bytes and the version `auth_replace` compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthRecord {
    pub version: u64,
    pub data: Vec<u8>,
}

/// What a node may do with its datastore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads and writes.
    Primary,
    /// Reads only: a copy that follows another datastore asynchronously (what etcd calls a
    /// learner). `origin` names what it copies, for error messages and logs.
    Copy { origin: Arc<str> },
    /// Reads only: a copy of this datastore was promoted to primary in its place. `by` says which
    /// and at what revision.
    Superseded { by: Arc<str> },
}

impl Role {
    /// The error a write gets from a node in this role (`None`: writes are served). The code and
    /// the start of the text are etcd's for a learner.
    pub fn refusal(&self) -> Option<Error> {
        match self {
            Role::Primary => None,
            Role::Copy { origin } => Some(Error::ReadOnly(format!(
                "this kine-rs node serves a read-only copy of {origin}; write to the origin"
            ))),
            Role::Superseded { by } => Some(Error::ReadOnly(format!(
                "this datastore was superseded by {by}; it is read-only here (see docs/nats.md, \"Promotion\")"
            ))),
        }
    }

    pub fn is_learner(&self) -> bool {
        !matches!(self, Role::Primary)
    }
}

/// How far a copy is behind its origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Replication {
    /// What the copy follows.
    pub origin: Arc<str>,
    /// Revisions the origin holds that this copy has not applied yet.
    pub lag_revisions: i64,
    /// How old the copy's view may be: 0 when it holds everything the origin has, else the age
    /// of the newest change it applied (an upper bound, in the origin's clock).
    pub lag_seconds: f64,
    /// The link to the origin works (the copy heard from it recently and reports no error).
    pub link_up: bool,
    /// Why the link is down, when known.
    pub link_error: Option<String>,
    /// Seconds since the copy last heard from its origin (`None`: never).
    pub last_contact_seconds: Option<f64>,
}

/// What a promotion did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    /// The revision the new primary continues from.
    pub revision: Revision,
    /// Whether the old origin was reached and told it is superseded (else it is told once it
    /// can be reached).
    pub origin_fenced: bool,
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
