//! Watch catch-up from a [`MemTable`]: its change log says which keys changed at each revision,
//! in order; the events (with `prev_kv`) are rebuilt from the keys' histories.

use super::table::{Key, MemTable};
use crate::error::{Error, Result};
use crate::types::{Event, EventKind, KeyRange, KeyValue, Revision, RevisionEvents};
use std::collections::HashMap;

impl MemTable {
    pub fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        if after + 1 < self.compacted {
            return Err(Error::Compacted { compact_revision: self.compacted });
        }
        let mut out: Vec<RevisionEvents> = Vec::new();
        if after >= until {
            return Ok(out);
        }
        let from = self.log.partition_point(|(r, _)| *r <= after);
        let mut seen: HashMap<&[u8], usize> = HashMap::new();
        let mut current = None;
        for (rev, key) in self.log.range(from..).take_while(|(r, _)| *r <= until) {
            if current != Some(*rev) {
                current = Some(*rev);
                seen.clear();
            }
            // A key can change twice in one revision: its nth entry is its nth change.
            let nth = seen.entry(key).or_default();
            *nth += 1;
            if !range.contains(key) {
                continue;
            }
            if let Some(event) = self.event_at(key, *rev, *nth - 1)? {
                match out.last_mut() {
                    Some(last) if last.revision == *rev => last.events.push(event),
                    _ => out.push(RevisionEvents { revision: *rev, events: vec![event] }),
                }
            }
        }
        Ok(out)
    }

    pub(super) fn log_events(&mut self, ev: &RevisionEvents) {
        // Revisions arrive in order; the log is kept sorted whatever happens.
        let at = self.log.partition_point(|(r, _)| *r <= ev.revision);
        for (i, e) in ev.events.iter().enumerate() {
            let key = self
                .keys
                .get_key_value(e.kv.key.as_slice())
                .map_or_else(|| Key::from(e.kv.key.as_slice()), |(k, _)| k.clone());
            self.log.insert(at + i, (ev.revision, key));
        }
    }

    /// The `nth` change of `key` at `rev` (a key can change twice in one revision), rebuilt
    /// from its history: the version written then (a deletion carries only the key and
    /// revision, as in etcd) and, as etcd reports it, the key's version at the revision before
    /// (none for a creation). Compaction keeps the version live at the compact revision, so
    /// that is held unless compaction removed it (then, as at the compact revision itself,
    /// there is none).
    fn event_at(&self, key: &[u8], rev: Revision, nth: usize) -> Result<Option<Event>> {
        let Some(history) = self.keys.get(key) else { return Ok(None) };
        let first = history.partition_point(|(r, _)| *r < rev);
        let Some((r, version)) = history.get(first + nth) else { return Ok(None) };
        if *r != rev {
            return Ok(None);
        }
        let before = match history[..first].last() {
            // A creation has none (read no value for it).
            Some((r, Some(v))) if version.as_ref().is_none_or(|v| v.create_revision != rev) => {
                Some(v.to_kv(key, *r, &self.values)?)
            }
            _ => None,
        };
        let event = match version {
            Some(v) => Event { kind: EventKind::Put, kv: v.to_kv(key, rev, &self.values)?, prev_kv: before },
            None => Event {
                kind: EventKind::Delete,
                kv: KeyValue { key: key.to_vec(), mod_revision: rev, ..Default::default() },
                prev_kv: before,
            },
        };
        Ok(Some(if event.is_create() { Event { prev_kv: None, ..event } } else { event }))
    }
}
