//! The store as the server sees it while a node ships it to object storage: the local backend,
//! with a compaction that waits until what it removes is shipped, writes refused unless this
//! node holds the writer lock, and (`--s3-sync`) writes acknowledged only once they are in
//! object storage.

use crate::node::Handle;
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Promotion, Replication, Revisions, Role};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents};
use std::sync::Arc;
use tokio::sync::{broadcast, oneshot};

pub struct Durable {
    inner: Arc<dyn Backend>,
    handle: Handle,
    sync: bool,
}

impl Durable {
    pub fn new(inner: Arc<dyn Backend>, handle: Handle, sync: bool) -> Durable {
        Durable { inner, handle, sync }
    }

    /// Writes only while this node holds the writer lock (another may hold it once its lease
    /// ran out).
    fn fenced(&self) -> Result<()> {
        if self.handle.held.borrow().valid() {
            Ok(())
        } else {
            Err(Error::Unavailable("this node no longer holds the S3 writer lock".into()))
        }
    }

    /// Waits until everything committed so far is in object storage, uploaded while this node
    /// still held the writer lock: an upload that S3 completed after the lease ran out may
    /// have come after another node started its term from what S3 held, and is not part of the
    /// store's history (restore skips it), so the write is not acknowledged.
    async fn flush(&self) -> Result<()> {
        let (tell, told) = oneshot::channel();
        let stopped = || Error::Unavailable("shipping to S3 has stopped".into());
        self.handle.flush.send(tell).await.map_err(|_| stopped())?;
        told.await.map_err(|_| stopped())?;
        if !self.handle.held.borrow().valid() {
            return Err(Error::Unavailable(
                "etcdserver: request timed out (the write reached S3 after this node's writer lock ran out; another \
                 node may have taken over without it)"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Backend for Durable {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn cluster_id(&self) -> u64 {
        self.inner.cluster_id()
    }
    fn member_id(&self) -> u64 {
        self.inner.member_id()
    }
    async fn revisions(&self) -> Result<Revisions> {
        self.inner.revisions().await
    }
    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        self.inner.range(req).await
    }
    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.fenced()?;
        let written = self.inner.write(op).await?;
        if self.sync {
            self.flush().await?;
        }
        Ok(written)
    }
    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.fenced()?;
        // The history compaction removes must be in object storage first.
        if *self.handle.shipped.borrow() < revision {
            self.flush().await?;
        }
        self.inner.compact(revision).await
    }
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        self.inner.events(range, after, until).await
    }
    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.inner.subscribe()
    }
    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        self.inner.leases().await
    }
    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.inner.lease_keys(id).await
    }
    async fn status(&self) -> Result<BackendStatus> {
        self.inner.status().await
    }
    async fn defragment(&self) -> Result<()> {
        self.inner.defragment().await
    }
    async fn close(&self) {
        self.inner.close().await
    }
    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.inner.auth_record().await
    }
    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.fenced()?;
        let replaced = self.inner.auth_replace(expected, data).await?;
        if self.sync && replaced {
            self.flush().await?;
        }
        Ok(replaced)
    }
    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.inner.member_put(id, record).await
    }
    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        self.inner.member_records().await
    }
    async fn member_delete(&self, id: u64) -> Result<()> {
        self.inner.member_delete(id).await
    }
    async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.inner.lease_renew(id, ttl).await
    }
    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        self.inner.lease_updates()
    }
    fn role(&self) -> Role {
        self.inner.role()
    }
    fn replication(&self) -> Option<Replication> {
        self.inner.replication()
    }
    async fn promote(&self) -> Result<Promotion> {
        self.inner.promote().await
    }
}
