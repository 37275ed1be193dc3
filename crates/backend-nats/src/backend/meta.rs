//! `<bucket>-meta`, a KV bucket beside the stream: leases (`lease.<id>` → TTL), the compact
//! revision, the auth record (`auth`, read when asked for: `auth.rs`), the member registry
//! (`member.<id>`, read when asked for: `members.rs`), and the records of a
//! promotion (`promoted`, on a promoted copy) and of being superseded by one (`superseded`, on
//! its old origin). None of it is an etcd write, so none of it spends a revision. Every node
//! follows it.

use super::auth::AUTH;
use super::members::is_member;
use super::{Inner, NATS_TIMEOUT, unavailable};
use async_nats::jetstream;
use futures_util::StreamExt;
use kine_core::backend::LeaseUpdate;
use kine_core::request::{DeleteRangeRequest, RequestOp, Revisioned, TxnRequest};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, KeyRange, LeaseId, Result, Revision};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The key of the compact revision.
pub(super) const COMPACT_REVISION: &str = "compact_revision";

/// The key of a promotion record (see `promote.rs`).
pub(super) const PROMOTED: &str = "promoted";
/// The key of the record a promoted copy leaves in its old origin's meta bucket.
pub(super) const SUPERSEDED: &str = "superseded";

/// Follows `<bucket>-meta` until the backend closes: leases granted, renewed or revoked,
/// compactions, and supersession, by any node.
pub(super) async fn follow(inner: Arc<Inner>, mut watch: jetstream::kv::Watch) {
    loop {
        match watch.next().await {
            Some(Ok(entry)) => inner.on_meta(&entry).await,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "meta bucket watch failed; re-creating it");
                tokio::time::sleep(Duration::from_secs(1)).await;
                match inner.meta.watch_with_history(">").await {
                    Ok(w) => watch = w,
                    Err(e) => tracing::warn!(error = %e, "cannot watch the meta bucket"),
                }
            }
            None => {
                if inner.closed.load(Ordering::SeqCst) {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Ok(w) = inner.meta.watch_with_history(">").await {
                    watch = w;
                }
            }
        }
    }
}

impl Inner {
    async fn on_meta(&self, entry: &jetstream::kv::Entry) {
        let put = entry.operation == jetstream::kv::Operation::Put;
        match entry.key.as_str() {
            COMPACT_REVISION if put => {
                if let Some(rev) = std::str::from_utf8(&entry.value).ok().and_then(|s| s.parse::<Revision>().ok()) {
                    self.on_compacted(rev).await;
                }
            }
            SUPERSEDED if put => self.on_superseded(&entry.value),
            COMPACT_REVISION | SUPERSEDED | PROMOTED | AUTH => {}
            key if is_member(key) => {}
            _ => self.apply_lease(entry),
        }
    }

    /// A compaction recorded by any node (on a copy: by the origin).
    async fn on_compacted(&self, rev: Revision) {
        if self.is_copy() {
            // A copy's meta bucket is a mirror of its own, which may run ahead of the stream's:
            // the copy compacts once its replica holds `rev` (`copy.rs`).
            self.pending_compaction.send_if_modified(|p| {
                let newer = rev > *p;
                *p = (*p).max(rev);
                newer
            });
            return;
        }
        // Compact once the replica holds everything the stream has (messages up to `rev` that
        // it never saw were removed by that compaction).
        match self.barrier().await {
            Ok(()) => {
                self.table().advance(rev);
                if let Err(e) = self.compact_table(rev).await {
                    tracing::warn!(error = %e, revision = rev, "cannot apply a compaction made by another node");
                }
            }
            Err(e) => tracing::warn!(error = %e, revision = rev, "cannot apply a compaction made by another node yet"),
        }
    }

    /// Applies one lease record (newer KV revisions only).
    pub(super) fn apply_lease(&self, entry: &jetstream::kv::Entry) {
        let Some(id) = entry.key.strip_prefix("lease.").and_then(|s| s.parse::<LeaseId>().ok()) else { return };
        let mut revs = self.lease_revs.lock().unwrap_or_else(|p| p.into_inner());
        if revs.get(&id).is_some_and(|r| *r >= entry.revision) {
            return;
        }
        match entry.operation {
            jetstream::kv::Operation::Put => {
                let Some(ttl) = std::str::from_utf8(&entry.value).ok().and_then(|s| s.parse::<i64>().ok()) else {
                    return;
                };
                revs.insert(id, entry.revision);
                let _ = self.table().insert_lease(id, ttl);
                let _ = self.lease_updates.send(LeaseUpdate::Renewed { id, ttl });
            }
            jetstream::kv::Operation::Delete | jetstream::kv::Operation::Purge => {
                revs.insert(id, entry.revision);
                let _ = self.table().remove_lease(id);
                let _ = self.lease_updates.send(LeaseUpdate::Revoked { id });
            }
        }
    }

    pub(super) async fn lease_grant(&self, id: LeaseId, ttl: i64) -> Result<Revisioned<WriteResponse>> {
        let inner = self;
        let key = format!("lease.{id}");
        match tokio::time::timeout(NATS_TIMEOUT, inner.meta.create(&key, ttl.to_string().into())).await {
            Ok(Ok(rev)) => {
                inner.lease_revs.lock().unwrap_or_else(|p| p.into_inner()).insert(id, rev);
            }
            Ok(Err(e)) if e.kind() == jetstream::kv::CreateErrorKind::AlreadyExists => return Err(Error::LeaseExists),
            Ok(Err(e)) => return Err(unavailable(format!("grant lease: {e}"))),
            Err(_) => return Err(unavailable("grant lease: timed out")),
        }
        inner.table().insert_lease(id, ttl)?;
        Ok(Revisioned { revision: inner.table().revision(), value: WriteResponse::LeaseGranted })
    }

    /// Revokes a lease: first its record (for an expiry, only if no node renewed it since this
    /// node last saw it — so exactly one node revokes an expired lease), then its keys.
    pub(super) async fn lease_revoke(&self, id: LeaseId, expired: bool) -> Result<Revisioned<WriteResponse>> {
        let inner = self;
        inner.barrier().await?;
        if inner.table().lease(id)?.is_none() {
            return Err(Error::LeaseNotFound);
        }
        let key = format!("lease.{id}");
        let seen = inner.lease_revs.lock().unwrap_or_else(|p| p.into_inner()).get(&id).copied();
        let expect = if expired { seen } else { None };
        match tokio::time::timeout(NATS_TIMEOUT, inner.meta.delete_expect_revision(&key, expect)).await {
            Ok(Ok(())) => {}
            // Renewed or revoked by another node meanwhile (or that node's revoke is still in
            // flight: the replicated stream's variant, 10164): not ours to revoke.
            Ok(Err(e))
                if expired
                    && (e.kind() == jetstream::kv::DeleteErrorKind::WrongLastRevision
                        || e.to_string().contains("wrong last sequence")) =>
            {
                return Err(Error::LeaseNotFound);
            }
            Ok(Err(e)) => return Err(unavailable(format!("revoke lease: {e}"))),
            Err(_) => return Err(unavailable("revoke lease: timed out")),
        }
        inner.table().remove_lease(id)?;
        let keys = {
            let mut t = inner.table();
            let rev = t.revision();
            t.keys_with_lease(id, rev)?
        };
        let mut revision = inner.table().revision();
        if !keys.is_empty() {
            let txn = TxnRequest {
                success: keys
                    .into_iter()
                    .map(|k| RequestOp::DeleteRange(DeleteRangeRequest { range: KeyRange::single(k), prev_kv: false }))
                    .collect(),
                ..Default::default()
            };
            revision = inner.conditional_write(WriteOp::Txn(txn)).await?.revision;
        }
        Ok(Revisioned { revision, value: WriteResponse::LeaseRevoked })
    }

    pub(super) async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.check_open()?;
        if let Some(refusal) = self.role().refusal() {
            return Err(refusal);
        }
        let rev = super::timed("renew lease", self.meta.put(format!("lease.{id}"), ttl.to_string().into())).await?;
        self.lease_revs.lock().unwrap_or_else(|p| p.into_inner()).insert(id, rev);
        Ok(())
    }
}
