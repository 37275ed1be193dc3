//! The narrow, synchronous storage interface the shared KV logic runs on.
//!
//! A backend that can run a serialized write transaction (SQLite, the memory store) implements
//! [`WriteView`] over it; `range` and `txn` then give it etcd's exact semantics for free.

use crate::error::Result;
use crate::types::{Event, KeyRange, KeyValue, LeaseId, Revision};

/// Read access to the key history as of a revision.
pub trait ReadView {
    /// Live keys in `range` as of `revision`, ascending by key, at most `limit` (0 = all).
    /// With `keys_only` the values may be left empty.
    fn scan(&mut self, range: &KeyRange, revision: Revision, limit: usize, keys_only: bool) -> Result<Vec<KeyValue>>;

    /// The number of live keys in `range` as of `revision`.
    fn count(&mut self, range: &KeyRange, revision: Revision) -> Result<i64>;
}

/// One serialized write transaction. Everything appended becomes visible to `scan` at once
/// (a transaction reads its own writes), and only on commit to everyone else.
pub trait WriteView: ReadView {
    /// The last committed revision (the one this transaction builds on).
    fn revision(&self) -> Revision;
    /// The revision the store is compacted to (reads below it fail).
    fn compact_revision(&self) -> Revision;
    /// Keys whose latest live version is attached to `lease` (never 0, "no lease"), as of
    /// `revision`.
    fn keys_with_lease(&mut self, lease: LeaseId, revision: Revision) -> Result<Vec<Vec<u8>>>;
    /// The TTL of a granted lease, if it exists.
    fn lease(&mut self, id: LeaseId) -> Result<Option<i64>>;
    fn insert_lease(&mut self, id: LeaseId, ttl: i64) -> Result<()>;
    fn remove_lease(&mut self, id: LeaseId) -> Result<()>;
    /// Records one change at `revision`; `index` orders the changes of one revision.
    fn append(&mut self, revision: Revision, index: usize, event: &Event) -> Result<()>;
}
