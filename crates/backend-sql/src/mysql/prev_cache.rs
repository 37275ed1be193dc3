//! Previous versions carried from one event window to the next, so that a watch catching up
//! through many windows looks up each key's version before the history once, not once per
//! window.
//!
//! A watch replaying history asks for its events 1,000 revisions at a time (`kine_core`'s
//! catch-up window), and each window's events need every changed key's previous version. On
//! MySQL that is a lookup statement per window (`view::events`) whose plan MariaDB chooses from
//! its index statistics: a loose index scan (about 10 ms for 1,000 keys), or, once the table
//! holds many keys of one version, a scan of every version of those keys (90–250 ms). A replay
//! of 100,000 events over 1,000 keys made 100 such lookups: 2.3 s on a fresh database, 9.5 s
//! after the side-by-side benchmark's other workloads had changed the statistics. The windows
//! of one catch-up follow each other, so the previous version of a key changed in an earlier
//! window is that window's change; only keys not seen yet are looked up.
//!
//! **Invariant:** an entry of a [`Known`] is the key's newest change at or before the revision
//! its run has reached (every window of the run records its changes, newest last). Entries may
//! be forgotten at any time: a key without one is looked up in the database.

use crate::events::Change;
use kine_core::{KeyRange, Revision};
use std::collections::HashMap;
use std::sync::Mutex;

/// Key and value bytes one run keeps at most.
const RUN_BYTES: usize = 4 << 20;
/// Runs kept at once (catch-ups in progress on this node); the least recently used goes first.
const RUNS: usize = 8;

/// What one run of consecutive windows over one range knows: for some keys, their newest change.
#[derive(Debug, Default)]
pub struct Known {
    newest: HashMap<Vec<u8>, Change>,
    bytes: usize,
}

impl Known {
    pub fn get(&self, key: &[u8]) -> Option<&Change> {
        self.newest.get(key)
    }

    /// Records a window's changes (in revision order). Over [`RUN_BYTES`], what came before the
    /// window is forgotten, and the window's own changes too if they alone are over.
    pub fn record(&mut self, changes: &[Change]) {
        for change in changes {
            self.insert(change);
        }
        if self.bytes > RUN_BYTES {
            *self = Known::default();
            for change in changes {
                self.insert(change);
            }
            if self.bytes > RUN_BYTES {
                *self = Known::default();
            }
        }
    }

    fn insert(&mut self, change: &Change) {
        let size = |c: &Change| c.0.key.len() + c.0.value.len();
        self.bytes += size(change);
        if let Some(old) = self.newest.insert(change.0.key.clone(), change.clone()) {
            self.bytes -= size(&old);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.newest.len()
    }
}

/// The runs in progress: each ends at the last window's upper revision.
#[derive(Debug, Default)]
pub struct PrevCache {
    runs: Mutex<Vec<(KeyRange, Revision, Known)>>,
}

impl PrevCache {
    /// What the run that reached `after` over `range` knows (nothing if there is none): a
    /// window over `range` after `after` continues it.
    pub fn take(&self, range: &KeyRange, after: Revision) -> Known {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        match runs.iter().position(|(r, until, _)| *until == after && r == range) {
            Some(i) => runs.remove(i).2,
            None => Known::default(),
        }
    }

    /// Keeps what a run knows once it reached `until`, as the most recently used run.
    pub fn put(&self, range: KeyRange, until: Revision, known: Known) {
        if known.newest.is_empty() {
            return;
        }
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|(r, u, _)| !(*u == until && *r == range));
        if runs.len() >= RUNS {
            runs.remove(0);
        }
        runs.push((range, until, known));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kine_core::KeyValue;

    fn change(key: &str, rev: Revision, value_len: usize) -> Change {
        let kv = KeyValue { key: key.into(), mod_revision: rev, value: vec![b'v'; value_len], ..Default::default() };
        (kv, false)
    }

    #[test]
    fn a_run_continues_only_where_it_stopped_and_over_its_own_range() {
        let cache = PrevCache::default();
        let range = KeyRange::single("/a/");
        let mut known = cache.take(&range, 10);
        assert!(known.get(b"/a/1").is_none());
        known.record(&[change("/a/1", 11, 3), change("/a/2", 12, 3), change("/a/1", 13, 3)]);
        cache.put(range.clone(), 20, known);
        // Another range, or another starting point, gets nothing.
        assert!(cache.take(&KeyRange::single("/b/"), 20).get(b"/a/1").is_none());
        assert!(cache.take(&range, 19).get(b"/a/1").is_none());
        // The continuation gets each key's newest change, once.
        let known = cache.take(&range, 20);
        assert_eq!(known.get(b"/a/1").map(|c| c.0.mod_revision), Some(13));
        assert_eq!(known.get(b"/a/2").map(|c| c.0.mod_revision), Some(12));
        assert!(cache.take(&range, 20).get(b"/a/1").is_none(), "taken");
    }

    #[test]
    fn a_run_over_its_budget_keeps_only_its_last_window_or_nothing() {
        let mut known = Known::default();
        let big = RUN_BYTES / 4;
        known.record(&[change("/k/1", 2, big), change("/k/2", 3, big)]);
        known.record(&[change("/k/3", 4, big), change("/k/4", 5, big)]);
        assert_eq!(known.len(), 2, "the last window's changes");
        assert!(known.get(b"/k/4").is_some() && known.get(b"/k/1").is_none());
        known.record(&[change("/k/5", 6, RUN_BYTES)]);
        assert_eq!(known.len(), 0);
    }

    #[test]
    fn the_least_recently_used_run_goes_first() {
        let cache = PrevCache::default();
        for i in 0..=RUNS as Revision {
            let mut known = Known::default();
            known.record(&[change("/k", i, 1)]);
            cache.put(KeyRange::all(), i, known);
        }
        assert!(cache.take(&KeyRange::all(), 0).get(b"/k").is_none(), "the oldest run was dropped");
        assert!(cache.take(&KeyRange::all(), RUNS as Revision).get(b"/k").is_some());
    }
}
