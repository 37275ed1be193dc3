//! The in-memory backend (`memory://`): the reference implementation and test oracle.
//! Nothing survives a restart.

use crate::backend::{Backend, BackendStatus, FEED_CAPACITY, Revisions};
use crate::error::{Error, Result};
use crate::range;
use crate::request::{RangeRequest, RangeResponse, Revisioned};
use crate::txn::{self, WriteOp, WriteResponse};
use crate::types::{Event, EventKind, KeyRange, KeyValue, LeaseId, RangeEnd, Revision, RevisionEvents};
use crate::view::{ReadView, WriteView};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// The whole key history, in memory.
/// One key's versions in revision order; `None` marks a deletion.
type History = Vec<(Revision, Option<KeyValue>)>;

#[derive(Debug)]
pub struct MemTable {
    current: Revision,
    compacted: Revision,
    /// Per key, its versions in revision order; `None` marks a deletion.
    keys: BTreeMap<Vec<u8>, History>,
    /// Per revision, the keys it changed, in event order (for watch catch-up). The events
    /// themselves are rebuilt from `keys`, so each version is held once.
    log: BTreeMap<Revision, Vec<Vec<u8>>>,
    leases: HashMap<LeaseId, i64>,
}

impl Default for MemTable {
    fn default() -> Self {
        MemTable { current: 1, compacted: -1, keys: BTreeMap::new(), log: BTreeMap::new(), leases: HashMap::new() }
    }
}

impl MemTable {
    fn keys_in<'a>(&'a self, range: &'a KeyRange) -> Box<dyn Iterator<Item = (&'a Vec<u8>, &'a History)> + 'a> {
        match &range.end {
            RangeEnd::Single => Box::new(self.keys.get_key_value(&range.start).into_iter()),
            _ if range.is_empty() => Box::new(std::iter::empty()),
            RangeEnd::Unbounded => {
                Box::new(self.keys.range::<Vec<u8>, _>((Bound::Included(&range.start), Bound::Unbounded)))
            }
            RangeEnd::Before(end) => {
                Box::new(self.keys.range::<Vec<u8>, _>((Bound::Included(&range.start), Bound::Excluded(end))))
            }
        }
    }

    fn live_at(history: &[(Revision, Option<KeyValue>)], rev: Revision) -> Option<&KeyValue> {
        history.iter().rev().find(|(r, _)| *r <= rev).and_then(|(_, kv)| kv.as_ref())
    }

    /// An empty table whose current revision is `revision` (a replica of a remote log).
    pub fn at(revision: Revision) -> MemTable {
        MemTable { current: revision, ..MemTable::default() }
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
    pub fn apply_committed(&mut self, revision: Revision, events: Vec<Event>) -> RevisionEvents {
        let mut done = Vec::with_capacity(events.len());
        for (i, mut event) in events.into_iter().enumerate() {
            event.prev_kv = if event.is_create() {
                None
            } else {
                self.keys.get(&event.kv.key).and_then(|h| Self::live_at(h, revision - 1)).cloned()
            };
            let _ = self.append(revision, i, &event);
            done.push(event);
        }
        let ev = RevisionEvents { revision, events: done };
        self.log_events(&ev);
        self.current = self.current.max(revision);
        ev
    }

    /// Runs a write op against the current state without keeping it: the response and the
    /// events it would produce (at `current + 1`). The table is unchanged afterwards.
    pub fn evaluate(&mut self, op: &WriteOp) -> Result<txn::Applied> {
        let applied = txn::apply(self, op)?;
        if let Some(ev) = &applied.events {
            for e in ev.events.iter().rev() {
                if let Some(history) = self.keys.get_mut(&e.kv.key) {
                    history.pop();
                    if history.is_empty() {
                        self.keys.remove(&e.kv.key);
                    }
                }
            }
        }
        Ok(applied)
    }

    /// The revision of a key's newest change still held, and whether it is a deletion.
    pub fn newest(&self, key: &[u8]) -> Option<(Revision, bool)> {
        self.keys.get(key).and_then(|h| h.last()).map(|(r, kv)| (*r, kv.is_none()))
    }

    /// For compaction planning: `(key, newest revision <= until, is that newest a deletion)`
    /// for the keys changed in `[since, until]` (a deletion at the previous compact revision
    /// `since` is still held, so it is included).
    pub fn changed_keys_between(&self, since: Revision, until: Revision) -> Vec<(Vec<u8>, Revision, bool)> {
        let mut out = Vec::new();
        for (key, history) in &self.keys {
            if history.iter().any(|(r, _)| *r >= since && *r <= until)
                && let Some((r, kv)) = history.iter().rev().find(|(r, _)| *r <= until)
            {
                out.push((key.clone(), *r, kv.is_none()));
            }
        }
        out
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
            .filter(|(rev, kv)| *rev > compacted && kv.as_ref().is_none_or(|kv| kv.version > 1))
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

    pub fn compact(&mut self, rev: Revision) -> Result<()> {
        txn::check_compact(rev, self.current, self.compacted)?;
        self.keys.retain(|_, history| {
            // Keep the newest version at or before `rev` (a deletion only if it is at `rev`
            // itself, as etcd does), and all later ones.
            let keep_from = history.iter().rposition(|(r, _)| *r <= rev);
            if let Some(i) = keep_from {
                let gone = history[i].1.is_none() && history[i].0 < rev;
                history.drain(..if gone { i + 1 } else { i });
            }
            !history.is_empty()
        });
        // History at or above `rev` stays. At `rev` itself only what survived compaction remains
        // (as in etcd): each key's last change at `rev`, whose previous versions are gone.
        self.log = self.log.split_off(&rev);
        if let Some(changed) = self.log.get_mut(&rev) {
            let keys = &self.keys;
            changed.retain(|key| keys.get(key).and_then(|h| h.first()).is_some_and(|(r, _)| *r == rev));
            if changed.is_empty() {
                self.log.remove(&rev);
            }
        }
        self.compacted = rev;
        Ok(())
    }

    pub fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        if after + 1 < self.compacted {
            return Err(Error::Compacted { compact_revision: self.compacted });
        }
        let mut out = Vec::new();
        if after >= until {
            return Ok(out);
        }
        for (rev, changed) in self.log.range(after + 1..=until) {
            let mut seen: HashMap<&[u8], usize> = HashMap::new();
            let events: Vec<Event> = changed
                .iter()
                .filter_map(|key| {
                    let nth = seen.entry(key.as_slice()).or_default();
                    *nth += 1;
                    if range.contains(key) { self.event_at(key, *rev, *nth - 1) } else { None }
                })
                .collect();
            if !events.is_empty() {
                out.push(RevisionEvents { revision: *rev, events });
            }
        }
        Ok(out)
    }

    fn log_events(&mut self, ev: &RevisionEvents) {
        if !ev.events.is_empty() {
            self.log.insert(ev.revision, ev.events.iter().map(|e| e.kv.key.clone()).collect());
        }
    }

    /// The `nth` change of `key` at `rev` (a key can change twice in one revision), rebuilt
    /// from its history: the version written then (a deletion carries only the key and
    /// revision, as in etcd) and, as etcd reports it, the key's version at the revision before
    /// (none for a creation). Compaction keeps the version live at the compact revision, so
    /// that is held unless compaction removed it (then, as at the compact revision itself,
    /// there is none).
    fn event_at(&self, key: &[u8], rev: Revision, nth: usize) -> Option<Event> {
        let history = self.keys.get(key)?;
        let first = history.partition_point(|(r, _)| *r < rev);
        let (r, version) = history.get(first + nth)?;
        if *r != rev {
            return None;
        }
        let before = history[..first].last().and_then(|(_, kv)| kv.clone());
        let event = match version {
            Some(kv) => Event { kind: EventKind::Put, kv: kv.clone(), prev_kv: before },
            None => Event {
                kind: EventKind::Delete,
                kv: KeyValue { key: key.to_vec(), mod_revision: rev, ..Default::default() },
                prev_kv: before,
            },
        };
        Some(if event.is_create() { Event { prev_kv: None, ..event } } else { event })
    }

    pub fn lease_list(&self) -> Vec<(LeaseId, i64)> {
        self.leases.iter().map(|(id, ttl)| (*id, *ttl)).collect()
    }
}

impl ReadView for MemTable {
    fn scan(&mut self, range: &KeyRange, rev: Revision, limit: usize, _keys_only: bool) -> Result<Vec<KeyValue>> {
        let mut out = Vec::new();
        for (_, history) in self.keys_in(range) {
            if let Some(kv) = Self::live_at(history, rev) {
                out.push(kv.clone());
                if limit > 0 && out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn count(&mut self, range: &KeyRange, rev: Revision) -> Result<i64> {
        Ok(self.keys_in(range).filter(|(_, h)| Self::live_at(h, rev).is_some()).count() as i64)
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
            .filter(|(_, h)| Self::live_at(h, rev).is_some_and(|kv| kv.lease == lease))
            .map(|(k, _)| k.clone())
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
            EventKind::Put => Some(event.kv.clone()),
            EventKind::Delete => None,
        };
        // Most keys hold one version: a new history gets room for exactly one (a Vec's first
        // push would reserve four, 350 bytes per key of a large key space).
        self.keys.entry(event.kv.key.clone()).or_insert_with(|| Vec::with_capacity(1)).push((rev, version));
        Ok(())
    }
}

/// `memory://`: a [`MemTable`] behind a mutex, with a live feed.
pub struct MemoryBackend {
    table: Mutex<Option<MemTable>>,
    feed: broadcast::Sender<Arc<RevisionEvents>>,
    cluster_id: u64,
    member_id: u64,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        MemoryBackend {
            table: Mutex::new(Some(MemTable::default())),
            feed: broadcast::channel(FEED_CAPACITY).0,
            cluster_id: crate::id::random_nonzero(),
            member_id: crate::id::random_nonzero(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut MemTable) -> Result<T>) -> Result<T> {
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(table) => f(table),
            None => Err(Error::Unavailable("etcdserver: server stopped".into())),
        }
    }
}

#[async_trait::async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }
    fn member_id(&self) -> u64 {
        self.member_id
    }
    async fn revisions(&self) -> Result<Revisions> {
        self.with(|t| Ok(t.revisions()))
    }
    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        self.with(|t| {
            let rev = range::read_revision(req.revision, t.current, t.compacted)?;
            let value = range::execute(t, &req, rev)?;
            Ok(Revisioned { revision: t.current, value })
        })
    }
    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.with(|t| {
            let applied = t.apply(&op)?;
            if let Some(ev) = applied.events {
                // Published under the lock, so the feed is in revision order.
                let _ = self.feed.send(Arc::new(ev));
            }
            Ok(Revisioned { revision: t.current, value: applied.response })
        })
    }
    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.with(|t| {
            t.compact(revision)?;
            Ok(t.current)
        })
    }
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        self.with(|t| t.events(range, after, until))
    }
    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.feed.subscribe()
    }
    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        self.with(|t| Ok(t.lease_list()))
    }
    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.with(|t| {
            let rev = t.current;
            t.keys_with_lease(id, rev)
        })
    }
    async fn status(&self) -> Result<BackendStatus> {
        self.with(|t| {
            let size: usize = t
                .keys
                .iter()
                .map(|(k, h)| {
                    k.len()
                        + h.iter()
                            .map(|(_, kv)| kv.as_ref().map_or(16, |kv| kv.key.len() + kv.value.len() + 40))
                            .sum::<usize>()
                })
                .sum();
            Ok(BackendStatus { db_size: size as i64, db_size_in_use: size as i64 })
        })
    }
    async fn defragment(&self) -> Result<()> {
        self.with(|_| Ok(()))
    }
    async fn close(&self) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).take();
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

    #[test]
    fn history_floor_finds_histories_cut_above_the_compact_revision() {
        let mut t = MemTable::at(0);
        // "a": kept at the compact revision 5, then updated: complete.
        t.apply_committed(4, vec![put("a", 4, 3)]);
        t.apply_committed(7, vec![put("a", 7, 4)]);
        // "b": created after the compaction: complete.
        t.apply_committed(8, vec![put("b", 8, 1)]);
        assert_eq!(t.history_floor(5), -1);
        // "c": its oldest version held is version 6, above the compact revision: older ones
        // were dropped.
        t.apply_committed(9, vec![put("c", 9, 6)]);
        // "d": starts with a deletion above the compact revision: its versions are missing.
        t.apply_committed(10, vec![delete("d", 10)]);
        assert_eq!(t.history_floor(5), 10);
        assert_eq!(t.history_floor(9), 10);
        assert_eq!(t.history_floor(10), -1);
    }
}
