//! The backend contract: etcd semantics every backend must show, checked through the core
//! `Store` API. Each check is a plain async fn over a fresh backend; `contract_tests!` turns
//! them into one `#[tokio::test]` per check for a backend constructor.

use kine_core::backend::Backend;
use kine_core::request::*;
use kine_core::store::{Store, StoreOptions};
use kine_core::{Error, EventKind, KeyRange, KeyValue, Revision};
use std::sync::Arc;

mod ranges;
pub use ranges::{long_ranges_are_read_whole, paginated_lists_count_exactly, range_stream_parts_are_the_range};

pub async fn store(backend: Arc<dyn Backend>) -> Arc<Store> {
    Store::open(backend, StoreOptions::default()).await.expect("open store")
}

pub fn put_req(key: &str, value: &str) -> PutRequest {
    PutRequest { key: key.into(), value: value.into(), ..Default::default() }
}

pub async fn put(s: &Store, key: &str, value: &str) -> Revision {
    s.put(put_req(key, value)).await.expect("put").revision
}

pub async fn get(s: &Store, key: &str) -> Option<KeyValue> {
    s.range(RangeRequest::new(KeyRange::single(key))).await.expect("get").value.kvs.pop()
}

pub fn prefix(p: &str) -> KeyRange {
    let mut end = p.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    KeyRange::from_etcd(p.into(), end)
}

fn mod_eq(key: &str, rev: Revision) -> Compare {
    Compare { range: KeyRange::single(key), result: CompareResult::Equal, target: CompareTarget::Mod(rev) }
}

fn get_op(key: &str) -> RequestOp {
    RequestOp::Range(RangeRequest { limit: 1, ..RangeRequest::new(KeyRange::single(key)) })
}

pub async fn fresh_store_is_revision_one(b: Arc<dyn Backend>) {
    let s = store(b.clone()).await;
    assert_eq!(b.revisions().await.unwrap().current, 1);
    let r = s.range(RangeRequest::new(KeyRange::all())).await.unwrap();
    assert_eq!((r.revision, r.value.count, r.value.kvs.len()), (1, 0, 0));
    assert_ne!(b.cluster_id(), 0);
    assert_ne!(b.member_id(), 0);
}

pub async fn put_tracks_versions_and_prev_kv(b: Arc<dyn Backend>) {
    let s = store(b).await;
    assert_eq!(put(&s, "a", "1").await, 2);
    let kv = get(&s, "a").await.unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version, kv.value.as_slice()), (2, 2, 1, b"1".as_slice()));
    let r = s.put(PutRequest { prev_kv: true, ..put_req("a", "2") }).await.unwrap();
    assert_eq!(r.revision, 3);
    assert_eq!(r.value.prev_kv.unwrap().value, b"1");
    let kv = get(&s, "a").await.unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    // A put without prev_kv returns none.
    assert!(s.put(put_req("a", "3")).await.unwrap().value.prev_kv.is_none());
}

/// A Txn's Range at an earlier revision does not see the Txn's own writes; at revision 0 it does
/// (a SQL backend's index of newest versions already holds them: found by the model test).
pub async fn txn_ranges_see_own_writes_only_at_the_newest_revision(b: Arc<dyn Backend>) {
    let s = store(b).await;
    let before = put(&s, "o/a", "1").await;
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Put(put_req("o/b", "2")),
            RequestOp::Range(RangeRequest { revision: before, ..RangeRequest::new(prefix("o/")) }),
            RequestOp::Range(RangeRequest::new(prefix("o/"))),
        ],
        failure: vec![],
    };
    let r = s.txn(txn).await.expect("txn");
    let counts: Vec<(usize, i64)> = r.value.responses[1..]
        .iter()
        .map(|op| match op {
            ResponseOp::Range(Revisioned { value, .. }) => (value.kvs.len(), value.count),
            other => panic!("expected a range, got {other:?}"),
        })
        .collect();
    assert_eq!(counts, vec![(1, 1), (2, 2)], "at revision {before}: only o/a; at 0: o/a and o/b");
}

pub async fn delete_costs_one_revision(b: Arc<dyn Backend>) {
    let s = store(b).await;
    for k in ["d/1", "d/2", "d/3"] {
        put(&s, k, "v").await;
    }
    let r = s.delete_range(DeleteRangeRequest { range: KeyRange::single("d/1"), prev_kv: true }).await.unwrap();
    assert_eq!((r.revision, r.value.deleted), (5, 1));
    assert_eq!(r.value.prev_kvs[0].key, b"d/1");
    // Nothing matched: no revision.
    let r = s.delete_range(DeleteRangeRequest { range: KeyRange::single("d/1"), prev_kv: false }).await.unwrap();
    assert_eq!((r.revision, r.value.deleted), (5, 0));
    // Several keys: still one revision.
    let r = s.delete_range(DeleteRangeRequest { range: prefix("d/"), prev_kv: false }).await.unwrap();
    assert_eq!((r.revision, r.value.deleted), (6, 2));
    // Re-create after delete: version and create revision start over.
    put(&s, "d/1", "again").await;
    let kv = get(&s, "d/1").await.unwrap();
    assert_eq!((kv.create_revision, kv.version), (7, 1));
}

pub async fn txn_compares_every_target(b: Arc<dyn Backend>) {
    let s = store(b).await;
    put(&s, "k", "b").await; // rev 2
    let check = |target: CompareTarget, result: CompareResult| {
        let s = s.clone();
        async move {
            let t = TxnRequest {
                compare: vec![Compare { range: KeyRange::single("k"), result, target }],
                success: vec![get_op("k")],
                failure: vec![],
            };
            s.txn(t).await.unwrap().value.succeeded
        }
    };
    use CompareResult::*;
    assert!(check(CompareTarget::Value(b"b".to_vec()), Equal).await);
    assert!(check(CompareTarget::Value(b"a".to_vec()), Greater).await);
    assert!(check(CompareTarget::Value(b"c".to_vec()), Less).await);
    assert!(check(CompareTarget::Value(b"c".to_vec()), NotEqual).await);
    assert!(check(CompareTarget::Version(1), Equal).await);
    assert!(check(CompareTarget::Create(2), Equal).await);
    assert!(check(CompareTarget::Mod(3), Less).await);
    assert!(check(CompareTarget::Lease(0), Equal).await);
    assert!(!check(CompareTarget::Version(2), Equal).await);
    // A missing key: value compares fail, others compare against zero.
    let missing = |target, result| {
        let s = s.clone();
        async move {
            let t = TxnRequest {
                compare: vec![Compare { range: KeyRange::single("nope"), result, target }],
                ..Default::default()
            };
            s.txn(t).await.unwrap().value.succeeded
        }
    };
    assert!(!missing(CompareTarget::Value(vec![]), Equal).await);
    assert!(missing(CompareTarget::Version(0), Equal).await);
    assert!(missing(CompareTarget::Mod(0), Equal).await);
    // A range compare must hold for every key in it.
    put(&s, "k2", "b").await;
    let t = TxnRequest {
        compare: vec![Compare {
            range: KeyRange::from_etcd(b"k".to_vec(), b"l".to_vec()),
            result: Equal,
            target: CompareTarget::Value(b"b".to_vec()),
        }],
        ..Default::default()
    };
    assert!(s.txn(t).await.unwrap().value.succeeded);
}

pub async fn txn_kubernetes_shapes(b: Arc<dyn Backend>) {
    let s = store(b).await;
    // Create: mod == 0.
    let create = |value: &str| TxnRequest {
        compare: vec![mod_eq("/registry/pods/p", 0)],
        success: vec![RequestOp::Put(put_req("/registry/pods/p", value))],
        failure: vec![get_op("/registry/pods/p")],
    };
    let r = s.txn(create("v1")).await.unwrap();
    assert!(r.value.succeeded);
    assert_eq!(r.revision, 2);
    // A second create fails and returns the current value.
    let r = s.txn(create("v2")).await.unwrap();
    assert!(!r.value.succeeded);
    assert_eq!(r.revision, 2);
    let ResponseOp::Range(Revisioned { value: got, .. }) = &r.value.responses[0] else {
        panic!("expected a range response")
    };
    assert_eq!(got.kvs[0].value, b"v1");
    // Update with the right mod revision, then a stale one.
    let update = |rev, value: &str| TxnRequest {
        compare: vec![mod_eq("/registry/pods/p", rev)],
        success: vec![RequestOp::Put(put_req("/registry/pods/p", value))],
        failure: vec![get_op("/registry/pods/p")],
    };
    let r = s.txn(update(2, "v3")).await.unwrap();
    assert!(r.value.succeeded);
    assert_eq!(r.revision, 3);
    let r = s.txn(update(2, "v4")).await.unwrap();
    assert!(!r.value.succeeded);
    let ResponseOp::Range(Revisioned { value: got, .. }) = &r.value.responses[0] else {
        panic!("expected a range response")
    };
    assert_eq!((got.kvs[0].value.as_slice(), got.kvs[0].mod_revision), (b"v3".as_slice(), 3));
    // Delete with get-on-failure.
    let delete = |rev| TxnRequest {
        compare: vec![mod_eq("/registry/pods/p", rev)],
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single("/registry/pods/p"),
            prev_kv: true,
        })],
        failure: vec![get_op("/registry/pods/p")],
    };
    assert!(!s.txn(delete(2)).await.unwrap().value.succeeded);
    let r = s.txn(delete(3)).await.unwrap();
    assert!(r.value.succeeded);
    assert_eq!(r.revision, 4);
    let ResponseOp::DeleteRange(Revisioned { value: d, .. }) = &r.value.responses[0] else {
        panic!("expected a delete response")
    };
    assert_eq!((d.deleted, d.prev_kvs[0].value.as_slice()), (1, b"v3".as_slice()));
    // Create after delete succeeds again (mod == 0 on a deleted key).
    assert!(s.txn(create("v5")).await.unwrap().value.succeeded);
}

pub async fn compact_rev_key_version_cas(b: Arc<dyn Backend>) {
    let s = store(b).await;
    let cas = |version: i64, value: &str| TxnRequest {
        compare: vec![Compare {
            range: KeyRange::single("compact_rev_key"),
            result: CompareResult::Equal,
            target: CompareTarget::Version(version),
        }],
        success: vec![RequestOp::Put(put_req("compact_rev_key", value))],
        failure: vec![get_op("compact_rev_key")],
    };
    assert!(s.txn(cas(0, "1")).await.unwrap().value.succeeded);
    assert!(s.txn(cas(1, "2")).await.unwrap().value.succeeded);
    let r = s.txn(cas(1, "3")).await.unwrap();
    assert!(!r.value.succeeded);
    let ResponseOp::Range(Revisioned { value: got, .. }) = &r.value.responses[0] else {
        panic!("expected a range response")
    };
    assert_eq!((got.kvs[0].version, got.kvs[0].value.as_slice()), (2, b"2".as_slice()));
    // The key is an ordinary key: it shows up in ranges.
    assert_eq!(get(&s, "compact_rev_key").await.unwrap().version, 2);
}

pub async fn range_pagination_and_options(b: Arc<dyn Backend>) {
    let s = store(b).await;
    for i in 0..10 {
        put(&s, &format!("/p/{i}"), &format!("{}", 9 - i)).await;
    }
    put(&s, "/q", "x").await;
    let page = |key: &str, limit| RangeRequest {
        limit,
        ..RangeRequest::new(KeyRange::from_etcd(key.into(), b"/p0".to_vec()))
    };
    let r = s.range(page("/p/", 3)).await.unwrap().value;
    assert_eq!((r.kvs.len(), r.more, r.count), (3, true, 10));
    // Continue after the last key (the apiserver appends "\0").
    let mut next = r.kvs[2].key.clone();
    next.push(0);
    let r = s.range(page(std::str::from_utf8(&next).unwrap(), 3)).await.unwrap().value;
    assert_eq!(r.kvs[0].key, b"/p/3");
    assert_eq!((r.more, r.count), (true, 7));
    let r = s.range(page("/p/9", 3)).await.unwrap().value;
    assert_eq!((r.kvs.len(), r.more, r.count), (1, false, 1));
    let r = s.range(RangeRequest { count_only: true, ..page("/p/", 0) }).await.unwrap().value;
    assert_eq!((r.kvs.len(), r.count), (0, 10));
    let r = s.range(RangeRequest { keys_only: true, ..page("/p/", 1) }).await.unwrap().value;
    assert!(r.kvs[0].value.is_empty());
    // Sort by value descending, limit 2: values 9 and 8 come from /p/0 and /p/1.
    let r = s
        .range(RangeRequest { sort_order: SortOrder::Descend, sort_target: SortTarget::Value, ..page("/p/", 2) })
        .await
        .unwrap()
        .value;
    assert_eq!(r.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), vec![b"/p/0".to_vec(), b"/p/1".to_vec()]);
    assert!(r.more);
    // Mod-revision filters.
    let r = s.range(RangeRequest { min_mod_revision: 5, max_mod_revision: 6, ..page("/p/", 0) }).await.unwrap().value;
    assert_eq!(r.kvs.iter().map(|kv| kv.mod_revision).collect::<Vec<_>>(), vec![5, 6]);
    assert_eq!(r.count, 10);
    // "\0" as range end: every key >= key; key "\0" too: every key.
    let r = s.range(RangeRequest::new(KeyRange::from_etcd(b"/p/5".to_vec(), vec![0]))).await.unwrap().value;
    assert_eq!(r.count, 6);
    let r = s.range(RangeRequest::new(KeyRange::from_etcd(vec![0], vec![0]))).await.unwrap().value;
    assert_eq!(r.count, 11);
    // An end before the start is an empty range.
    let r = s.range(RangeRequest::new(KeyRange::from_etcd(b"b".to_vec(), b"a".to_vec()))).await.unwrap().value;
    assert_eq!(r.count, 0);
}

pub async fn historical_reads_and_compaction(b: Arc<dyn Backend>) {
    let s = store(b.clone()).await;
    put(&s, "h", "1").await; // 2
    put(&s, "h", "2").await; // 3
    put(&s, "gone", "x").await; // 4
    s.delete_range(DeleteRangeRequest { range: KeyRange::single("gone"), prev_kv: false }).await.unwrap(); // 5
    put(&s, "h", "3").await; // 6
    let at = |rev| RangeRequest { revision: rev, ..RangeRequest::new(KeyRange::single("h")) };
    let r = s.range(at(2)).await.unwrap();
    assert_eq!((r.revision, r.value.kvs[0].value.as_slice()), (6, b"1".as_slice()));
    assert!(matches!(s.range(at(7)).await, Err(Error::FutureRevision)));
    assert!(matches!(s.compact(7).await, Err(Error::FutureRevision)));
    assert_eq!(s.compact(5).await.unwrap(), 6);
    assert!(matches!(s.range(at(4)).await, Err(Error::Compacted { compact_revision: 5 })));
    assert_eq!(s.range(at(5)).await.unwrap().value.kvs[0].value, b"2");
    assert!(matches!(s.compact(5).await, Err(Error::Compacted { .. })));
    assert!(matches!(s.compact(3).await, Err(Error::Compacted { .. })));
    assert_eq!(get(&s, "h").await.unwrap().value, b"3");
    assert!(get(&s, "gone").await.is_none());
    assert!(matches!(b.events(&KeyRange::all(), 2, 6).await, Err(Error::Compacted { compact_revision: 5 })));
    // The deletion at exactly the compact revision survives (etcd keeps it for a watch that
    // starts there), as does everything after.
    let evs = b.events(&KeyRange::all(), 4, 6).await.unwrap();
    assert_eq!(evs.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![5, 6]);
    assert_eq!(evs[0].events[0].kv.key, b"gone");
    assert_eq!(evs[1].events[0].prev_kv.as_ref().unwrap().value, b"2");
    // Compacting exactly to a put keeps that put's event (a watch may start at the compact
    // revision, as in etcd); its previous version is gone. Found by the Kubernetes suite
    // (TestWatchFromZero) on the memory backend.
    s.compact(6).await.unwrap();
    let evs = b.events(&KeyRange::all(), 5, 6).await.unwrap();
    assert_eq!(evs.len(), 1, "the put at the compact revision survives");
    assert_eq!((evs[0].revision, evs[0].events[0].kv.value.as_slice()), (6, b"3".as_slice()));
    assert!(evs[0].events[0].prev_kv.is_none());
}

pub async fn events_carry_prev_kv_and_feed_is_ordered(b: Arc<dyn Backend>) {
    let s = store(b.clone()).await;
    let mut feed = b.subscribe();
    put(&s, "e", "1").await; // 2
    put(&s, "e", "2").await; // 3
    let t = TxnRequest {
        success: vec![
            RequestOp::Put(put_req("e2", "x")),
            RequestOp::DeleteRange(DeleteRangeRequest { range: KeyRange::single("e"), prev_kv: false }),
        ],
        ..Default::default()
    };
    assert_eq!(s.txn(t).await.unwrap().revision, 4);
    for rev in 2..=4 {
        assert_eq!(feed.recv().await.unwrap().revision, rev);
    }
    let evs = b.events(&KeyRange::all(), 1, 4).await.unwrap();
    assert_eq!(evs.len(), 3);
    assert!(evs[0].events[0].prev_kv.is_none());
    assert_eq!(evs[1].events[0].prev_kv.as_ref().unwrap().value, b"1");
    let last = &evs[2].events;
    assert_eq!((last[0].kind, last[1].kind), (EventKind::Put, EventKind::Delete));
    assert_eq!(last[1].kv.mod_revision, 4);
    assert_eq!(last[1].prev_kv.as_ref().unwrap().value, b"2");
    // Range-filtered.
    let evs = b.events(&KeyRange::single("e2"), 0, 4).await.unwrap();
    assert_eq!(evs.len(), 1);
}

/// A watch that resumes mid-history (a reflector after a restart): each event's previous
/// version comes from the window for a key changed twice in it, from before the window for a
/// key's first change there, and is absent for a deletion's successor.
pub async fn events_from_mid_history_carry_each_keys_previous_version(b: Arc<dyn Backend>) {
    mid_history_write(b.clone(), 300).await;
    mid_history_check(b, 300).await;
}

fn mid_key(i: i64) -> String {
    format!("mid/{i:05}")
}

/// The history of the check above with `keys` keys (a backend's own tests use more, to cross
/// its batches): three versions of each key, then one key deleted and created again.
pub async fn mid_history_write(b: Arc<dyn Backend>, keys: i64) {
    let s = store(b).await;
    for version in 1..=3 {
        for i in 0..keys {
            put(&s, &mid_key(i), &format!("{i}.{version}")).await;
        }
    }
    let last = 1 + 3 * keys;
    let gone = DeleteRangeRequest { range: KeyRange::single(mid_key(7)), prev_kv: false };
    assert_eq!(s.delete_range(gone).await.unwrap().revision, last + 1);
    assert_eq!(put(&s, &mid_key(7), "7.again").await, last + 2);
}

/// The events of a window starting halfway through the second versions, each with its
/// previous version.
pub async fn mid_history_check(b: Arc<dyn Backend>, keys: i64) {
    // Version v of key i is at revision 2 + (v - 1) * keys + i.
    let last = 1 + 3 * keys;
    // Inside the second round: keys from keys / 2 on change twice in the window.
    let after = 1 + keys + keys / 2;
    let evs = b.events(&prefix("mid/"), after, last + 2).await.unwrap();
    assert_eq!(evs.iter().map(|e| e.revision).collect::<Vec<_>>(), (after + 1..=last + 2).collect::<Vec<_>>());
    for e in evs.iter().flat_map(|r| &r.events) {
        let i: i64 = std::str::from_utf8(&e.kv.key[4..]).unwrap().parse().unwrap();
        let prev = e.prev_kv.as_ref().map(|p| String::from_utf8(p.value.clone()).unwrap());
        let want = match e.kv.mod_revision {
            r if r == last + 1 => Some("7.3".to_string()),
            r if r == last + 2 => None,
            r if r > 1 + 2 * keys => Some(format!("{i}.2")),
            _ => Some(format!("{i}.1")),
        };
        assert_eq!(prev, want, "previous version of the event at {}", e.kv.mod_revision);
        if let Some(p) = e.prev_kv.as_ref().filter(|_| e.kv.mod_revision <= last) {
            assert_eq!((p.key.as_slice(), p.mod_revision + keys), (e.kv.key.as_slice(), e.kv.mod_revision));
        }
    }
}

/// A catch-up read in consecutive windows (as a watch resuming from an old revision reads it)
/// gets exactly the events of one window over the whole span, previous versions included,
/// whatever the window size: a backend that carries what earlier windows saw (MySQL,
/// `prev_cache.rs`) must answer as one that looks everything up.
pub async fn events_in_consecutive_windows_match_one_window(b: Arc<dyn Backend>) {
    mid_history_write(b.clone(), 40).await;
    let last = 1 + 3 * 40 + 2;
    let whole = b.events(&prefix("mid/"), 1, last).await.unwrap();
    assert_eq!(whole.len() as i64, last - 1);
    for step in [1, 7, 25, 40, 61] {
        let (mut joined, mut after) = (Vec::new(), 1);
        while after < last {
            let until = (after + step).min(last);
            joined.extend(b.events(&prefix("mid/"), after, until).await.unwrap());
            after = until;
        }
        assert_eq!(joined, whole, "windows of {step} revisions");
    }
}

pub async fn txn_is_atomic(b: Arc<dyn Backend>) {
    let s = store(b.clone()).await;
    let t = TxnRequest {
        success: vec![
            RequestOp::Put(put_req("x", "1")),
            RequestOp::Put(PutRequest { lease: 424242, ..put_req("y", "1") }),
        ],
        ..Default::default()
    };
    assert!(matches!(s.txn(t).await, Err(Error::LeaseNotFound)));
    assert!(get(&s, "x").await.is_none());
    assert_eq!(b.revisions().await.unwrap().current, 1);
    // Reads inside a txn see its earlier writes.
    let t = TxnRequest { success: vec![RequestOp::Put(put_req("x", "1")), get_op("x")], ..Default::default() };
    let r = s.txn(t).await.unwrap();
    let ResponseOp::Range(Revisioned { value: got, .. }) = &r.value.responses[1] else {
        panic!("expected a range response")
    };
    assert_eq!(got.kvs[0].mod_revision, 2);
    // Duplicate keys are rejected before anything runs.
    let t = TxnRequest {
        success: vec![RequestOp::Put(put_req("z", "1")), RequestOp::Put(put_req("z", "2"))],
        ..Default::default()
    };
    assert!(matches!(s.txn(t).await, Err(Error::DuplicateKey)));
}

pub async fn put_ignore_value_and_lease(b: Arc<dyn Backend>) {
    let s = store(b).await;
    assert!(matches!(s.put(PutRequest { ignore_value: true, ..put_req("iv", "") }).await, Err(Error::KeyNotFound)));
    assert!(matches!(s.put(PutRequest { ignore_value: true, ..put_req("iv", "x") }).await, Err(Error::ValueProvided)));
    let (lease, _, _) = s.lease_grant(0, 60).await.unwrap();
    s.put(PutRequest { lease, ..put_req("iv", "keep") }).await.unwrap();
    s.put(PutRequest { ignore_value: true, ..put_req("iv", "") }).await.unwrap();
    let kv = get(&s, "iv").await.unwrap();
    assert_eq!((kv.value.as_slice(), kv.lease, kv.version), (b"keep".as_slice(), 0, 2));
    s.put(PutRequest { lease, ..put_req("iv", "v3") }).await.unwrap();
    s.put(PutRequest { ignore_lease: true, ..put_req("iv", "v4") }).await.unwrap();
    let kv = get(&s, "iv").await.unwrap();
    assert_eq!((kv.value.as_slice(), kv.lease), (b"v4".as_slice(), lease));
    assert!(matches!(
        s.put(PutRequest { ignore_lease: true, lease: 5, ..put_req("iv", "x") }).await,
        Err(Error::LeaseProvided)
    ));
    assert!(matches!(s.put(put_req("", "x")).await, Err(Error::EmptyKey)));
}

pub async fn lease_revoke_deletes_keys_in_one_revision(b: Arc<dyn Backend>) {
    let s = store(b.clone()).await;
    let (lease, ttl, _) = s.lease_grant(0, 1).await.unwrap();
    assert_eq!(ttl, kine_core::lease::MIN_TTL);
    assert!(lease > 0);
    assert!(matches!(s.lease_grant(lease, 10).await, Err(Error::LeaseExists)));
    // Granting a lease costs no revision.
    assert_eq!(b.revisions().await.unwrap().current, 1);
    for k in ["l/1", "l/2"] {
        s.put(PutRequest { lease, ..put_req(k, "v") }).await.unwrap();
    }
    put(&s, "l/3", "no lease").await;
    let ttl = s.lease_time_to_live(lease, true).await.unwrap().unwrap();
    assert_eq!(ttl.keys, vec![b"l/1".to_vec(), b"l/2".to_vec()]);
    assert_eq!(s.lease_revoke(lease).await.unwrap(), 5);
    assert!(get(&s, "l/1").await.is_none() && get(&s, "l/2").await.is_none());
    assert!(get(&s, "l/3").await.is_some());
    assert!(matches!(s.lease_revoke(lease).await, Err(Error::LeaseNotFound)));
    assert!(s.lease_time_to_live(lease, false).await.unwrap().is_none());
    // Revoking a lease with no keys costs no revision.
    let (empty, _, _) = s.lease_grant(77, 30).await.unwrap();
    assert_eq!(empty, 77);
    assert_eq!(s.lease_revoke(77).await.unwrap(), 5);
}

/// The auth record: absent on a fresh datastore, replaced only from the version read, and not
/// part of the key space (no revision spent, no event).
pub async fn auth_record_is_replaced_by_version(b: Arc<dyn Backend>) {
    let s = store(b.clone()).await;
    let mut feed = b.subscribe();
    assert_eq!(b.auth_record().await.expect("read"), None);
    assert!(!b.auth_replace(Some(1), b"x".to_vec()).await.expect("replace"), "no record has version 1");
    assert!(b.auth_replace(None, b"first".to_vec()).await.expect("create"));
    assert!(!b.auth_replace(None, b"again".to_vec()).await.expect("create twice"), "a second create must lose");
    let first = b.auth_record().await.expect("read").expect("record");
    assert_eq!(first.data, b"first");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    assert!(b.auth_replace(Some(first.version), big.clone()).await.expect("update"));
    assert!(!b.auth_replace(Some(first.version), b"stale".to_vec()).await.expect("stale"), "stale version");
    let second = b.auth_record().await.expect("read").expect("record");
    assert_eq!(second.data, big);
    assert_ne!(second.version, first.version);
    assert_eq!(b.revisions().await.expect("revisions").current, 1, "the auth record spends no revision");
    drop(s);
    assert!(feed.try_recv().is_err(), "the auth record is not an event");
}

/// Defines one `#[tokio::test]` per contract check for a backend constructor expression
/// (evaluated inside the async test; it returns the backend and a guard kept alive).
/// `contract_tests!(make)` runs every check; `contract_tests!(make, single_key_writes)` leaves
/// out the three checks that a request changing several keys creates exactly one revision,
/// for a backend that documents otherwise (NATS) and tests its own behaviour instead.
#[macro_export]
macro_rules! contract_tests {
    ($make:expr) => {
        $crate::contract_tests!($make, single_key_writes);
        $crate::contract_tests!(@each $make;
            delete_costs_one_revision, events_carry_prev_kv_and_feed_is_ordered,
            txn_ranges_see_own_writes_only_at_the_newest_revision,
            lease_revoke_deletes_keys_in_one_revision);
    };
    ($make:expr, single_key_writes) => {
        $crate::contract_tests!(@each $make;
            fresh_store_is_revision_one, put_tracks_versions_and_prev_kv,
            txn_compares_every_target, txn_kubernetes_shapes, compact_rev_key_version_cas,
            range_pagination_and_options, historical_reads_and_compaction,
            events_from_mid_history_carry_each_keys_previous_version,
            events_in_consecutive_windows_match_one_window, txn_is_atomic, put_ignore_value_and_lease, range_stream_parts_are_the_range, long_ranges_are_read_whole,
            paginated_lists_count_exactly, auth_record_is_replaced_by_version);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test]
            async fn $name() {
                let (backend, _guard) = $make;
                $crate::contract::$name(backend).await;
            }
        )*
    };
}
