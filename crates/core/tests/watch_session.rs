//! The watch session on the memory backend: a client that stops reading while thousands of
//! revisions commit overflows the live feed, and must then get everything from history, in
//! order, exactly once — with one watch on everything, and with many watches of single keys
//! (served from the session's index of watched keys while synced).

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
    req_tx.send(create(0, KeyRange::all(), 0, true)).await.unwrap();
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

/// Many watches on one stream, each on a single key (the index of followers), some from a past
/// revision, one on a prefix; the client stops reading long enough to overflow the feed, then
/// reads again; then live puts. Every watch gets exactly its key's changes, in order, once.
#[tokio::test]
async fn watches_of_single_keys_get_their_events_exactly_once_across_overflow_and_catch_up() {
    let store = Store::open(Arc::new(MemoryBackend::new()), StoreOptions::default()).await.unwrap();
    let (_trigger, stop) = shutdown::channel();
    let (req_tx, req_rx) = mpsc::channel(64);
    let (out_tx, mut out_rx) = mpsc::channel(1);
    store.watch(req_rx, out_tx, stop);
    let put = |i: i64| {
        let store = &store;
        async move {
            let key = format!("k{}", i % KEYS).into_bytes();
            (
                store.put(PutRequest { key, value: b"v".to_vec(), ..Default::default() }).await.unwrap().revision,
                i % KEYS,
            )
        }
    };
    // Revisions 2..=21: two puts per key before the watches exist.
    let mut t = Tally::default();
    for i in 0..20 {
        t.written.push(put(i).await);
    }
    t.now = t.written.last().unwrap().0;
    // Watch w (1..=30) on key w % 10, odd ones from revision 2, even ones from now; watch 31 on
    // the whole prefix, from now.
    for w in 1..=30i64 {
        let range = KeyRange::from_etcd(format!("k{}", w % KEYS).into_bytes(), Vec::new());
        req_tx.send(create(w, range, if w % 2 == 1 { 2 } else { 0 }, false)).await.unwrap();
    }
    req_tx.send(create(31, KeyRange::from_etcd(b"k".to_vec(), b"l".to_vec()), 0, false)).await.unwrap();
    let mut created = 0;
    while created < 31 {
        match out_rx.recv().await.unwrap() {
            WatchResponse::Created { .. } => created += 1,
            other => t.take(other),
        }
    }
    // Far more revisions than the feed holds, while nobody reads.
    for i in 0..3000 {
        t.written.push(put(i).await);
    }
    while !t.done() {
        t.take(out_rx.recv().await.unwrap());
    }
    // Live: each put arrives before the next is made.
    for i in 0..20 {
        t.written.push(put(i).await);
        while !t.done() {
            t.take(out_rx.recv().await.unwrap());
        }
    }
    for w in 1..=31 {
        assert_eq!(t.got.get(&w).cloned().unwrap_or_default(), t.expected(w), "watch {w}");
    }
    req_tx.send(WatchRequest::Progress).await.unwrap();
    let last = t.written.last().unwrap().0;
    assert_eq!(out_rx.recv().await.unwrap(), WatchResponse::Progress { watch_id: -1, revision: last });
}

/// A watch on `range` from `start_revision` (0: now), with every event kind.
fn create(watch_id: i64, range: KeyRange, start_revision: i64, prev_kv: bool) -> WatchRequest {
    WatchRequest::Create(WatchCreate {
        watch_id,
        range,
        start_revision,
        prev_kv,
        progress_notify: false,
        no_put: false,
        no_delete: false,
        fragment: false,
    })
}

const KEYS: i64 = 10;

/// What the test above wrote and received.
#[derive(Default)]
struct Tally {
    /// (revision, key index) of every put.
    written: Vec<(i64, i64)>,
    /// The revision before the watches from now.
    now: i64,
    /// Revisions received per watch.
    got: std::collections::BTreeMap<i64, Vec<i64>>,
}

impl Tally {
    fn take(&mut self, r: WatchResponse) {
        match r {
            WatchResponse::Events { watch_id, events, .. } => {
                self.got.entry(watch_id).or_default().extend(events.iter().map(|e| e.kv.mod_revision))
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn expected(&self, w: i64) -> Vec<i64> {
        let from = if w == 31 || w % 2 == 0 { self.now + 1 } else { 2 };
        self.written.iter().filter(|(r, k)| *r >= from && (w == 31 || *k == w % KEYS)).map(|(r, _)| *r).collect()
    }

    fn done(&self) -> bool {
        (1..=31).all(|w| self.got.get(&w).map_or(0, Vec::len) >= self.expected(w).len())
    }
}
