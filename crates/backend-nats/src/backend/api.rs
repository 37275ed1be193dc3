//! The `Backend` trait over the replica (reads, watches, leases) and the stream (writes,
//! compaction), and shutting the backend down.

use super::{NatsBackend, timed};
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Promotion, Replication, Revisions, Role};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents, range};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::broadcast;

#[async_trait::async_trait]
impl Backend for NatsBackend {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn cluster_id(&self) -> u64 {
        self.inner.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.inner.member_id
    }

    async fn revisions(&self) -> Result<Revisions> {
        self.inner.barrier().await?;
        Ok(self.inner.table().revisions())
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        // A serializable read is served by this node as it stands, as etcd serves it from a
        // member without asking the leader (possibly stale, never half-applied).
        if req.serializable {
            if self.inner.is_closed() {
                return Err(Error::Unavailable("etcdserver: server stopped".into()));
            }
        } else {
            self.inner.barrier().await?;
        }
        let mut t = self.inner.table();
        let Revisions { current, compacted } = t.revisions();
        let rev = range::read_revision(req.revision, current, compacted)?;
        let value = range::execute_with(&mut *t, &req, rev, Some(&self.page_counts))?;
        Ok(Revisioned { revision: current, value })
    }

    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.inner.check_writable()?;
        if !matches!(op, WriteOp::Txn(_))
            && let Some(refusal) = self.inner.role().refusal()
        {
            return Err(refusal);
        }
        match op {
            WriteOp::LeaseGrant { id, ttl } => self.inner.lease_grant(id, ttl).await,
            WriteOp::LeaseRevoke { id, expired } => self.inner.lease_revoke(id, expired).await,
            txn @ WriteOp::Txn(_) => self.inner.conditional_write(txn).await,
            // Written at sequences equal to their revisions (`import.rs`).
            WriteOp::Import(import) => self.inner.import(import).await,
        }
    }

    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.inner.check_writable()?;
        self.inner.compact(revision).await
    }

    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        self.inner.table().events(range, after, until)
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.inner.feed.subscribe()
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        Ok(self.inner.table().lease_list())
    }

    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.inner.barrier().await?;
        let mut t = self.inner.table();
        let rev = t.revision();
        t.keys_with_lease(id, rev)
    }

    async fn status(&self) -> Result<BackendStatus> {
        let info = timed("read the stream state", self.inner.stream.get_info()).await?;
        let bytes = info.state.bytes as i64;
        Ok(BackendStatus { db_size: bytes, db_size_in_use: bytes })
    }

    async fn defragment(&self) -> Result<()> {
        // JetStream manages its own files; compaction already removed the messages.
        self.inner.check_open()
    }

    async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.abort_tasks();
        // Flush what was published and close the connection (an embedded server is shut down
        // next; the client must not try to reconnect to it).
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.client.flush()).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.client.drain()).await;
    }

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.inner.auth_record().await
    }

    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.inner.check_writable()?;
        self.inner.auth_replace(expected, data).await
    }

    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.member_put(id, record).await
    }

    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        self.inner.member_records().await.map(Some)
    }

    async fn member_delete(&self, id: u64) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.member_delete(id).await
    }

    async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.lease_renew(id, ttl).await
    }

    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        Some(self.inner.lease_updates.subscribe())
    }

    fn role(&self) -> Role {
        self.inner.role()
    }

    fn replication(&self) -> Option<Replication> {
        if !self.inner.is_copy() {
            return None;
        }
        self.inner.replication.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn promote(&self) -> Result<Promotion> {
        self.inner.check_writable()?;
        let promotion = self.inner.promote().await?;
        if !promotion.origin_fenced {
            self.inner.start_fencing();
        }
        Ok(promotion)
    }
}

impl NatsBackend {
    fn abort_tasks(&self) {
        for task in self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            task.abort();
        }
    }
}

impl Drop for NatsBackend {
    fn drop(&mut self) {
        self.abort_tasks();
    }
}
