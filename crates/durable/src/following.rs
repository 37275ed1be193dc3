//! The store as the server sees it on a node that found another holding the S3 writer lock:
//! a read-only copy (an etcd learner: writes refused with the writer's address) served from
//! [`Copy`] until this node takes the lock, then the local database (kept current meanwhile,
//! `standby.rs`), shipped as any writer's. The server, its watches and its leases carry on across the switch: the feed
//! the server subscribed to is this wrapper's own, fed from whichever store is current, with
//! any revisions in between read from that store's history.

use crate::copy::Copy;
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Promotion, Replication, Revisions, Role};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use tokio::sync::{broadcast, watch};

pub struct Following {
    current: RwLock<Arc<dyn Backend>>,
    /// `Some` while this node follows.
    copy: RwLock<Option<Arc<Copy>>>,
    /// The writer followed, for errors and status.
    origin: RwLock<Arc<str>>,
    feed: broadcast::Sender<Arc<RevisionEvents>>,
    leases: broadcast::Sender<LeaseUpdate>,
    /// Bumped at the switch (and at close: `u64::MAX`), for the task feeding `feed`.
    switched: watch::Sender<u64>,
    cluster_id: AtomicU64,
    member_id: u64,
    name: &'static str,
}

/// How the writer is named in errors.
pub fn origin(node: &str, address: &str) -> Arc<str> {
    Arc::from(format!("the S3 store's writer {node} at {address}"))
}

impl Following {
    /// Serves `copy`; `local` (the database this node will write once it holds the lock) lends
    /// its name and member id. `leases` must be the sender `copy` was opened with.
    pub async fn new(
        copy: Arc<Copy>,
        local: &dyn Backend,
        cluster_id: u64,
        origin: Arc<str>,
        leases: broadcast::Sender<LeaseUpdate>,
    ) -> Result<Arc<Following>> {
        let replica: Arc<dyn Backend> = copy.replica();
        let from = replica.revisions().await?.current;
        let following = Arc::new(Following {
            current: RwLock::new(replica),
            copy: RwLock::new(Some(copy)),
            origin: RwLock::new(origin),
            feed: broadcast::channel(kine_core::backend::FEED_CAPACITY).0,
            leases,
            switched: watch::channel(0).0,
            cluster_id: AtomicU64::new(cluster_id),
            member_id: local.member_id(),
            name: local.name(),
        });
        tokio::spawn(forward(Arc::downgrade(&following), following.switched.subscribe(), from));
        Ok(following)
    }

    pub fn lease_sender(&self) -> broadcast::Sender<LeaseUpdate> {
        self.leases.clone()
    }

    fn current(&self) -> Arc<dyn Backend> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn copy(&self) -> Option<Arc<Copy>> {
        self.copy.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_origin(&self, origin: Arc<str>) {
        *self.origin.write().unwrap_or_else(|p| p.into_inner()) = origin;
    }

    fn refused(&self) -> Result<()> {
        match self.role().refusal() {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// From now on `writer` (the local database, restored and shipped) is served; watches and
    /// leases carry over.
    pub async fn take_over(&self, writer: Arc<dyn Backend>) {
        let leases = writer.leases().await.unwrap_or_default();
        self.cluster_id.store(writer.cluster_id(), Ordering::SeqCst);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = writer;
        self.copy.write().unwrap_or_else(|p| p.into_inner()).take();
        self.switched.send_modify(|n| *n += 1);
        // Every lease the writer holds gets its whole TTL again (as after an etcd leader change).
        for (id, ttl) in leases {
            let _ = self.leases.send(LeaseUpdate::Renewed { id, ttl });
        }
    }
}

/// Feeds the wrapper's feed from the current store: its live feed in order, and its history for
/// any revisions not seen there (an import's, a lag, or the switch to the writer).
async fn forward(this: Weak<Following>, mut switched: watch::Receiver<u64>, mut last: Revision) {
    loop {
        if *switched.borrow_and_update() == u64::MAX {
            return;
        }
        let Some((inner, feed)) = this.upgrade().map(|f| (f.current(), f.feed.clone())) else { return };
        let mut live = inner.subscribe();
        fill(inner.as_ref(), &feed, &mut last, None).await;
        loop {
            tokio::select! {
                received = live.recv() => match received {
                    Ok(batch) if batch.revision <= last => {}
                    Ok(batch) if batch.revision == last + 1 && !batch.events.is_empty() => {
                        last = batch.revision;
                        let _ = feed.send(batch);
                    }
                    Ok(batch) => fill(inner.as_ref(), &feed, &mut last, Some(batch.revision)).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => fill(inner.as_ref(), &feed, &mut last, None).await,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                changed = switched.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

/// Sends the revisions after `last` up to `until` (default: the store's current one) from the
/// store's history.
async fn fill(
    inner: &dyn Backend,
    feed: &broadcast::Sender<Arc<RevisionEvents>>,
    last: &mut Revision,
    until: Option<Revision>,
) {
    let until = match until {
        Some(until) => until,
        None => match inner.revisions().await {
            Ok(r) => r.current,
            Err(err) => return tracing::warn!(error = %err, "cannot read the store's revision for its watchers"),
        },
    };
    if until <= *last {
        return;
    }
    match crate::backend::send_history(inner, feed, *last, until).await {
        Ok(()) => *last = until,
        Err(err) => tracing::warn!(error = %err, after = *last, until, "cannot read history for watchers"),
    }
}

#[async_trait::async_trait]
impl Backend for Following {
    fn name(&self) -> &'static str {
        self.name
    }
    fn cluster_id(&self) -> u64 {
        self.cluster_id.load(Ordering::SeqCst)
    }
    fn member_id(&self) -> u64 {
        self.member_id
    }
    async fn revisions(&self) -> Result<Revisions> {
        self.current().revisions().await
    }
    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        // A linearizable read sees everything in the prefix when it came; a serializable one
        // what the copy holds.
        if let Some(copy) = self.copy()
            && !req.serializable
        {
            copy.barrier().await?;
        }
        self.current().range(req).await
    }
    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.refused()?;
        self.current().write(op).await
    }
    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.refused()?;
        self.current().compact(revision).await
    }
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        self.current().events(range, after, until).await
    }
    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.feed.subscribe()
    }
    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        self.current().leases().await
    }
    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.current().lease_keys(id).await
    }
    async fn status(&self) -> Result<BackendStatus> {
        self.current().status().await
    }
    async fn defragment(&self) -> Result<()> {
        self.current().defragment().await
    }
    async fn close(&self) {
        self.switched.send_replace(u64::MAX);
        if let Some(copy) = self.copy() {
            copy.replica().close().await;
        }
        self.current().close().await
    }
    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.current().auth_record().await
    }
    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.refused()?;
        self.current().auth_replace(expected, data).await
    }
    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.current().member_put(id, record).await
    }
    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        self.current().member_records().await
    }
    async fn member_delete(&self, id: u64) -> Result<()> {
        self.current().member_delete(id).await
    }
    async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.current().lease_renew(id, ttl).await
    }
    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        Some(self.leases.subscribe())
    }
    fn role(&self) -> Role {
        if self.copy().is_some() {
            return Role::Copy { origin: self.origin.read().unwrap_or_else(|p| p.into_inner()).clone() };
        }
        self.current().role()
    }
    fn replication(&self) -> Option<Replication> {
        match self.copy() {
            Some(copy) => Some(copy.replication(self.origin.read().unwrap_or_else(|p| p.into_inner()).clone())),
            None => self.current().replication(),
        }
    }
    async fn promote(&self) -> Result<Promotion> {
        if self.copy().is_some() {
            return Err(Error::Unavailable(
                "a node following an S3 store becomes its writer only once the writer's lock runs out: stop the \
                 writer to hand over"
                    .into(),
            ));
        }
        self.current().promote().await
    }
}
