//! The replica: the bucket's stream loaded into a [`MemTable`], then followed message by
//! message, feeding the watch fan-out.
//!
//! **Invariant:** the replica applies the stream's messages in sequence order, each exactly
//! once, and never passes a sequence it has not accounted for. A consumer is served by one NATS
//! server, whose copy of the stream can be behind or being rebuilt after a restart, so what it
//! delivers is checked, never trusted:
//! - a sequence already applied is a duplicate and is dropped;
//! - a sequence beyond the next expected one is a gap, and the stream leader is asked whether
//!   anything exists in it. If something does, the consumer skipped it (normal for a moment
//!   after a NATS server restarts; a warning if it lasts): nothing is applied, and a new
//!   consumer reads again from the expected sequence. If
//!   nothing does, those messages were removed before this replica saw them (compaction by
//!   another node, a purge), so the table may hold versions that no longer tell the truth (a
//!   deletion it never saw): it is loaded again, with reads and watches below the hole failing
//!   with "compacted" (watches are cancelled with `compact_revision`, as etcd does).
//!
//! While it loads, the table is private; it is checked before it is served: the leader's count
//! of messages must equal what the consumer delivered, unless messages were removed meanwhile,
//! in which case the load starts again (or, with a per-key history limit that removes messages
//! all the time, each gap is checked with the leader instead).

use super::Inner;
use super::consumer::Cursor;
use crate::batch::{Assembler, MessageSeqs, Ready};
use crate::message::{self, Decoded};
use async_nats::jetstream;
use kine_core::memory::MemTable;
use kine_core::{Revision, RevisionEvents};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

mod follow;
mod load;

use follow::follow;
use load::{install, load};

/// How long the consumer may deliver nothing before the replica looks at the leader.
const IDLE: Duration = Duration::from_millis(250);
/// Pause after a failed NATS request.
const RETRY: Duration = Duration::from_millis(200);

/// Where the replica stands in the stream.
struct Position {
    /// The next sequence to apply.
    next: Revision,
    batches: Assembler,
}

/// Why following the stream stopped.
enum Stop {
    /// Messages this replica never saw were removed (the range of sequences).
    Hole(Revision, Revision),
    /// A load was asked for (`Inner::reload`).
    Reload,
}

/// Loads the bucket, tells `ready`, then follows it until the backend closes.
pub(super) async fn replicate(inner: Arc<Inner>, ready: oneshot::Sender<(Revision, u64)>) {
    let mut cursor = Cursor::new(inner.stream.clone(), inner.filter.clone());
    let mut ready = Some(ready);
    // The end of the last hole found (-1: none).
    let mut hole = -1;
    loop {
        let reload_wanted = *inner.reload_wanted.borrow();
        let Some((loaded, messages)) = load(&inner, &mut cursor, hole).await else { return };
        let position = install(&inner, loaded);
        match ready.take() {
            Some(ready) => {
                let _ = ready.send((position.next - 1, messages));
            }
            None => tracing::info!(revision = position.next - 1, "NATS bucket loaded again"),
        }
        match follow(&inner, &mut cursor, position, reload_wanted).await {
            None => return,
            Some(Stop::Reload) => {}
            Some(Stop::Hole(from, to)) => {
                tracing::warn!(
                    from,
                    to,
                    "messages this node never saw were removed from the stream (compacted by another node?); \
                     loading the bucket again, older revisions count as compacted"
                );
                hole = to;
            }
        }
    }
}

/// Applies one message to a table. Returns the revisions completed by it (a message completes
/// its own revision, or a batch's; one that cuts an earlier batch short completes that too).
/// Fails if the table cannot read its own values back (its value file): it must be loaded again.
fn take(
    stored: &str,
    table: &mut MemTable,
    seqs: &mut MessageSeqs,
    batches: &mut Assembler,
    msg: &jetstream::Message,
    seq: Revision,
) -> kine_core::Result<Vec<RevisionEvents>> {
    let decoded = message::decode(stored, msg.subject.as_str(), msg.headers.as_ref(), &msg.payload, seq);
    let mut ready: Vec<Ready> = batches.passed(seq).into_iter().collect();
    let mut marker = false;
    match decoded {
        Decoded::Change(event) => match message::batch_position(msg.headers.as_ref()) {
            Some(position) => ready.extend(batches.push(seq, event, position)),
            None => ready.push(Ready::single(seq, event)),
        },
        // A revision at which nothing changed.
        Decoded::Init | Decoded::Fill => marker = true,
        Decoded::Foreign(what) => {
            tracing::warn!(sequence = seq, "ignoring a message kine-rs did not write: {what}");
            marker = true;
        }
    }
    let mut completed = Vec::with_capacity(ready.len());
    for r in ready {
        let revision = r.revision;
        let events = r.into_events(seqs);
        completed.push(table.apply_committed(revision, events)?);
    }
    if marker {
        table.advance(seq);
    }
    Ok(completed)
}

/// Applies one message to the served table, records the sequence applied (never beyond a batch
/// still being collected), then publishes the completed revisions: applied first, published
/// second (the `Backend` invariant).
fn apply(inner: &Inner, position: &mut Position, msg: &jetstream::Message, seq: Revision, wake: bool) {
    let completed = {
        let mut t = inner.table();
        let mut seqs = inner.seqs();
        let completed = match take(&inner.stored, &mut t, &mut seqs, &mut position.batches, msg, seq) {
            Ok(completed) => completed,
            Err(e) => {
                // Nothing of it is published; `follow` stops at the request and loads again.
                tracing::error!(error = %e, sequence = seq, "the replica cannot apply a message; loading the bucket again");
                inner.reload_wanted.send_modify(|r| *r += 1);
                return;
            }
        };
        // Under the table's lock: a write evaluated on a table holding its own message finds
        // it noted (`sent.rs`).
        inner.sent.applied(message::msg_id(msg.headers.as_ref()), seq);
        completed
    };
    position.next = seq + 1;
    let applied = position.batches.applied_limit().map_or(seq, |limit| limit.min(seq));
    inner.applied.send_if_modified(|a| {
        *a = (*a).max(applied);
        wake
    });
    inner.delivered.send_if_modified(|d| {
        *d = (*d).max(seq);
        wake
    });
    for ev in completed {
        let _ = inner.feed.send(Arc::new(ev));
    }
}
