//! The store as the server sees it while a node ships it to object storage: the local backend,
//! with a compaction that waits until what it removes is shipped, writes refused unless this
//! node holds the writer lock, and (`--s3-sync`) writes acknowledged only once they are in
//! object storage.
//!
//! With `--s3-sync` nothing that is not in object storage is shown either: a change committed
//! locally but not shipped yet is not acknowledged, and is lost if this node dies before it is
//! shipped (the next writer starts from what the bucket holds). So a linearizable read that
//! saw such a change waits until it is shipped before it answers (a serializable one reads as of
//! the newest revision shipped), the store's revision is the revision shipped, and watchers get
//! each revision once it is shipped (from the store's history, after each upload). Reads,
//! watches and writes are then linearizable across a takeover.

use crate::node::Handle;
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Promotion, Replication, Revisions, Role};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, oneshot, watch};

pub struct Durable {
    inner: Arc<dyn Backend>,
    handle: Handle,
    sync: bool,
    /// With `sync`: how long a linearizable read waits for the upload of what it saw.
    read_wait: Duration,
    /// With `sync`: the shipped revisions' events, sent after each upload, and the newest
    /// revision sent.
    shipped_feed: Option<(broadcast::Sender<Arc<RevisionEvents>>, watch::Receiver<Revision>)>,
}

impl Durable {
    /// With `sync`, starts the task that feeds watchers the shipped revisions (needs a Tokio
    /// runtime).
    pub fn new(inner: Arc<dyn Backend>, handle: Handle, sync: bool, read_wait: Duration) -> Durable {
        let shipped_feed = sync.then(|| {
            let feed = broadcast::channel(kine_core::backend::FEED_CAPACITY).0;
            let sent = watch::channel(*handle.shipped.borrow());
            tokio::spawn(feed_shipped(inner.clone(), handle.shipped.clone(), feed.downgrade(), sent.0));
            (feed, sent.1)
        });
        Durable { inner, handle, sync, read_wait, shipped_feed }
    }

    fn shipped(&self) -> Revision {
        *self.handle.shipped.borrow()
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
                "etcdserver: request timed out (the change reached S3 after this node's writer lock ran out; another \
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
        let mut revisions = self.inner.revisions().await?;
        if self.sync {
            revisions.current = revisions.current.min(self.shipped().max(revisions.compacted));
        }
        Ok(revisions)
    }
    async fn range(&self, mut req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        if !self.sync {
            return self.inner.range(req).await;
        }
        let shipped = self.shipped();
        if req.serializable && req.revision <= 0 && self.inner.revisions().await?.current > shipped {
            // May be stale, never waits: as of the newest revision shipped.
            req.revision = shipped;
            let mut read = self.inner.range(req).await?;
            read.revision = shipped;
            return Ok(read);
        }
        // Linearizable: whatever it saw is shipped before it answers.
        let read = self.inner.range(req).await?;
        if read.revision > self.shipped() {
            // Bounded apart from the read itself (an unlimited range may take longer).
            tokio::time::timeout(self.read_wait, self.flush()).await.map_err(|_| Error::TimedOut)??;
        }
        Ok(read)
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
        // The history compaction removes must be in object storage first, and (with `sync`)
        // sent to watchers.
        if *self.handle.shipped.borrow() < revision {
            self.flush().await?;
        }
        if let Some((_, sent)) = &self.shipped_feed {
            let mut sent = sent.clone();
            sent.wait_for(|s| *s >= revision)
                .await
                .map_err(|_| Error::Unavailable("the watch feed of shipped revisions has stopped".into()))?;
        }
        self.inner.compact(revision).await
    }
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        let until = if self.sync { until.min(self.shipped()) } else { until };
        self.inner.events(range, after, until).await
    }
    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        match &self.shipped_feed {
            Some((feed, _)) => feed.subscribe(),
            None => self.inner.subscribe(),
        }
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

/// Sends `feed` the events of each revision once it is shipped, read from `inner`'s history
/// (a compaction waits until they are sent: see `compact`), until the feed's owner is gone.
async fn feed_shipped(
    inner: Arc<dyn Backend>,
    mut shipped: watch::Receiver<Revision>,
    feed: broadcast::WeakSender<Arc<RevisionEvents>>,
    sent: watch::Sender<Revision>,
) {
    let mut last = *shipped.borrow_and_update();
    loop {
        let target = *shipped.borrow_and_update();
        if target > last {
            let Some(feed) = feed.upgrade() else { return };
            match send_history(&*inner, &feed, last, target).await {
                Ok(()) => {
                    last = target;
                    sent.send_replace(last);
                }
                Err(err) => {
                    tracing::warn!(error = %err, after = last, until = target, "cannot read shipped revisions for watchers");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        if feed.upgrade().is_none() || shipped.changed().await.is_err() {
            return;
        }
    }
}

/// Sends `feed` the revisions of `inner`'s history after `after` up to `until` that changed a
/// key (a watcher never gets an empty revision).
pub(crate) async fn send_history(
    inner: &dyn Backend,
    feed: &broadcast::Sender<Arc<RevisionEvents>>,
    after: Revision,
    until: Revision,
) -> Result<()> {
    let batches = inner.events(&KeyRange::all(), after, until).await?;
    for batch in batches.into_iter().filter(|b| b.revision > after && !b.events.is_empty()) {
        let _ = feed.send(Arc::new(batch));
    }
    Ok(())
}
