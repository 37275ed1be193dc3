//! Turning rows of the events query into watch events, the same for every SQL dialect: either
//! rows that carry the key's version just before the change (a join per event, SQLite and
//! PostgreSQL), or a window's plain changes assembled here (MySQL).

use kine_core::{Event, EventKind, KeyValue, RevisionEvents};
use std::collections::{HashMap, HashSet};

/// Whether a row's previous version becomes the event's `prev_kv`: as etcd, the key's version
/// at the revision before the event if it was live then, none for a creation.
pub fn wants_prev(kv: &KeyValue, deleted: bool, prev_deleted: Option<bool>) -> bool {
    let create = !deleted && kv.create_revision == kv.mod_revision;
    prev_deleted == Some(false) && !create
}

/// Appends one change to `out`, grouping the changes of one revision.
pub fn push(out: &mut Vec<RevisionEvents>, kv: KeyValue, deleted: bool, prev_kv: Option<KeyValue>) {
    let (kind, kv) = if deleted {
        // A deletion carries only its key and revision.
        (EventKind::Delete, KeyValue { key: kv.key, mod_revision: kv.mod_revision, ..Default::default() })
    } else {
        (EventKind::Put, kv)
    };
    let rev = kv.mod_revision;
    let event = Event { kind, kv, prev_kv };
    match out.last_mut() {
        Some(last) if last.revision == rev => last.events.push(event),
        _ => out.push(RevisionEvents { revision: rev, events: vec![event] }),
    }
}

/// One row of a window's changes: a key version and whether it is a deletion.
pub type Change = (KeyValue, bool);

/// The keys whose first change in `changes` (in revision order) needs the version before the
/// window to get its `prev_kv`: an update or a deletion; a creation has none.
pub fn keys_before(changes: &[Change]) -> Vec<Vec<u8>> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    for (kv, deleted) in changes {
        if seen.insert(kv.key.as_slice()) && (*deleted || kv.create_revision != kv.mod_revision) {
            keys.push(kv.key.clone());
        }
    }
    keys
}

/// Groups a window's changes (in revision order) into revisions, each change with its previous
/// version: the key's last change in the window at an earlier revision, or for a key's first
/// revision in the window its newest version before the window, from `before` (found for the
/// keys [`keys_before`] names). A key changed twice in one revision (a Txn's put, then its
/// delete) has the same previous version both times, as in etcd.
pub fn assemble(changes: Vec<Change>, before: &HashMap<Vec<u8>, Change>) -> Vec<RevisionEvents> {
    // Per key: its last change so far, and the previous version that change had.
    let mut last: HashMap<&[u8], (usize, Option<&Change>)> = HashMap::new();
    let mut prevs = Vec::with_capacity(changes.len());
    for (i, (kv, deleted)) in changes.iter().enumerate() {
        let prev = match last.get(kv.key.as_slice()) {
            Some(&(j, _)) if changes[j].0.mod_revision < kv.mod_revision => Some(&changes[j]),
            Some(&(_, prev)) => prev,
            None => before.get(&kv.key),
        };
        last.insert(kv.key.as_slice(), (i, prev));
        let wanted = prev.filter(|(_, prev_deleted)| wants_prev(kv, *deleted, Some(*prev_deleted)));
        prevs.push(wanted.map(|(prev, _)| prev.clone()));
    }
    let mut out = Vec::new();
    for ((kv, deleted), prev) in changes.into_iter().zip(prevs) {
        push(&mut out, kv, deleted, prev);
    }
    out
}
