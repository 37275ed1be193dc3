//! The counts of the pages a paginated list will ask for next, so that each is not counted
//! again from the datastore.
//!
//! A Range with a limit answers `count`: every live key from its start to the end of the range
//! (etcd's, which kube-apiserver turns into `remainingItemCount`), a walk over the rest of the
//! range whose cost grows with the store. kube-apiserver reads a list page by page, each next
//! page starting right after the last key of the one before (`last key + "\0"`) at the first
//! page's revision, so the next page's count is known without a walk: this page's count minus
//! the keys it returned (at a fixed revision the keys of a range never change). Without it a
//! paginated list of N keys walks N²/(2·limit) index entries; with it, N.
//!
//! Kept per backend (a datastore's counts mean nothing for another), a few hundred
//! continuations, the oldest forgotten first; a page whose continuation is not held is counted
//! as before.

use crate::types::{KeyRange, Revision};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Continuations held (lists being paged through at once, across every client).
const HELD: usize = 256;

#[derive(Debug)]
struct Continuation {
    /// The next page's range: from right after the last key returned to the same end.
    range: KeyRange,
    revision: Revision,
    count: i64,
}

#[derive(Debug, Default)]
pub struct PageCounts(Mutex<VecDeque<Continuation>>);

impl PageCounts {
    pub fn new() -> PageCounts {
        PageCounts::default()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, VecDeque<Continuation>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The count of the live keys in `range` at `revision`, if a page before it left it.
    pub fn take(&self, range: &KeyRange, revision: Revision) -> Option<i64> {
        let mut held = self.held();
        let i = held.iter().position(|c| c.revision == revision && c.range == *range)?;
        held.remove(i).map(|c| c.count)
    }

    /// A page of `range` at `revision` returned the first `returned` of its `count` live keys,
    /// the last of them `last_key` (in key order, none filtered out): the page after it holds
    /// `count - returned`.
    pub fn remember(&self, range: &KeyRange, revision: Revision, last_key: &[u8], count: i64, returned: usize) {
        let mut start = Vec::with_capacity(last_key.len() + 1);
        start.extend_from_slice(last_key);
        start.push(0);
        let next = Continuation {
            range: KeyRange { start, end: range.end.clone() },
            revision,
            count: count - returned as i64,
        };
        let mut held = self.held();
        if held.len() >= HELD {
            held.pop_front();
        }
        held.push_back(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::RangeEnd;

    fn range(start: &str, end: &str) -> KeyRange {
        KeyRange { start: start.into(), end: RangeEnd::Before(end.into()) }
    }

    #[test]
    fn the_page_after_a_remembered_one_is_known_once() {
        let counts = PageCounts::new();
        counts.remember(&range("/a/", "/a0"), 7, b"/a/k2", 10, 3);
        // Another revision, start or end is another page.
        assert_eq!(counts.take(&range("/a/k2\0", "/a0"), 8), None);
        assert_eq!(counts.take(&range("/a/k2", "/a0"), 7), None);
        assert_eq!(counts.take(&range("/a/k2\0", "/b0"), 7), None);
        assert_eq!(counts.take(&range("/a/k2\0", "/a0"), 7), Some(7));
        // Taken: asked again, it is counted again.
        assert_eq!(counts.take(&range("/a/k2\0", "/a0"), 7), None);
    }

    #[test]
    fn the_oldest_continuations_are_forgotten_first() {
        let counts = PageCounts::new();
        for i in 0..HELD + 1 {
            counts.remember(&range("/a/", "/a0"), i as Revision, b"/a/k", 10, 1);
        }
        assert_eq!(counts.take(&range("/a/k\0", "/a0"), 0), None);
        assert_eq!(counts.take(&range("/a/k\0", "/a0"), 1), Some(9));
        assert_eq!(counts.take(&range("/a/k\0", "/a0"), HELD as Revision), Some(9));
    }

    /// A view that counts how often it is asked to count.
    struct Counting(crate::memory::MemTable, usize);

    impl crate::view::ReadView for Counting {
        fn scan(
            &mut self,
            range: &KeyRange,
            rev: Revision,
            limit: usize,
            keys_only: bool,
        ) -> crate::error::Result<Vec<crate::types::KeyValue>> {
            self.0.scan(range, rev, limit, keys_only)
        }
        fn count(&mut self, range: &KeyRange, rev: Revision) -> crate::error::Result<i64> {
            self.1 += 1;
            self.0.count(range, rev)
        }
    }

    /// 1,000 keys, and 100 more put after the revision listed.
    fn table() -> (Counting, Revision) {
        use crate::types::{Event, EventKind, KeyValue};
        let mut t = crate::memory::MemTable::at(1);
        let put = |key: String, rev| {
            let kv =
                KeyValue { key: key.into(), create_revision: rev, mod_revision: rev, version: 1, ..Default::default() };
            Event { kind: EventKind::Put, kv, prev_kv: None }
        };
        for i in 0..1000 {
            t.apply_committed(2 + i, vec![put(format!("/a/{i:04}"), 2 + i)]).unwrap();
        }
        let listed = t.revisions().current;
        for i in 0..100 {
            let rev = listed + 1 + i;
            t.apply_committed(rev, vec![put(format!("/a/{:04}x", i * 7), rev)]).unwrap();
        }
        (Counting(t, 0), listed)
    }

    /// kube-apiserver's paginated list: every page at the first page's revision, each starting
    /// right after the last key of the one before. With the counts, one walk of the range for
    /// the whole list, and every page's count as a walk would have found it.
    #[test]
    fn a_paginated_list_counts_its_range_once() {
        use crate::range::{execute, execute_with};
        use crate::request::RangeRequest;
        let (mut view, listed) = table();
        let counts = PageCounts::new();
        let (mut start, mut pages) = (b"/a/".to_vec(), 0);
        loop {
            let mut req = RangeRequest::new(KeyRange { start: start.clone(), end: RangeEnd::Before(b"/a0".to_vec()) });
            req.limit = 90;
            let with = execute_with(&mut view, &req, listed, Some(&counts)).unwrap();
            let walked_before = view.1;
            let without = execute(&mut view, &req, listed).unwrap();
            assert_eq!(with, without, "page {pages}");
            view.1 = walked_before;
            assert_eq!(with.count, 1000 - 90 * pages);
            pages += 1;
            if !with.more {
                break;
            }
            start = with.kvs.last().unwrap().key.clone();
            start.push(0);
        }
        assert_eq!(pages, 12);
        assert_eq!(view.1, 1, "the first page walks the range, the others take their count");
        // At the current revision the later keys count: a new list counts again.
        let mut req = RangeRequest::new(KeyRange { start: b"/a/".to_vec(), end: RangeEnd::Before(b"/a0".to_vec()) });
        req.limit = 90;
        assert_eq!(execute_with(&mut view, &req, listed + 100, Some(&counts)).unwrap().count, 1100);
    }
}
