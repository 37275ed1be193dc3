//! Lease expiry on the memory backend with tokio's clock paused: deterministic, no sleeping.

use kine_core::backend::{AuthRecord, Backend, BackendStatus, Revisions};
use kine_core::memory::MemoryBackend;
use kine_core::request::{PutRequest, RangeRequest, RangeResponse, Revisioned};
use kine_core::shutdown;
use kine_core::store::{Store, StoreOptions};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::broadcast;

async fn count(s: &Store) -> i64 {
    s.range(RangeRequest::new(KeyRange::all())).await.unwrap().value.count
}

#[tokio::test(start_paused = true)]
async fn leases_expire_on_time_and_keep_alive_extends_them() {
    let store = Store::open(Arc::new(MemoryBackend::new()), StoreOptions::default()).await.unwrap();
    let (trigger, stop) = shutdown::channel();
    let tasks = store.spawn_tasks(&stop);
    let (short, ttl, _) = store.lease_grant(0, 5).await.unwrap();
    assert_eq!(ttl, 5);
    let (kept, _, _) = store.lease_grant(0, 5).await.unwrap();
    for (key, lease) in [("a", short), ("b", kept)] {
        store.put(PutRequest { key: key.into(), value: b"v".to_vec(), lease, ..Default::default() }).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(store.lease_keep_alive(kept).await.unwrap(), 5);
    assert_eq!(count(&store).await, 2);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // `short` expired at 5 s: its key is gone, in one revision (rev 4).
    assert_eq!(count(&store).await, 1);
    assert_eq!(store.current_revision().await.unwrap(), 4);
    assert!(matches!(store.lease_keep_alive(short).await, Err(Error::LeaseNotFound)));
    let ttl = store.lease_time_to_live(kept, false).await.unwrap().unwrap();
    assert_eq!(ttl.ttl, 3);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(count(&store).await, 0);
    assert!(store.lease_list().is_empty());
    trigger.trigger();
    for t in tasks {
        t.await.unwrap();
    }
}

/// The memory backend, with lease revokes failing (as on a datastore out of reach) until told,
/// and each taking `delay`.
struct RevokesFail {
    inner: MemoryBackend,
    failing: AtomicBool,
    attempts: AtomicUsize,
    delay: Duration,
}

#[async_trait::async_trait]
impl Backend for RevokesFail {
    fn name(&self) -> &'static str {
        "revokes-fail"
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
        if matches!(op, WriteOp::LeaseRevoke { .. }) {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if self.failing.load(Ordering::SeqCst) {
                return Err(Error::Unavailable("etcdserver: request timed out".into()));
            }
        }
        self.inner.write(op).await
    }
    async fn compact(&self, revision: Revision) -> Result<Revision> {
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
        self.inner.auth_replace(expected, data).await
    }
}

impl RevokesFail {
    fn new(failing: bool, delay: Duration) -> Arc<RevokesFail> {
        let (failing, attempts) = (AtomicBool::new(failing), AtomicUsize::new(0));
        Arc::new(RevokesFail { inner: MemoryBackend::new(), failing, attempts, delay })
    }
}

/// A lease of 2 s with key "a", 100 ms past its deadline (the clock paused).
async fn expired_lease_with_a_key(store: &Store) -> LeaseId {
    let (lease, _, _) = store.lease_grant(0, 2).await.unwrap();
    store.put(PutRequest { key: "a".into(), value: b"v".to_vec(), lease, ..Default::default() }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    lease
}

/// A revoke that fails is tried again once a second, not in a loop (which, with the clock
/// paused, would never let time advance: the test would hang), and succeeds once it can.
#[tokio::test(start_paused = true)]
async fn a_failing_revoke_is_retried_every_second() {
    let backend = RevokesFail::new(true, Duration::ZERO);
    let store = Store::open(backend.clone(), StoreOptions::default()).await.unwrap();
    let (trigger, stop) = shutdown::channel();
    let tasks = store.spawn_tasks(&stop);
    expired_lease_with_a_key(&store).await;
    assert_eq!(backend.attempts.load(Ordering::SeqCst), 1, "the first attempt, at expiry");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let attempts = backend.attempts.load(Ordering::SeqCst);
    assert!((5..=7).contains(&attempts), "one attempt a second, not {attempts}");
    assert_eq!(count(&store).await, 1, "not revoked while revokes fail");
    backend.failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(count(&store).await, 0, "revoked once it can be");
    assert!(store.lease_list().is_empty());
    trigger.trigger();
    for t in tasks {
        t.await.unwrap();
    }
}

/// A time-to-live question about a lease whose revoke is under way is answered once the revoke
/// is done (the lease gone with its keys), as etcd deletes both at once: a client that saw the
/// keys' deletion never finds the lease alive afterwards. While revokes fail, it answers TTL 0
/// after a second.
#[tokio::test(start_paused = true)]
async fn time_to_live_of_an_expired_lease_waits_for_its_revoke() {
    let backend = RevokesFail::new(false, Duration::from_millis(300));
    let store = Store::open(backend.clone(), StoreOptions::default()).await.unwrap();
    let (trigger, stop) = shutdown::channel();
    let tasks = store.spawn_tasks(&stop);
    let lease = expired_lease_with_a_key(&store).await;
    assert_eq!(backend.attempts.load(Ordering::SeqCst), 1, "the revoke is under way");
    let asked = tokio::time::Instant::now();
    assert_eq!(store.lease_time_to_live(lease, false).await.unwrap(), None);
    assert_eq!(count(&store).await, 0, "answered after the keys were deleted");
    assert!(asked.elapsed() <= Duration::from_millis(300), "waited {:?}", asked.elapsed());

    backend.failing.store(true, Ordering::SeqCst);
    let lease = expired_lease_with_a_key(&store).await;
    let asked = tokio::time::Instant::now();
    let ttl = store.lease_time_to_live(lease, false).await.unwrap().expect("not revoked");
    assert_eq!((ttl.ttl, ttl.granted_ttl), (0, 2));
    assert_eq!(asked.elapsed(), Duration::from_secs(1), "waited for the revoke that long");
    trigger.trigger();
    for t in tasks {
        t.await.unwrap();
    }
}
