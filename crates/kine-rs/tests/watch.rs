//! Watch over real gRPC: catch-up then live without loss or duplicates, start revision 0,
//! prev_kv, filters, progress notifications that never run ahead, compaction cancel,
//! fragmentation and cancel.

mod common;
use common::*;
use etcd_client::*;
use std::time::Duration;
use tokio::time::timeout;

async fn next(w: &mut WatchStream) -> WatchResponse {
    timeout(Duration::from_secs(10), w.message()).await.expect("watch response in time").unwrap().expect("stream open")
}

/// Reads events until `n` have arrived, asserting on the way that responses are sane.
async fn collect(w: &mut WatchStream, n: usize) -> Vec<(i64, EventType, Vec<u8>)> {
    let mut out = Vec::new();
    while out.len() < n {
        let r = next(w).await;
        assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
        for e in r.events() {
            let kv = e.kv().unwrap();
            out.push((kv.mod_revision(), e.event_type(), kv.key().to_vec()));
        }
    }
    out
}

#[tokio::test]
async fn catch_up_then_live_without_loss_or_duplicates() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    for i in 0..300 {
        c.put(format!("/w/{}", i % 17), format!("{i}"), None).await.unwrap(); // revisions 2..=301
    }
    // Writers keep going while the watch catches up from revision 2.
    let mut writer = c.clone();
    let writes = tokio::spawn(async move {
        for i in 300..1300 {
            writer.put(format!("/w/{}", i % 17), format!("{i}"), None).await.unwrap();
        }
    });
    let mut w = c.watch("/w/", Some(WatchOptions::new().with_prefix().with_start_revision(2))).await.unwrap();
    let created = next(&mut w).await;
    assert!(created.created());
    let events = collect(&mut w, 1300).await;
    writes.await.unwrap();
    let revs: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert_eq!(revs, (2..1302).collect::<Vec<_>>(), "every revision exactly once, in order");
}

#[tokio::test]
async fn start_revision_zero_means_now_and_prev_kv_and_filters() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    c.put("k", "old", None).await.unwrap(); // 2
    let mut w = c.watch("k", Some(WatchOptions::new().with_prev_key())).await.unwrap();
    let created = next(&mut w).await;
    assert!(created.created());
    assert_eq!(created.header().unwrap().revision(), 2, "created carries the current revision");
    c.put("k", "new", None).await.unwrap(); // 3
    c.delete("k", None).await.unwrap(); // 4
    let r = next(&mut w).await;
    let e = &r.events()[0];
    assert_eq!((e.event_type(), e.kv().unwrap().mod_revision()), (EventType::Put, 3));
    assert_eq!(e.prev_kv().unwrap().value(), b"old");
    let r = next(&mut w).await;
    let e = &r.events()[0];
    assert_eq!((e.event_type(), e.kv().unwrap().mod_revision()), (EventType::Delete, 4));
    assert_eq!(e.prev_kv().unwrap().value(), b"new");
    // NOPUT: only deletes; without prev_kv none is sent.
    let mut w = c.watch("f", Some(WatchOptions::new().with_filters([WatchFilterType::NoPut]))).await.unwrap();
    next(&mut w).await;
    c.put("f", "1", None).await.unwrap();
    c.put("f", "2", None).await.unwrap();
    c.delete("f", None).await.unwrap();
    let r = next(&mut w).await;
    assert_eq!(r.events().len(), 1);
    assert_eq!(r.events()[0].event_type(), EventType::Delete);
    assert!(r.events()[0].prev_kv().is_none());
}

#[tokio::test]
async fn progress_requests_never_run_ahead_of_events() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let mut w = c.watch("/p/", Some(WatchOptions::new().with_prefix().with_prev_key())).await.unwrap();
    next(&mut w).await;
    let mut writer = c.clone();
    let writes = tokio::spawn(async move {
        for i in 0..400 {
            writer.put(format!("/p/{}", i % 5), "v", None).await.unwrap();
        }
    });
    let mut last_event = 1;
    let mut progress_seen = 0;
    for _ in 0..40 {
        w.request_progress().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while last_event < 401 {
        let r = next(&mut w).await;
        let header = r.header().unwrap().revision();
        if r.events().is_empty() {
            // A progress notification: every event up to `header` was delivered already.
            assert!(header >= last_event, "progress {header} went backwards (last event {last_event})");
            progress_seen += 1;
            continue;
        }
        for e in r.events() {
            let rev = e.kv().unwrap().mod_revision();
            assert_eq!(rev, last_event + 1, "events in order, none missing");
            last_event = rev;
        }
    }
    writes.await.unwrap();
    // After the writes, a progress request answers with the final revision.
    w.request_progress().await.unwrap();
    loop {
        let r = next(&mut w).await;
        if r.events().is_empty() {
            assert_eq!(r.header().unwrap().revision(), 401);
            assert_eq!(r.watch_id(), -1);
            break;
        }
    }
    assert!(progress_seen > 0, "some progress responses arrived during the writes");
}

#[tokio::test]
async fn periodic_progress_notify() {
    let (server, _dir) = sqlite_server(&["--watch-progress-notify-interval", "200ms"]);
    let mut c = server.client().await;
    c.put("a", "1", None).await.unwrap();
    let mut w = c.watch("zzz", Some(WatchOptions::new().with_progress_notify())).await.unwrap();
    let created = next(&mut w).await;
    let id = created.watch_id();
    let r = next(&mut w).await;
    assert!(r.events().is_empty());
    assert_eq!((r.watch_id(), r.header().unwrap().revision()), (id, 2));
}

#[tokio::test]
async fn compacted_start_revision_cancels_with_compact_revision() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    for i in 0..10 {
        c.put("c", format!("{i}"), None).await.unwrap(); // 2..=11
    }
    c.compact(8, None).await.unwrap();
    let mut w = c.watch("c", Some(WatchOptions::new().with_start_revision(3))).await.unwrap();
    assert!(next(&mut w).await.created());
    let r = next(&mut w).await;
    assert!(r.canceled());
    assert_eq!(r.compact_revision(), 8);
    // As etcd: no reason, and a header without a revision (clients go by compact_revision).
    assert_eq!((r.cancel_reason(), r.header().unwrap().revision()), ("", 0));
    // At the compact revision itself the watch works.
    let mut w = c.watch("c", Some(WatchOptions::new().with_start_revision(8))).await.unwrap();
    assert!(next(&mut w).await.created());
    let evs = collect(&mut w, 4).await;
    assert_eq!(evs.iter().map(|e| e.0).collect::<Vec<_>>(), vec![8, 9, 10, 11]);
    // A negative start revision is refused at creation (etcd 3.6 and 3.7, checked through
    // their gateways): one answer, created and canceled, id -1, the compacted text.
    let mut w = c.watch("c", Some(WatchOptions::new().with_start_revision(-5))).await.unwrap();
    let r = next(&mut w).await;
    assert!(r.created() && r.canceled());
    assert_eq!(r.watch_id(), -1);
    assert_eq!(r.cancel_reason(), "etcdserver: mvcc: required revision has been compacted");
    assert_eq!(r.header().unwrap().revision(), 11);
}

#[tokio::test]
async fn fragmented_responses_reassemble() {
    let (server, _dir) = sqlite_server(&["--max-request-bytes", "65536"]);
    let mut c = server.client().await;
    // One revision whose events (with their previous values) exceed the limit, written by a
    // request below it.
    for i in 0..100 {
        c.put(format!("/frag/{i:03}"), vec![b'o'; 550], None).await.unwrap();
    }
    let ops: Vec<TxnOp> = (0..100).map(|i| TxnOp::put(format!("/frag/{i:03}"), vec![b'v'; 550], None)).collect();
    let mut w =
        c.watch("/frag/", Some(WatchOptions::new().with_prefix().with_fragment().with_prev_key())).await.unwrap();
    next(&mut w).await;
    c.txn(Txn::new().and_then(ops)).await.unwrap();
    let mut total = 0;
    let mut responses = 0;
    while total < 100 {
        let r = next(&mut w).await;
        total += r.events().len();
        responses += 1;
    }
    assert_eq!(total, 100);
    assert!(responses > 1, "the response was split into fragments");
}

#[tokio::test]
async fn cancel_and_multiple_watches_on_one_stream() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let mut w = c.watch("a", None).await.unwrap();
    let id_a = next(&mut w).await.watch_id();
    w.watch("b", None).await.unwrap();
    let id_b = next(&mut w).await.watch_id();
    assert_ne!(id_a, id_b);
    c.put("a", "1", None).await.unwrap();
    c.put("b", "1", None).await.unwrap();
    assert_eq!(next(&mut w).await.watch_id(), id_a);
    assert_eq!(next(&mut w).await.watch_id(), id_b);
    w.cancel(id_a).await.unwrap();
    let r = next(&mut w).await;
    assert!(r.canceled() && r.watch_id() == id_a);
    c.put("a", "2", None).await.unwrap();
    c.put("b", "2", None).await.unwrap();
    let r = next(&mut w).await;
    assert_eq!(r.watch_id(), id_b, "the cancelled watch gets nothing more");
}
