//! Compaction of a [`MemTable`], whole (`compact`) or in steps (`compact_begin`, then
//! `compact_step` until it says done), so that a replica that shares its table with writers
//! and readers can release its lock between steps. The first step makes the revision the
//! compact revision (reads below it fail from then on); the others only remove what no read
//! at or above it needs: the versions superseded at it, a few thousand keys per step in key
//! order, then the log below it. A step's work is bounded whatever the size of the table.

use super::table::{Key, MemTable};
use crate::error::Result;
use crate::txn;
use crate::types::Revision;
use std::collections::HashMap;
use std::ops::Bound;

/// Keys examined per step (of a compaction, or of its planning).
pub const STEP_KEYS: usize = 4096;
/// Log entries dropped per step.
const STEP_LOG: usize = 65_536;

/// A key a compaction plan names: the key, its newest revision at or below the compact
/// revision, and whether that newest change is a deletion.
pub type PlannedKey = (Vec<u8>, Revision, bool);

/// A compaction in progress (`MemTable::compact_begin`).
#[derive(Debug)]
pub struct TableCompaction {
    rev: Revision,
    /// The last key trimmed; `None` before the first.
    after: Option<Key>,
    keys_done: bool,
}

impl MemTable {
    /// Compacts at `rev` in one go.
    pub fn compact(&mut self, rev: Revision) -> Result<()> {
        let mut c = self.compact_begin(rev)?;
        while !self.compact_step(&mut c) {}
        Ok(())
    }

    /// Checks `rev` and makes it the compact revision; the steps remove the rest.
    pub fn compact_begin(&mut self, rev: Revision) -> Result<TableCompaction> {
        txn::check_compact(rev, self.current, self.compacted)?;
        self.compacted = rev;
        Ok(TableCompaction { rev, after: None, keys_done: false })
    }

    /// One step of `c`; `true` when the compaction is done.
    pub fn compact_step(&mut self, c: &mut TableCompaction) -> bool {
        if !c.keys_done {
            let keys = self.keys_after(c.after.as_deref());
            c.keys_done = keys.len() < STEP_KEYS;
            for key in &keys {
                self.trim(key, c.rev);
            }
            c.after = keys.into_iter().last();
            return false;
        }
        let below = self.log.partition_point(|(r, _)| *r < c.rev);
        if below > 0 {
            self.log.drain(..below.min(STEP_LOG));
            return false;
        }
        self.settle_log_at(c.rev);
        if self.values.wants_rewrite()
            && let Err(e) = self.rewrite_values()
        {
            // The old file still serves; the next compaction tries again.
            tracing::warn!(error = %e, "cannot reclaim the dead space of the replica's value file");
        }
        true
    }

    /// For compaction planning: `(key, newest revision <= until, is that newest a deletion)`
    /// for the keys changed in `[since, until]` (a deletion at the previous compact revision
    /// `since` is still held, so it is included) that hold versions a compaction at `until`
    /// removes.
    pub fn changed_keys_between(&self, since: Revision, until: Revision) -> Vec<PlannedKey> {
        let (mut out, mut after) = (Vec::new(), None);
        loop {
            let (chunk, next) = self.changed_keys_chunk(since, until, after.as_deref());
            out.extend(chunk);
            match next {
                Some(key) => after = Some(key),
                None => return out,
            }
        }
    }

    /// `changed_keys_between` for the next `STEP_KEYS` keys after `after` (from the first key
    /// when `None`), and the last key examined: where the next chunk starts, `None` at the end.
    /// Writes between two chunks change nothing at or below `until`.
    pub fn changed_keys_chunk(
        &self,
        since: Revision,
        until: Revision,
        after: Option<&[u8]>,
    ) -> (Vec<PlannedKey>, Option<Vec<u8>>) {
        let keys = self.keys_after(after);
        let mut out = Vec::new();
        for key in &keys {
            let Some(history) = self.keys.get(key) else { continue };
            if history.iter().any(|(r, _)| *r >= since && *r <= until)
                && let Some(i) = history.iter().rposition(|(r, _)| *r <= until)
            {
                // Only keys with something to remove: versions older than the newest at `until`,
                // or that newest itself, a deletion below `until`. A key written once since the
                // last compaction (most of a large store's) has nothing.
                let (r, deleted) = (history[i].0, history[i].1.is_none());
                if i > 0 || (deleted && r < until) {
                    out.push((key.to_vec(), r, deleted));
                }
            }
        }
        let next = if keys.len() < STEP_KEYS { None } else { keys.last().map(|k| k.to_vec()) };
        (out, next)
    }

    /// Changes in `(since, until]` about `stride` revisions apart, `(key, revision)`: the first
    /// change at or after `since + 1`, then the first at or after `stride` past the last one
    /// taken, and so on. A compaction reads the stored versions these name before it removes
    /// anything, so that the store has the stretches of history it will purge loaded (NATS).
    pub fn log_samples(&self, since: Revision, until: Revision, stride: Revision) -> Vec<(Vec<u8>, Revision)> {
        let (mut out, mut next) = (Vec::new(), since + 1);
        while next <= until {
            let i = self.log.partition_point(|(r, _)| *r < next);
            match self.log.get(i) {
                Some((r, key)) if *r <= until => {
                    out.push((key.to_vec(), *r));
                    next = r + stride.max(1);
                }
                _ => break,
            }
        }
        out
    }

    /// The next `STEP_KEYS` keys after `after`, in key order.
    fn keys_after(&self, after: Option<&[u8]>) -> Vec<Key> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.keys.range::<[u8], _>((start, Bound::Unbounded)).take(STEP_KEYS).map(|(k, _)| k.clone()).collect()
    }

    /// Keeps the key's newest version at or before `rev` (a deletion only if it is at `rev`
    /// itself, as etcd does) and all later ones; a key left with no version goes.
    fn trim(&mut self, key: &Key, rev: Revision) {
        let values = &mut self.values;
        let Some(history) = self.keys.get_mut(key) else { return };
        if let Some(i) = history.iter().rposition(|(r, _)| *r <= rev) {
            let gone = history[i].1.is_none() && history[i].0 < rev;
            for (_, version) in history.drain(..if gone { i + 1 } else { i }) {
                if let Some(v) = version {
                    values.release(&v.value);
                }
            }
        }
        if history.is_empty() {
            self.keys.remove(key);
        }
    }

    /// At `rev` itself only what survived compaction stays in the log (as in etcd): each key's
    /// last change at `rev`, whose previous versions are gone. A key changed twice at `rev`
    /// (deleted, then put again in one txn) keeps its last entry: the event stays where that
    /// change was made.
    fn settle_log_at(&mut self, rev: Revision) {
        let at = self.log.partition_point(|(r, _)| *r <= rev);
        let keys = &self.keys;
        let at_rev: Vec<_> = self.log.drain(..at).collect();
        let last: HashMap<&[u8], usize> = at_rev.iter().enumerate().map(|(i, (_, k))| (&k[..], i)).collect();
        let kept: Vec<_> = at_rev
            .iter()
            .enumerate()
            .filter(|(i, (_, key))| {
                last.get(&key[..]) == Some(i) && keys.get(key).and_then(|h| h.first()).is_some_and(|(r, _)| *r == rev)
            })
            .map(|(_, entry)| entry.clone())
            .collect();
        for entry in kept.into_iter().rev() {
            self.log.push_front(entry);
        }
        self.log.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Event, EventKind, KeyValue};

    fn event(kind: EventKind, key: &str, rev: Revision, version: i64) -> Event {
        let kv = KeyValue {
            key: key.into(),
            create_revision: if kind == EventKind::Put { rev - version + 1 } else { 0 },
            mod_revision: rev,
            version: if kind == EventKind::Put { version } else { 0 },
            value: format!("{key}@{rev}").into_bytes(),
            ..Default::default()
        };
        Event { kind, kv, prev_kv: None }
    }

    /// Three versions of keys enough for several steps, every seventh deleted at the end.
    fn history() -> MemTable {
        let mut t = MemTable::at(1);
        let mut rev = 1;
        for version in 1..=3 {
            for k in 0..2 * STEP_KEYS + 10 {
                rev += 1;
                t.apply_committed(rev, vec![event(EventKind::Put, &format!("k{k:05}"), rev, version)]).unwrap();
            }
        }
        for k in (0..2 * STEP_KEYS + 10).step_by(7) {
            rev += 1;
            t.apply_committed(rev, vec![event(EventKind::Delete, &format!("k{k:05}"), rev, 0)]).unwrap();
        }
        t
    }

    /// A compaction in steps with writes between them leaves the table that a compaction in
    /// one go followed by the same writes leaves.
    #[test]
    fn steps_with_writes_between_them_end_as_one_compaction() {
        let (mut whole, mut stepped) = (history(), history());
        let at = whole.revisions().current - 100;
        whole.compact(at).unwrap();
        let mut c = stepped.compact_begin(at).unwrap();
        assert_eq!(stepped.revisions().compacted, at, "reads below are refused from the first step");
        let mut late = Vec::new();
        loop {
            let rev = stepped.revisions().current + 1;
            let write = event(EventKind::Put, &format!("late{rev}"), rev, 1);
            stepped.apply_committed(rev, vec![write.clone()]).unwrap();
            late.push((rev, write));
            if stepped.compact_step(&mut c) {
                break;
            }
        }
        assert!(late.len() > 3, "the compaction took several steps");
        for (rev, write) in late {
            whole.apply_committed(rev, vec![write]).unwrap();
        }
        assert_eq!(format!("{:?}", whole.keys), format!("{:?}", stepped.keys));
        assert_eq!(whole.log, stepped.log);
        assert_eq!(whole.changed_keys_between(at, at + 50), stepped.changed_keys_between(at, at + 50));
    }

    /// The plan names only the keys a compaction removes something of.
    #[test]
    fn keys_with_nothing_to_remove_are_not_planned() {
        let mut t = MemTable::at(1);
        let writes = [
            (EventKind::Put, "once", 1),
            (EventKind::Put, "twice", 1),
            (EventKind::Put, "twice", 2),
            (EventKind::Put, "gone", 1),
            (EventKind::Delete, "gone", 0),
            (EventKind::Put, "late", 1),
            (EventKind::Put, "deleted-at-until", 1),
            (EventKind::Delete, "deleted-at-until", 0),
        ];
        for (i, (kind, key, version)) in writes.into_iter().enumerate() {
            let rev = 2 + i as Revision;
            t.apply_committed(rev, vec![event(kind, key, rev, version)]).unwrap();
        }
        let planned = |until| {
            t.changed_keys_between(0, until)
                .into_iter()
                .map(|(k, r, d)| (String::from_utf8(k).unwrap(), r, d))
                .collect::<Vec<_>>()
        };
        // At 9 (the last delete): "once" and "late" were written once; "deleted-at-until" loses
        // its put, its deletion at the compact revision itself stays; "gone" goes whole.
        assert_eq!(
            planned(9),
            vec![("deleted-at-until".into(), 9, true), ("gone".into(), 6, true), ("twice".into(), 4, false)]
        );
        assert_eq!(planned(3), vec![]);
    }

    #[test]
    fn log_samples_are_a_stride_apart_within_the_range() {
        let t = history();
        let current = t.revisions().current;
        let samples = t.log_samples(1, current, 1000);
        let revs: Vec<Revision> = samples.iter().map(|(_, r)| *r).collect();
        assert_eq!(revs.first(), Some(&2));
        assert!(revs.windows(2).all(|w| w[1] - w[0] == 1000), "{revs:?}");
        assert!(*revs.last().unwrap() > current - 1000);
        // Each names the key changed at its revision.
        assert_eq!(samples[1].0, b"k01000".to_vec());
        // Bounds: nothing at or below `since`, nothing past `until`, none in an empty range.
        assert_eq!(t.log_samples(10, 20, 4).iter().map(|(_, r)| *r).collect::<Vec<_>>(), vec![11, 15, 19]);
        assert!(t.log_samples(current, current + 5, 1).is_empty());
        assert_eq!(t.log_samples(0, 3, 0).len(), 2, "a stride of 0 counts as 1");
    }
}
