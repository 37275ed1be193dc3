//! The watch session on the memory backend: a client that stops reading while thousands of
//! revisions commit overflows the live feed, and must then get everything from history, in
//! order, exactly once.

use kine_core::KeyRange;
use kine_core::memory::MemoryBackend;
use kine_core::request::PutRequest;
use kine_core::shutdown;
use kine_core::store::{Store, StoreOptions};
use kine_core::watch::{WatchCreate, WatchRequest, WatchResponse};
use std::sync::Arc;
use tokio::sync::mpsc;

#[tokio::test]
async fn slow_client_catches_up_from_history_after_feed_overflow() {
    let store = Store::open(Arc::new(MemoryBackend::new()), StoreOptions::default()).await.unwrap();
    let (_trigger, stop) = shutdown::channel();
    let (req_tx, req_rx) = mpsc::channel(8);
    let (out_tx, mut out_rx) = mpsc::channel(1);
    store.watch(req_rx, out_tx, stop);
    req_tx
        .send(WatchRequest::Create(WatchCreate {
            watch_id: 0,
            range: KeyRange::all(),
            start_revision: 0,
            prev_kv: true,
            progress_notify: false,
            no_put: false,
            no_delete: false,
            fragment: false,
        }))
        .await
        .unwrap();
    assert!(matches!(out_rx.recv().await, Some(WatchResponse::Created { revision: 1, .. })));
    // Far more revisions than the feed holds, while nobody reads.
    let total = 5000;
    for i in 0..total {
        store
            .put(PutRequest { key: format!("k{}", i % 50).into_bytes(), value: b"v".to_vec(), ..Default::default() })
            .await
            .unwrap();
    }
    let mut next = 2;
    while next < total + 2 {
        match out_rx.recv().await.unwrap() {
            WatchResponse::Events { events, .. } => {
                for e in events {
                    assert_eq!(e.kv.mod_revision, next, "in order, none lost, none repeated");
                    assert_eq!(e.prev_kv.is_some(), next > 51, "prev_kv present once the key existed");
                    next += 1;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A progress request now reports the final revision.
    req_tx.send(WatchRequest::Progress).await.unwrap();
    assert_eq!(out_rx.recv().await.unwrap(), WatchResponse::Progress { watch_id: -1, revision: total + 1 });
}
