//! What the network databases (PostgreSQL, MySQL) share: the read pool's limits and the state
//! a node's writer, feed and async side share.

use kine_core::backend::LeaseUpdate;
use kine_core::{LeaseId, Revision, RevisionEvents};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// The read pool's limits (kine's `--datastore-*` flags). The writer and the feed hold one
/// connection each besides.
#[derive(Clone, Copy, Debug)]
pub struct PoolOptions {
    /// Idle connections kept.
    pub max_idle: usize,
    /// Connections open at once; `None` = no limit. By default as many as are kept idle: a
    /// pool allowed more connections than it keeps opens and closes one per request whenever
    /// more requests wait than it keeps (256 concurrent gets on PostgreSQL: 3–5 k/s with p99
    /// 0.6–1.7 s without a limit, 8.3–8.5 k/s with p99 53 ms with 16).
    pub max_open: Option<usize>,
    /// Connections are closed after this age; `None` = never.
    pub max_lifetime: Option<Duration>,
    /// Idle connections are closed after this long; `None` = never.
    pub max_idle_time: Option<Duration>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            max_idle: 20,
            max_open: Some(20),
            max_lifetime: None,
            max_idle_time: Some(Duration::from_secs(120)),
        }
    }
}

/// A permit to open one more pooled connection (`--datastore-max-open-connections`), waited
/// for; `None` without a limit.
pub async fn open_permit(
    open: &Option<Arc<tokio::sync::Semaphore>>,
) -> kine_core::Result<Option<tokio::sync::OwnedSemaphorePermit>> {
    match open {
        Some(s) => s.clone().acquire_owned().await.map(Some).map_err(|_| crate::writer::stopped()),
        None => Ok(None),
    }
}

/// State shared by a node's writer, its feed and the async side.
pub struct Shared {
    /// The last revision this node's feed published.
    pub current: AtomicI64,
    pub compacted: AtomicI64,
    pub feed: broadcast::Sender<Arc<RevisionEvents>>,
    /// The database revision the feed has caught up with (for `revisions()` to wait on).
    pub published: watch::Sender<Revision>,
    pub closed: AtomicBool,
    /// Lease changes of every node, for this node's lessor.
    pub lease_updates: broadcast::Sender<LeaseUpdate>,
    /// Each lease's renewal count as this node last heard of it.
    pub lease_seen: Mutex<HashMap<LeaseId, i64>>,
    /// Held while publishing: the feed and the writer both publish (see `publish_own`).
    publishing: Mutex<()>,
}

impl Shared {
    pub fn new(revision: Revision, compacted: Revision) -> Shared {
        Shared {
            current: AtomicI64::new(revision),
            compacted: AtomicI64::new(compacted),
            feed: broadcast::channel(kine_core::backend::FEED_CAPACITY).0,
            published: watch::channel(revision).0,
            closed: AtomicBool::new(false),
            lease_updates: broadcast::channel(1024).0,
            lease_seen: Mutex::new(HashMap::new()),
            publishing: Mutex::new(()),
        }
    }

    /// A feed's catch-up: the revisions after `published` up to the database's `current`, read
    /// in one snapshot with the compact revision. Advances this node's revision before
    /// publishing each revision's events (the `Backend` invariant), then lets `revisions()`
    /// callers waiting for `current` go. Revisions the writer published meanwhile
    /// (`publish_own`) are skipped.
    pub fn publish(&self, published: Revision, current: Revision, compacted: Revision, events: Vec<RevisionEvents>) {
        let _order = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
        if published + 1 < compacted && current > published {
            // Another node compacted history this node had not published yet.
            tracing::error!(published, compacted, "the event feed fell behind a compaction; watches may miss events");
        }
        self.publish_locked(current, compacted, events);
    }

    /// The writer's own commit of the revisions after `base` (gap-free: it held the revision
    /// counter), published at once when nothing is unpublished before them, so that a write's
    /// events are queued for this node's watchers before the write is answered (as etcd does);
    /// otherwise left to the feed, which publishes in revision order.
    pub fn publish_own(&self, base: Revision, compacted: Revision, events: Vec<RevisionEvents>) {
        let Some(last) = events.last().map(|e| e.revision) else { return };
        let _order = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
        if *self.published.borrow() == base {
            self.publish_locked(last, compacted, events);
        }
    }

    fn publish_locked(&self, current: Revision, compacted: Revision, events: Vec<RevisionEvents>) {
        let done = *self.published.borrow();
        self.compacted.fetch_max(compacted, Ordering::SeqCst);
        for ev in events.into_iter().filter(|e| e.revision > done) {
            self.current.store(ev.revision, Ordering::SeqCst);
            let _ = self.feed.send(Arc::new(ev));
        }
        if current > self.current.load(Ordering::SeqCst) {
            self.current.store(current, Ordering::SeqCst);
        }
        self.published.send_replace(current.max(done));
    }

    pub fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, i64>> {
        self.lease_seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long start-up waits for a network database that is not reachable yet.
pub(crate) const START_PATIENCE: Duration = Duration::from_secs(30);

/// The pause between two attempts to reach a database at start-up; an error once `stop` (the
/// process's shutdown signal) fires, so that a stop does not wait out [`START_PATIENCE`].
pub(crate) fn pause_before_retry(stop: Option<&kine_core::shutdown::Shutdown>, database: &str) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        if stop.is_some_and(|s| s.is_triggered()) {
            anyhow::bail!("stopped while waiting for {database} to be reachable");
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}
