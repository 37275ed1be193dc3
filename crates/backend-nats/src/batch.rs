//! Requests that change several keys, on the replica.
//!
//! Such a request is published as one JetStream atomic batch: consecutive messages, each
//! marked `Kine-Batch: i/n`. The replica buffers them and applies them together at the
//! sequence of the batch's last message, so the request has one revision, like in etcd, and no
//! revision ever shows it half-applied (the sequences of the other members are revisions at
//! which nothing changed).
//!
//! A member's message sequence then differs from its version's mod revision; conditional
//! writes and compaction address messages, so [`MessageSeqs`] remembers those sequences.

use kine_core::{Event, Revision};
use std::collections::BTreeMap;

/// Changes ready to apply at one revision: `(message sequence, event)` each.
#[derive(Debug)]
pub struct Ready {
    pub revision: Revision,
    pub members: Vec<(Revision, Event)>,
}

impl Ready {
    pub fn single(seq: Revision, event: Event) -> Ready {
        Ready { revision: seq, members: vec![(seq, event)] }
    }

    /// The events stamped with the batch's revision; members' sequences recorded in `seqs`.
    pub fn into_events(self, seqs: &mut MessageSeqs) -> Vec<Event> {
        let revision = self.revision;
        self.members
            .into_iter()
            .map(|(seq, mut event)| {
                if seq != revision {
                    seqs.record(&event.kv.key, revision, seq);
                }
                // (A creation's create revision is the batch's revision already, `message::decode`.)
                event.kv.mod_revision = revision;
                event
            })
            .collect()
    }
}

#[derive(Debug)]
struct Pending {
    start: Revision,
    end: Revision,
    members: Vec<(Revision, Event)>,
}

/// Collects the members of one batch at a time.
#[derive(Debug, Default)]
pub struct Assembler {
    pending: Option<Pending>,
}

impl Assembler {
    /// Before handling message `seq`: a pending batch that ends before it will get no more
    /// members (the rest were purged since) and is ready. (A
    /// consumer may deliver a batch's first members before the stream shows the rest, so
    /// "nothing pending" alone does not mean a batch is over; see [`Assembler::finish`].)
    pub fn passed(&mut self, seq: Revision) -> Option<Ready> {
        if self.pending.as_ref().is_some_and(|p| p.end < seq) { self.take() } else { None }
    }

    /// Member `position` = `(i, n)` of a batch, at sequence `seq`. Returns what is ready: the
    /// batch once its last member arrived (and an earlier batch that this one cut short).
    pub fn push(&mut self, seq: Revision, event: Event, (i, n): (i64, i64)) -> Vec<Ready> {
        let start = seq - (i - 1);
        let end = start + n - 1;
        let mut ready = Vec::new();
        if self.pending.as_ref().is_some_and(|p| p.start != start) {
            ready.extend(self.take());
        }
        self.pending.get_or_insert_with(|| Pending { start, end, members: Vec::new() }).members.push((seq, event));
        if seq == end {
            ready.extend(self.take());
        }
        ready
    }

    /// The sequence of the pending batch's last member, if one is pending.
    #[cfg(test)]
    pub fn pending_end(&self) -> Option<Revision> {
        self.pending.as_ref().map(|p| p.end)
    }

    /// The stream holds its last member's sequence and every message up to it was delivered:
    /// the members not seen were purged, and the pending batch is complete as it is.
    pub fn finish(&mut self) -> Option<Ready> {
        self.take()
    }

    /// The sequence before the pending batch, if one is pending (the replica must not report
    /// it applied beyond that).
    pub fn applied_limit(&self) -> Option<Revision> {
        self.pending.as_ref().map(|p| p.start - 1)
    }

    fn take(&mut self) -> Option<Ready> {
        self.pending.take().map(|p| Ready { revision: p.end, members: p.members })
    }
}

/// Message sequences of versions written by a batch, where they differ from the version's
/// mod revision: `(key, mod revision) → sequence`.
#[derive(Debug, Default)]
pub struct MessageSeqs {
    seqs: BTreeMap<(Vec<u8>, Revision), Revision>,
    /// Keys whose subject the stream leader found empty while the replica's newest version of
    /// them is the deletion at this revision: compacted away (by another node, or a compaction
    /// this replica has not applied yet). Their next write expects an empty subject.
    emptied: BTreeMap<Vec<u8>, Revision>,
}

impl MessageSeqs {
    fn record(&mut self, key: &[u8], revision: Revision, seq: Revision) {
        self.seqs.insert((key.to_vec(), revision), seq);
    }

    /// The message sequence of `key`'s version at `revision`.
    pub fn get(&self, key: &[u8], revision: Revision) -> Revision {
        self.seqs.get(&(key.to_vec(), revision)).copied().unwrap_or(revision)
    }

    /// The sequence of the last message the stream holds for `key`, whose newest version on
    /// the replica is at `revision` (0: none).
    pub fn last_subject_seq(&self, key: &[u8], revision: Revision) -> Revision {
        match self.emptied.get(key) {
            Some(deleted) if *deleted == revision => 0,
            _ => self.get(key, revision),
        }
    }

    /// Records that `key`'s subject is empty although the replica's newest version of it is
    /// the deletion at `deleted`.
    pub fn mark_emptied(&mut self, key: &[u8], deleted: Revision) {
        self.emptied.insert(key.to_vec(), deleted);
    }

    /// Forgets `key`'s versions below `revision` (compaction removed them); with `inclusive`,
    /// also the one at `revision`.
    pub fn prune(&mut self, key: &[u8], revision: Revision, inclusive: bool) {
        if self.emptied.get(key).is_some_and(|d| *d < revision || inclusive) {
            self.emptied.remove(key);
        }
        let doomed: Vec<_> = self
            .seqs
            .range((key.to_vec(), 0)..=(key.to_vec(), revision))
            .map(|(k, _)| k.clone())
            .filter(|(_, r)| *r < revision || inclusive)
            .collect();
        for k in doomed {
            self.seqs.remove(&k);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seqs.len() + self.emptied.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.seqs.is_empty() && self.emptied.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kine_core::{EventKind, KeyValue};

    fn put(key: &str, version: i64, seq: Revision) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue { key: key.into(), create_revision: seq, mod_revision: seq, version, ..Default::default() },
            prev_kv: None,
        }
    }

    #[test]
    fn a_batch_applies_at_its_last_sequence() {
        let mut a = Assembler::default();
        let mut seqs = MessageSeqs::default();
        assert!(a.passed(5).is_none());
        // Creations carry the batch revision as create revision (`message::decode`).
        assert!(a.push(5, put("a", 1, 7), (1, 3)).is_empty());
        assert_eq!(a.applied_limit(), Some(4));
        assert!(a.push(6, put("b", 2, 6), (2, 3)).is_empty());
        let ready = a.push(7, put("c", 1, 7), (3, 3));
        assert_eq!(ready.len(), 1);
        assert_eq!(a.applied_limit(), None);
        let events = ready.into_iter().next().unwrap().into_events(&mut seqs);
        let revs: Vec<_> = events.iter().map(|e| (e.kv.mod_revision, e.kv.create_revision)).collect();
        assert_eq!(revs, vec![(7, 7), (7, 6), (7, 7)]);
        assert_eq!((seqs.get(b"a", 7), seqs.get(b"b", 7), seqs.get(b"c", 7)), (5, 6, 7));
        assert_eq!(seqs.len(), 2);
        seqs.prune(b"a", 7, false);
        assert_eq!(seqs.get(b"a", 7), 5);
        seqs.prune(b"a", 9, false);
        assert_eq!(seqs.get(b"a", 7), 7);
        seqs.prune(b"b", Revision::MAX, true);
        assert!(seqs.is_empty());
    }

    #[test]
    fn an_emptied_subject_is_expected_empty_only_while_its_deletion_is_newest() {
        let mut seqs = MessageSeqs::default();
        seqs.mark_emptied(b"k", 9);
        assert_eq!(seqs.last_subject_seq(b"k", 9), 0);
        // A newer version (written since) has its own sequence.
        assert_eq!(seqs.last_subject_seq(b"k", 12), 12);
        assert_eq!(seqs.last_subject_seq(b"other", 9), 9);
        // Compaction past the deletion forgets it.
        seqs.prune(b"k", 10, false);
        assert!(seqs.is_empty());
    }

    #[test]
    fn purged_members_do_not_hold_a_batch_back() {
        let mut a = Assembler::default();
        // Member 2 of 3 was purged: member 3 still completes the batch.
        assert!(a.push(10, put("a", 1, 10), (1, 3)).is_empty());
        let ready = a.push(12, put("c", 1, 12), (3, 3));
        assert_eq!((ready.len(), ready[0].revision, ready[0].members.len()), (1, 12, 2));
        // The last member was purged: the next message (or catching up) releases the batch.
        assert!(a.push(20, put("a", 2, 20), (1, 2)).is_empty());
        let r = a.passed(30).unwrap();
        assert_eq!((r.revision, r.members.len()), (21, 1));
        // Nothing follows a batch whose last members were purged: finished explicitly.
        assert!(a.push(40, put("x", 1, 40), (1, 4)).is_empty());
        assert_eq!(a.pending_end(), Some(43));
        assert_eq!(a.finish().unwrap().revision, 43);
        assert_eq!(a.pending_end(), None);
        // A batch whose first members were purged starts where its position says.
        assert!(a.push(52, put("y", 1, 52), (2, 3)).is_empty());
        assert_eq!(a.applied_limit(), Some(50));
        // A new batch cuts an unfinished one short.
        let ready = a.push(60, put("z", 1, 60), (1, 1));
        assert_eq!(ready.iter().map(|r| r.revision).collect::<Vec<_>>(), vec![53, 60]);
    }
}
