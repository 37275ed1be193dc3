//! Turning rows of the events query (a change, joined with the key's version just before it)
//! into watch events, the same for every SQL dialect.

use kine_core::{Event, EventKind, KeyValue, RevisionEvents};

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
