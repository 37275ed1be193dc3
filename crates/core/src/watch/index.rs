//! The synced watches of one watch stream, indexed by what they watch, so that a revision from
//! the live feed costs a lookup per event instead of a check per watch: a stream with 100
//! watches each on its own key (etcd clients watching their own objects) would otherwise test
//! all 100 against every revision.

use crate::types::{Event, KeyRange, RangeEnd};
use std::collections::{BTreeSet, HashMap};

#[derive(Default)]
pub(crate) struct Followers {
    /// Watches of exactly one key, by that key.
    single: HashMap<Vec<u8>, BTreeSet<i64>>,
    /// Watches of a range or prefix: checked against every revision.
    ranged: BTreeSet<i64>,
}

impl Followers {
    pub fn insert(&mut self, id: i64, range: &KeyRange) {
        match range.end {
            RangeEnd::Single => self.single.entry(range.start.clone()).or_default().insert(id),
            _ => self.ranged.insert(id),
        };
    }

    pub fn remove(&mut self, id: i64, range: &KeyRange) {
        match range.end {
            RangeEnd::Single => {
                if let Some(ids) = self.single.get_mut(&range.start) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.single.remove(&range.start);
                    }
                }
            }
            _ => {
                self.ranged.remove(&id);
            }
        }
    }

    /// Adds to `out` every watch that may want one of `events`: those on one of their keys and
    /// all range watches (whose ranges and filters the caller checks).
    pub fn candidates(&self, events: &[Event], out: &mut BTreeSet<i64>) {
        if !self.single.is_empty() {
            for e in events {
                if let Some(ids) = self.single.get(&e.kv.key) {
                    out.extend(ids);
                }
            }
        }
        out.extend(&self.ranged);
    }

    /// Empties the index, returning every watch it held.
    pub fn take_all(&mut self) -> Vec<i64> {
        let mut all: Vec<i64> = self.single.drain().flat_map(|(_, ids)| ids).collect();
        all.extend(std::mem::take(&mut self.ranged));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EventKind, KeyValue};

    fn put(key: &str) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue { key: key.as_bytes().to_vec(), ..Default::default() },
            prev_kv: None,
        }
    }

    fn key(k: &str) -> KeyRange {
        KeyRange::from_etcd(k.as_bytes().to_vec(), Vec::new())
    }

    #[test]
    fn finds_the_watches_of_the_changed_keys_and_every_range_watch() {
        let mut f = Followers::default();
        f.insert(1, &key("a"));
        f.insert(2, &key("b"));
        f.insert(3, &key("a"));
        f.insert(4, &KeyRange::from_etcd(b"a".to_vec(), b"z".to_vec()));
        f.insert(3, &key("a")); // again: no change
        let mut out = BTreeSet::new();
        f.candidates(&[put("a"), put("c")], &mut out);
        assert_eq!(out.into_iter().collect::<Vec<_>>(), vec![1, 3, 4]);
        f.remove(1, &key("a"));
        f.remove(1, &key("a")); // gone already: no change
        f.remove(3, &key("a"));
        let mut out = BTreeSet::new();
        f.candidates(&[put("a")], &mut out);
        assert_eq!(out.into_iter().collect::<Vec<_>>(), vec![4]);
        let mut all = f.take_all();
        all.sort_unstable();
        assert_eq!(all, vec![2, 4]);
        let mut out = BTreeSet::new();
        f.candidates(&[put("a"), put("b")], &mut out);
        assert!(out.is_empty(), "{out:?}");
    }
}
