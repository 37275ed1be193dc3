//! A compaction in two steps, as etcd compacts: the *logical* step records the new compact
//! revision in one short transaction (from then on reads below it fail with "compacted"); the
//! *removal* then deletes the versions it superseded in small batches, each its own short
//! transaction, so that no write ever waits for a whole compaction. Reads need nothing more:
//! each reads its revisions and its rows in one snapshot, so a read that saw the old compact
//! revision also sees every row the removal deletes later.
//!
//! `meta.compact_removed` records how far removal has come: every version superseded at that
//! revision is gone. A removal interrupted (a crash, a lost connection) is resumed from it: at
//! the next start, or by the next compaction on any node. Databases written before this row
//! existed were compacted in one transaction, so a missing row means "up to the compact
//! revision".

use kine_core::{Error, Revision};
use tokio::sync::oneshot;

/// The `meta` row recording how far removal has come.
pub const REMOVED: &str = "compact_removed";

/// Log rows scanned per removal batch (their keys' superseded versions are deleted with them).
pub const BATCH_ROWS: i64 = 1000;

/// The versions a compaction still has to delete: those superseded at `to` (and deletions
/// before it) among the keys changed at revisions `from..=to` (a deletion at `from` itself was
/// kept by the compaction at `from`, as etcd keeps it). Keys not changed since `from` have
/// nothing newly superseded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Removal {
    pub from: Revision,
    pub to: Revision,
    /// The last log row (revision, sub) whose key was handled.
    pub cursor: (Revision, i64),
}

impl Removal {
    pub fn new(from: Revision, to: Revision) -> Removal {
        Removal { from, to, cursor: (from, -1) }
    }

    /// `None` when nothing is owed (`removed` caught up with `compacted`).
    pub fn owed(removed: Option<Revision>, compacted: Revision) -> Option<Removal> {
        let removed = removed.unwrap_or(compacted);
        (removed < compacted).then(|| Removal::new(removed, compacted))
    }
}

/// Compactions asked for with `physical` (etcd: answer once the space is reclaimable), waiting
/// for the removal that covers their revision.
#[derive(Default)]
pub struct Waiters(Vec<(Revision, Revision, oneshot::Sender<kine_core::Result<Revision>>)>);

impl Waiters {
    /// `reply` gets `current` once every version superseded at `revision` is gone.
    pub fn push(&mut self, revision: Revision, current: Revision, reply: oneshot::Sender<kine_core::Result<Revision>>) {
        self.0.push((revision, current, reply));
    }

    /// Answers those whose revision is covered by a removal finished at `to`.
    pub fn finished(&mut self, to: Revision) {
        for (revision, current, reply) in std::mem::take(&mut self.0) {
            if revision <= to {
                let _ = reply.send(Ok(current));
            } else {
                self.0.push((revision, current, reply));
            }
        }
    }

    /// Answers every waiter with the error (the removal goes on later, in the background).
    pub fn fail(&mut self, e: impl Fn() -> Error) {
        for (_, _, reply) in self.0.drain(..) {
            let _ = reply.send(Err(e()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owed_only_when_removal_is_behind() {
        assert_eq!(Removal::owed(None, 10), None);
        assert_eq!(Removal::owed(Some(10), 10), None);
        assert_eq!(Removal::owed(Some(4), 10), Some(Removal { from: 4, to: 10, cursor: (4, -1) }));
    }

    #[test]
    fn waiters_are_answered_by_a_removal_that_covers_them() {
        let mut w = Waiters::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        w.push(5, 20, a);
        w.push(9, 21, b);
        w.finished(6);
        assert_eq!(ra.try_recv().unwrap().unwrap(), 20);
        assert!(rb.try_recv().is_err());
        w.fail(|| Error::Unavailable("gone".into()));
        assert!(matches!(rb.try_recv().unwrap(), Err(Error::Unavailable(_))));
    }
}
