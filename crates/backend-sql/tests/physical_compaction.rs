//! Compaction on SQLite removes rows, not just a marker: after compacting, the file holds
//! only each key's newest version at or below the compact revision (nothing of keys deleted
//! before it), and a restart keeps the revisions.

use kine_core::backend::Backend;
use kine_core::request::{DeleteRangeRequest, PutRequest, RangeRequest};
use kine_core::store::{Store, StoreOptions};
use kine_core::{Error, KeyRange};
use std::sync::Arc;

fn rows(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM kv", [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn compaction_deletes_superseded_rows_and_state_survives_reopen() {
    let dir = kine_testkit::TempDir::new("physical");
    let path = dir.path().join("state.db");
    let open = || -> Arc<dyn Backend> {
        Arc::new(kine_backend_sql::SqliteBackend::open(kine_backend_sql::SqliteOptions { path: path.clone() }).unwrap())
    };
    let backend = open();
    let store = Store::open(backend.clone(), StoreOptions::default()).await.unwrap();
    for i in 0..50 {
        for key in ["a", "b", "c"] {
            store
                .put(PutRequest { key: key.into(), value: format!("{i}").into(), ..Default::default() })
                .await
                .unwrap();
        }
    }
    store.delete_range(DeleteRangeRequest { range: KeyRange::single("c"), prev_kv: false }).await.unwrap();
    assert_eq!(rows(&path), 151);
    let current = store.current_revision().await.unwrap();
    assert_eq!(current, 152);
    store.compact(current).await.unwrap();
    // a and b keep their newest version; c's history is gone, but its deletion is at exactly the
    // compact revision and stays (etcd keeps it: a watch may still start at that revision).
    assert_eq!(rows(&path), 3);
    backend.close().await;

    let backend = open();
    let revs = backend.revisions().await.unwrap();
    assert_eq!((revs.current, revs.compacted), (152, 152));
    let store = Store::open(backend, StoreOptions::default()).await.unwrap();
    let r = store.range(RangeRequest::new(KeyRange::all())).await.unwrap();
    assert_eq!((r.revision, r.value.count), (152, 2));
    let old = RangeRequest { revision: 100, ..RangeRequest::new(KeyRange::single("a")) };
    assert!(matches!(store.range(old).await, Err(Error::Compacted { compact_revision: 152 })));
    // The next write continues the revision sequence.
    let r = store.put(PutRequest { key: b"d".to_vec(), value: b"v".to_vec(), ..Default::default() }).await.unwrap();
    assert_eq!(r.revision, 153);
    // Compacting past the deletion removes the tombstone too.
    store.compact(153).await.unwrap();
    assert_eq!(rows(&path), 3, "a, b and d; nothing of c");
}
