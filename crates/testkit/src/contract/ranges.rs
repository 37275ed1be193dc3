//! Contract checks of long reads: ranges longer than the core's page, and RangeStream's parts.

use super::{prefix, put, put_req, store};
use kine_core::backend::Backend;
use kine_core::request::*;
use kine_core::{Error, KeyRange, Revision};
use std::sync::Arc;

/// A range longer than the core's page (4,096 keys) is read a page at a time (each page starts
/// after the previous one's last key): whole, in key order, at the newest revision and at an
/// older one, with and without a limit, and in a Txn.
pub async fn long_ranges_are_read_whole(b: Arc<dyn Backend>) {
    let s = store(b).await;
    let name = |i: usize| format!("/long/{i:05}");
    for first in (0..4500).step_by(100) {
        let puts = (first..first + 100).map(|i| RequestOp::Put(put_req(&name(i), "v"))).collect();
        s.txn(TxnRequest { compare: vec![], success: puts, failure: vec![] }).await.expect("fill");
    }
    let full = s.current_revision().await.unwrap();
    for i in (0..4500).step_by(450) {
        s.delete_range(DeleteRangeRequest { range: KeyRange::single(name(i)), prev_kv: false }).await.unwrap();
    }
    let keys = |r: &RangeResponse| -> Vec<Vec<u8>> { r.kvs.iter().map(|kv| kv.key.clone()).collect() };
    let at = |revision: Revision| RangeRequest { revision, ..RangeRequest::new(prefix("/long/")) };
    let old = s.range(at(full)).await.unwrap().value;
    assert_eq!(keys(&old), (0..4500).map(|i| name(i).into_bytes()).collect::<Vec<_>>(), "at revision {full}");
    assert_eq!((old.count, old.more), (4500, false));
    let now = s.range(at(0)).await.unwrap().value;
    let expected: Vec<Vec<u8>> = (0..4500).filter(|i| i % 450 != 0).map(|i| name(i).into_bytes()).collect();
    assert_eq!(keys(&now), expected);
    let limited = s.range(RangeRequest { limit: 4200, ..at(0) }).await.unwrap().value;
    assert_eq!((keys(&limited), limited.count, limited.more), (expected[..4200].to_vec(), 4490, true));
    let txn = TxnRequest { compare: vec![], success: vec![RequestOp::Range(at(full))], failure: vec![] };
    match &s.txn(txn).await.unwrap().value.responses[0] {
        ResponseOp::Range(r) => assert_eq!(r.value.kvs.len(), 4500),
        other => panic!("expected a range, got {other:?}"),
    }
}

/// A paginated list as kube-apiserver reads it (each page right after the last key of the one
/// before, at the first page's revision) while keys in its range are put and deleted: every
/// page's keys, `more` and `count` are those of a Range of that page alone and of a count of
/// its range at that revision (the backend takes later pages' counts from the page before:
/// `kine_core::page_counts`). A page asked twice (a retried request) answers the same.
pub async fn paginated_lists_count_exactly(b: Arc<dyn Backend>) {
    let s = store(b).await;
    let name = |i: usize| format!("/pages/{i:04}");
    for first in (0..1000).step_by(100) {
        let puts = (first..first + 100).map(|i| RequestOp::Put(put_req(&name(i), "v"))).collect();
        s.txn(TxnRequest { compare: vec![], success: puts, failure: vec![] }).await.expect("fill");
    }
    let end = prefix("/pages/").end;
    let page = |start: Vec<u8>, revision: Revision| RangeRequest {
        limit: 70,
        revision,
        ..RangeRequest::new(KeyRange { start, end: end.clone() })
    };
    let first = s.range(page(b"/pages/".to_vec(), 0)).await.unwrap();
    let listed = first.revision;
    let (mut response, mut pages, mut seen) = (first.value, 1, 0);
    loop {
        seen += response.kvs.len();
        if !response.more {
            break;
        }
        // Writes in the range between pages, before and after where the list is.
        put(&s, &format!("{}x", name(pages * 37 % 1000)), "new").await;
        s.delete_range(DeleteRangeRequest { range: KeyRange::single(name(pages * 53 % 1000)), prev_kv: false })
            .await
            .unwrap();
        let mut start = response.kvs.last().unwrap().key.clone();
        start.push(0);
        let req = page(start.clone(), listed);
        response = s.range(req.clone()).await.unwrap().value;
        let again = s.range(req).await.unwrap().value;
        assert_eq!(response, again, "page {pages} asked twice");
        let count = RangeRequest { count_only: true, ..page(start, listed) };
        assert_eq!(response.count, s.range(count).await.unwrap().value.count, "page {pages}");
        assert_eq!(response.count, 1000 - seen as i64, "page {pages}");
        pages += 1;
    }
    assert_eq!((pages, seen), (15, 1000));
}

/// RangeStream: its parts, concatenated, are the Range (keys, count, more, header revision) for
/// every option it takes, at the revision of its first part whatever is written meanwhile.
pub async fn range_stream_parts_are_the_range(b: Arc<dyn Backend>) {
    let s = store(b).await;
    for i in 0..300 {
        put(&s, &format!("/rs/{i:04}"), &"v".repeat(i % 50)).await;
    }
    s.compact(100).await.unwrap();
    let current = put(&s, "/rs/last", "x").await;
    let cases = [
        RangeRequest::new(prefix("/rs/")),
        RangeRequest { limit: 7, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest { limit: 300, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest { keys_only: true, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest { count_only: true, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest { revision: 150, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest { serializable: true, limit: 250, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest { sort_order: SortOrder::Ascend, ..RangeRequest::new(prefix("/rs/")) },
        RangeRequest::new(KeyRange::single("/rs/0042")),
        RangeRequest::new(prefix("/none/")),
    ];
    for req in cases {
        let unary = s.range(req.clone()).await.unwrap();
        // A small part size: many parts.
        let mut parts = s.range_stream(req.clone(), 2048).unwrap();
        let mut kvs = Vec::new();
        let mut last = None;
        let mut n = 0;
        while let Some(p) = parts.next().await.unwrap() {
            n += 1;
            if n == 2 {
                // Written during the stream: not in it.
                put(&s, "/rs/0000", "late").await;
            }
            assert!(last.is_none(), "{req:?}: a part after the last");
            kvs.extend(p.kvs);
            last = p.last;
        }
        let last = last.expect("a last part");
        assert_eq!(kvs, unary.value.kvs, "{req:?}");
        assert_eq!(
            (last.revision, last.count, last.more),
            (unary.revision, unary.value.count, unary.value.more),
            "{req:?}"
        );
    }
    assert!(current > 1);
    // Revisions: future and compacted as Range answers them.
    let future = RangeRequest { revision: 100_000, ..RangeRequest::new(prefix("/rs/")) };
    assert!(matches!(s.range_stream(future, 2048).unwrap().next().await, Err(Error::FutureRevision)));
    let compacted = RangeRequest { revision: 50, ..RangeRequest::new(prefix("/rs/")) };
    assert!(matches!(s.range_stream(compacted, 2048).unwrap().next().await, Err(Error::Compacted { .. })));
}
