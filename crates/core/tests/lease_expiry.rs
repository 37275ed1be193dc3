//! Lease expiry on the memory backend with tokio's clock paused: deterministic, no sleeping.

use kine_core::memory::MemoryBackend;
use kine_core::request::{PutRequest, RangeRequest};
use kine_core::shutdown;
use kine_core::store::{Store, StoreOptions};
use kine_core::{Error, KeyRange};
use std::sync::Arc;
use std::time::Duration;

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
