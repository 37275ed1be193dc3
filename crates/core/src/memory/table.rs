//! [`MemTable`]: the whole key history, compactly. The `memory://` backend and the NATS
//! backend's replica of its bucket both keep their data in one.
//!
//! Memory per key matters (a replica holds the whole key space): each key is held once, shared
//! by the map and the change log (`events.rs`); a version holds only what the key and its
//! revision do not already say, and its value is held where the table's `Values` keep them (in
//! memory, or in a file: `values.rs`).

use super::values::{Value, Values};
use crate::backend::Revisions;
use crate::error::Result;
use crate::txn::{self, WriteOp};
use crate::types::{Event, EventKind, KeyRange, KeyValue, LeaseId, RangeEnd, Revision, RevisionEvents};
use crate::view::{ReadView, WriteView};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

/// A key, held once: the map's key and the log's entries share it.
pub(super) type Key = Arc<[u8]>;

/// One version of a key. Its key is the map's and its mod revision the history entry's.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) create_revision: Revision,
    version: i64,
    lease: LeaseId,
    pub(super) value: Value,
}

impl Stored {
    fn of(kv: &KeyValue, values: &mut Values) -> Stored {
        Stored {
            create_revision: kv.create_revision,
            version: kv.version,
            lease: kv.lease,
            value: values.store(&kv.value),
        }
    }

    pub(super) fn to_kv(&self, key: &[u8], mod_revision: Revision, values: &Values) -> Result<KeyValue> {
        Ok(KeyValue {
            key: key.to_vec(),
            create_revision: self.create_revision,
            mod_revision,
            version: self.version,
            value: values.load(&self.value)?,
            lease: self.lease,
        })
    }
}

/// One key's versions in revision order; `None` marks a deletion.
pub(super) type History = Vec<(Revision, Option<Stored>)>;

#[derive(Debug)]
pub struct MemTable {
    pub(super) current: Revision,
    pub(super) compacted: Revision,
    pub(super) keys: BTreeMap<Key, History>,
    /// Every key change in revision order, in event order within a revision (for watch
    /// catch-up). The events themselves are rebuilt from `keys`, so each version is held once.
    pub(super) log: VecDeque<(Revision, Key)>,
    leases: HashMap<LeaseId, i64>,
    pub(super) values: Values,
}

impl Default for MemTable {
    fn default() -> Self {
        MemTable {
            current: 1,
            compacted: -1,
            keys: BTreeMap::new(),
            log: VecDeque::new(),
            leases: HashMap::new(),
            values: Values::default(),
        }
    }
}

/// The version of a history live at `rev`, with its revision.
fn live_at(history: &[(Revision, Option<Stored>)], rev: Revision) -> Option<(Revision, &Stored)> {
    history.iter().rev().find(|(r, _)| *r <= rev).and_then(|(r, v)| v.as_ref().map(|v| (*r, v)))
}

impl MemTable {
    fn keys_in<'a>(&'a self, range: &'a KeyRange) -> Box<dyn Iterator<Item = (&'a Key, &'a History)> + 'a> {
        let start = range.start.as_slice();
        match &range.end {
            RangeEnd::Single => Box::new(self.keys.get_key_value(start).into_iter()),
            _ if range.is_empty() => Box::new(std::iter::empty()),
            RangeEnd::Unbounded => Box::new(self.keys.range::<[u8], _>((Bound::Included(start), Bound::Unbounded))),
            RangeEnd::Before(end) => {
                Box::new(self.keys.range::<[u8], _>((Bound::Included(start), Bound::Excluded(end.as_slice()))))
            }
        }
    }

    /// An empty table whose current revision is `revision` (a replica of a remote log).
    pub fn at(revision: Revision) -> MemTable {
        MemTable { current: revision, ..MemTable::default() }
    }

    /// Like [`MemTable::at`], with the values in a file in `dir` (see `values.rs`).
    pub fn at_with_values_in(revision: Revision, dir: &Path) -> MemTable {
        MemTable { current: revision, values: Values::in_file(dir), ..MemTable::default() }
    }

    /// Replica use: records revisions that carry no key change (the log's own bookkeeping).
    pub fn advance(&mut self, revision: Revision) {
        self.current = self.current.max(revision);
    }

    /// Replica use: the compact revision learnt from the shared store.
    pub fn set_compacted(&mut self, revision: Revision) {
        self.compacted = self.compacted.max(revision);
    }

    /// Replica use: applies one committed revision whose events were decided elsewhere.
    /// `prev_kv` of each event is filled in from this table. Returns the completed events.
    /// Fails only if a previous value cannot be read back (its file); the revision is then not
    /// applied, and the table should be loaded again.
    pub fn apply_committed(&mut self, revision: Revision, mut events: Vec<Event>) -> Result<RevisionEvents> {
        for event in events.iter_mut() {
            event.prev_kv = if event.is_create() {
                None
            } else {
                let key = event.kv.key.as_slice();
                match self.keys.get(key).and_then(|h| live_at(h, revision - 1)) {
                    Some((r, v)) => Some(v.to_kv(key, r, &self.values)?),
                    None => None,
                }
            };
        }
        for (i, event) in events.iter().enumerate() {
            let _ = self.append(revision, i, event);
        }
        let ev = RevisionEvents { revision, events };
        self.log_events(&ev);
        self.current = self.current.max(revision);
        Ok(ev)
    }

    /// Runs a write op against the current state without keeping it: the response and the
    /// events it would produce (at `current + 1`). The table is unchanged afterwards.
    pub fn evaluate(&mut self, op: &WriteOp) -> Result<txn::Applied> {
        // What is undone right away stays out of the value file.
        self.values.inline_only = true;
        let applied = txn::apply(self, op);
        self.values.inline_only = false;
        let applied = applied?;
        if let Some(ev) = &applied.events {
            for e in ev.events.iter().rev() {
                let key = e.kv.key.as_slice();
                if let Some(history) = self.keys.get_mut(key) {
                    history.pop();
                    if history.is_empty() {
                        self.keys.remove(key);
                    }
                }
            }
        }
        Ok(applied)
    }

    /// The revision of a key's newest change still held, and whether it is a deletion.
    pub fn newest(&self, key: &[u8]) -> Option<(Revision, bool)> {
        self.keys.get(key).and_then(|h| h.last()).map(|(r, v)| (*r, v.is_none()))
    }

    /// Replica use, after loading a log that compaction at `compacted` trimmed: the revision
    /// below which some key's history is incomplete for another reason (a per-key message limit,
    /// a purge by hand). Compaction keeps each key's newest version at or below its revision
    /// unless that is a deletion, so a key whose oldest version held is above `compacted` must
    /// start with a creation; a deletion or a later version there means older versions are
    /// missing, and reads below it would be wrong. -1 when no history is cut.
    pub fn history_floor(&self, compacted: Revision) -> Revision {
        self.keys
            .values()
            .filter_map(|h| h.first())
            .filter(|(rev, v)| *rev > compacted && v.as_ref().is_none_or(|v| v.version > 1))
            .map(|(rev, _)| *rev)
            .max()
            .unwrap_or(-1)
    }

    pub fn revisions(&self) -> Revisions {
        Revisions { current: self.current, compacted: self.compacted }
    }

    /// Applies a write op and makes it current. Returns the op's response and events.
    pub fn apply(&mut self, op: &WriteOp) -> Result<txn::Applied> {
        let applied = txn::apply(self, op)?;
        if let Some(ev) = &applied.events {
            self.log_events(ev);
            self.current = ev.revision;
        }
        Ok(applied)
    }

    /// Copies the live values to a new file (the old one is closed, and so freed).
    pub(super) fn rewrite_values(&mut self) -> Result<()> {
        let mut live: Vec<&mut Value> = self
            .keys
            .values_mut()
            .flat_map(|h| h.iter_mut().filter_map(|(_, v)| v.as_mut().map(|v| &mut v.value)))
            .filter(|v| matches!(v, Value::File { .. }))
            .collect();
        self.values.rewrite(&mut live)
    }

    pub fn lease_list(&self) -> Vec<(LeaseId, i64)> {
        self.leases.iter().map(|(id, ttl)| (*id, *ttl)).collect()
    }

    /// An estimate of the bytes held: keys, values and per-version bookkeeping.
    pub fn size(&self) -> usize {
        self.keys
            .iter()
            .map(|(k, h)| k.len() + h.iter().map(|(_, v)| v.as_ref().map_or(16, |v| v.value.len() + 40)).sum::<usize>())
            .sum()
    }
}

impl ReadView for MemTable {
    fn scan(&mut self, range: &KeyRange, rev: Revision, limit: usize, _keys_only: bool) -> Result<Vec<KeyValue>> {
        let mut out = Vec::new();
        for (key, history) in self.keys_in(range) {
            if let Some((r, v)) = live_at(history, rev) {
                out.push(v.to_kv(key, r, &self.values)?);
                if limit > 0 && out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn count(&mut self, range: &KeyRange, rev: Revision) -> Result<i64> {
        Ok(self.keys_in(range).filter(|(_, h)| live_at(h, rev).is_some()).count() as i64)
    }
}

impl WriteView for MemTable {
    fn revision(&self) -> Revision {
        self.current
    }
    fn compact_revision(&self) -> Revision {
        self.compacted
    }
    fn keys_with_lease(&mut self, lease: LeaseId, rev: Revision) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .keys
            .iter()
            .filter(|(_, h)| live_at(h, rev).is_some_and(|(_, v)| v.lease == lease))
            .map(|(k, _)| k.to_vec())
            .collect())
    }
    fn lease(&mut self, id: LeaseId) -> Result<Option<i64>> {
        Ok(self.leases.get(&id).copied())
    }
    fn insert_lease(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        self.leases.insert(id, ttl);
        Ok(())
    }
    fn remove_lease(&mut self, id: LeaseId) -> Result<()> {
        self.leases.remove(&id);
        Ok(())
    }
    fn append(&mut self, rev: Revision, _index: usize, event: &Event) -> Result<()> {
        let version = match event.kind {
            EventKind::Put => Some(Stored::of(&event.kv, &mut self.values)),
            EventKind::Delete => None,
        };
        let key = event.kv.key.as_slice();
        match self.keys.get_mut(key) {
            Some(history) => history.push((rev, version)),
            // Most keys hold one version: a new history has room for exactly one (`vec![x]`
            // allocates one slot; a Vec's first push would reserve four).
            None => {
                self.keys.insert(Key::from(key), vec![(rev, version)]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, rev: Revision, version: i64) -> Event {
        let kv = KeyValue { key: key.into(), create_revision: rev, mod_revision: rev, version, ..Default::default() };
        Event { kind: EventKind::Put, kv, prev_kv: None }
    }

    fn delete(key: &str, rev: Revision) -> Event {
        Event {
            kind: EventKind::Delete,
            kv: KeyValue { key: key.into(), mod_revision: rev, ..Default::default() },
            prev_kv: None,
        }
    }

    /// A key deleted and put again in one txn (etcd allows it when the delete's range runs to
    /// the end of the key space) keeps, after a compaction at that revision, only its put, at
    /// the place of the put: watch catch-up keeps the txn's order (found by the model test,
    /// seed 8016253243914952406, where the put came back at the delete's place).
    #[test]
    fn compaction_keeps_a_twice_changed_keys_last_change_in_place() {
        let mut t = MemTable::at(1);
        t.apply_committed(2, vec![put("a", 2, 1), put("b", 2, 1), put("c", 2, 1)]).unwrap();
        let mut again = put("b", 3, 1);
        again.kv.create_revision = 3;
        t.apply_committed(3, vec![delete("a", 3), delete("b", 3), delete("c", 3), again]).unwrap();
        let order = |t: &MemTable| -> Vec<(String, EventKind)> {
            let all = KeyRange { start: vec![0], end: crate::types::RangeEnd::Unbounded };
            t.events(&all, 2, 3).unwrap()[0]
                .events
                .iter()
                .map(|e| (String::from_utf8_lossy(&e.kv.key).into_owned(), e.kind))
                .collect()
        };
        let d = EventKind::Delete;
        assert_eq!(
            order(&t),
            [("a".into(), d), ("b".into(), d), ("c".into(), d), ("b".into(), EventKind::Put)].to_vec()
        );
        t.compact(3).unwrap();
        assert_eq!(order(&t), [("a".into(), d), ("c".into(), d), ("b".into(), EventKind::Put)].to_vec());
    }

    #[test]
    fn history_floor_finds_histories_cut_above_the_compact_revision() {
        let mut t = MemTable::at(0);
        // "a": kept at the compact revision 5, then updated: complete.
        t.apply_committed(4, vec![put("a", 4, 3)]).unwrap();
        t.apply_committed(7, vec![put("a", 7, 4)]).unwrap();
        // "b": created after the compaction: complete.
        t.apply_committed(8, vec![put("b", 8, 1)]).unwrap();
        assert_eq!(t.history_floor(5), -1);
        // "c": its oldest version held is version 6, above the compact revision: older ones
        // were dropped.
        t.apply_committed(9, vec![put("c", 9, 6)]).unwrap();
        // "d": starts with a deletion above the compact revision: its versions are missing.
        t.apply_committed(10, vec![delete("d", 10)]).unwrap();
        assert_eq!(t.history_floor(5), 10);
        assert_eq!(t.history_floor(9), 10);
        assert_eq!(t.history_floor(10), -1);
    }
}
