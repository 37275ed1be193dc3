//! The replica: the bucket's stream loaded into a [`MemTable`], then followed message by
//! message, feeding the watch fan-out.
//!
//! **Invariant:** the replica applies the stream's messages in sequence order, each exactly
//! once, and never passes a sequence it has not accounted for. A consumer is served by one NATS
//! server, whose copy of the stream can be behind or being rebuilt after a restart, so what it
//! delivers is checked, never trusted:
//! - a sequence already applied is a duplicate and is dropped;
//! - a sequence beyond the next expected one is a gap, and the stream leader is asked whether
//!   anything exists in it. If something does, the consumer skipped it: that is logged as an
//!   error, nothing is applied, and a new consumer reads again from the expected sequence. If
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
use super::consumer::{Cursor, Next};
use super::leader::{self, StreamState};
use crate::batch::{Assembler, MessageSeqs, Ready};
use crate::message::{self, Decoded};
use async_nats::jetstream;
use futures_util::StreamExt;
use kine_core::memory::MemTable;
use kine_core::view::WriteView;
use kine_core::{KeyRange, Revision, RevisionEvents};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long the consumer may deliver nothing before the replica looks at the leader.
const IDLE: Duration = Duration::from_millis(250);
/// Pause after a failed NATS request.
const RETRY: Duration = Duration::from_millis(200);
/// How long a load insists on a stream that nothing was removed from while it was read, before
/// it settles for checking every gap with the leader.
const STRICT_LOAD: Duration = Duration::from_secs(30);
/// How often a lasting failure to read the stream is logged at warn.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Gap checks in flight while a load is verified.
const GAP_CHECKS: usize = 64;

/// Where the replica stands in the stream.
struct Position {
    /// The next sequence to apply.
    next: Revision,
    batches: Assembler,
}

/// A table being built from the stream.
struct Loading {
    table: MemTable,
    seqs: MessageSeqs,
    position: Position,
    /// Ranges of sequences (inclusive) that the consumer did not deliver.
    gaps: Vec<(Revision, Revision)>,
    /// When the newest message read was stored (unix nanoseconds).
    newest_at: i64,
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
        Decoded::Init => marker = true,
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

/// Loads the stream into a new table, again and again until one load is verified. `None` once
/// the backend closed.
async fn load(inner: &Inner, cursor: &mut Cursor, hole: Revision) -> Option<(Loading, u64)> {
    let started = Instant::now();
    loop {
        if inner.is_closed() {
            return None;
        }
        let strict = !inner.history_limited && started.elapsed() < STRICT_LOAD;
        match load_once(inner, cursor, hole, strict, inner.is_copy()).await {
            Ok(loaded) => return Some(loaded),
            Err(e) => {
                if inner.is_closed() {
                    return None;
                }
                tracing::info!(error = %e, "loading the NATS bucket again");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// `copy`: the stream is a mirror, which may end with the first members of a batch whose other
/// members have not arrived yet: they stay pending (applied once complete, `follow`), and the
/// table ends before them.
async fn load_once(
    inner: &Inner,
    cursor: &mut Cursor,
    hole: Revision,
    strict: bool,
    copy: bool,
) -> Result<(Loading, u64), String> {
    let before = leader::stream_state(&inner.js, &inner.stream_name).await.map_err(|e| e.to_string())?;
    cursor.reset();
    let mut st = Loading {
        table: match &inner.values_dir {
            Some(dir) => MemTable::at_with_values_in(0, dir),
            None => MemTable::at(0),
        },
        seqs: MessageSeqs::default(),
        position: Position { next: 1, batches: Assembler::default() },
        gaps: Vec::new(),
        newest_at: 0,
    };
    // The leader's state once the consumer had nothing more pending: the load is complete
    // when it has passed that state's last sequence.
    let mut target: Option<StreamState> = None;
    let mut idle = 0;
    let after = loop {
        match cursor.next(st.position.next, IDLE).await {
            Next::Message(m) => {
                idle = 0;
                let Ok(info) = m.info() else {
                    cursor.reset();
                    continue;
                };
                let seq = info.stream_sequence as Revision;
                let next = st.position.next;
                if seq < next {
                    continue;
                }
                if seq > next {
                    st.gaps.push((next, seq - 1));
                }
                take(&inner.stored, &mut st.table, &mut st.seqs, &mut st.position.batches, &m, seq)
                    .map_err(|e| e.to_string())?;
                inner.sent.applied(message::msg_id(m.headers.as_ref()), seq);
                st.position.next = seq + 1;
                st.newest_at = info.published.unix_timestamp_nanos() as i64;
                if target.is_none() && info.pending == 0 {
                    target =
                        Some(leader::stream_state(&inner.js, &inner.stream_name).await.map_err(|e| e.to_string())?);
                }
            }
            Next::Idle => {
                idle += 1;
                if target.is_none() {
                    target =
                        Some(leader::stream_state(&inner.js, &inner.stream_name).await.map_err(|e| e.to_string())?);
                }
            }
            Next::Failed(e) => {
                if inner.is_closed() {
                    return Err("closed".into());
                }
                tracing::debug!(error = %e, "loading the bucket: consumer failed");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        let Some(t) = target else { continue };
        if st.position.next > t.last {
            break t;
        }
        if idle >= 2 {
            // Nothing delivered for a while, yet the leader named later messages: they were
            // removed since (a deletion at the end of the stream, compacted), or the consumer
            // stalled.
            idle = 0;
            match leader::first_at_or_after(&inner.stream, &inner.filter, st.position.next)
                .await
                .map_err(|e| e.to_string())?
            {
                Some(seq) if seq <= t.last => cursor.reset(),
                _ => {
                    st.gaps.push((st.position.next, t.last));
                    st.position.next = t.last + 1;
                    break t;
                }
            }
        }
    };
    verify(inner, &st.gaps, before, after, strict).await?;
    // A batch still open ends within what the leader holds: its missing members were removed
    // (on a copy, they may not have arrived yet).
    let mut end = after.last;
    if copy && let Some(limit) = st.position.batches.applied_limit() {
        end = limit;
    } else if let Some(r) = st.position.batches.finish() {
        let revision = r.revision;
        let events = r.into_events(&mut st.seqs);
        st.table.apply_committed(revision, events).map_err(|e| e.to_string())?;
    }
    // The compact revision, read after the load: a compaction records it before it removes
    // anything, so every removal this load saw is covered by it. A copy's meta bucket is a
    // mirror of its own that may be ahead of the stream's: a compaction beyond what was loaded
    // is applied when the replica gets there (`copy.rs`).
    let mut compacted = leader::compact_revision(&inner.meta).await.map_err(|e| e.to_string())?;
    if copy && compacted > end {
        inner.pending_compaction.send_if_modified(|p| {
            let newer = compacted > *p;
            *p = (*p).max(compacted);
            newer
        });
        compacted = st.table.revisions().compacted;
    }
    st.table.advance(end.max(compacted));
    let floor = compacted.max(hole).max(st.table.history_floor(compacted));
    st.table.set_compacted(floor);
    Ok((st, after.messages))
}

/// Checks that the consumer delivered every message that exists up to `after.last`.
async fn verify(
    inner: &Inner,
    gaps: &[(Revision, Revision)],
    before: StreamState,
    after: StreamState,
    strict: bool,
) -> Result<(), String> {
    let missing: i64 = gaps.iter().filter(|(a, _)| *a <= after.last).map(|(a, b)| (*b).min(after.last) - a + 1).sum();
    let delivered = (after.last - missing) as u64;
    let removed = (before.messages + (after.last - before.last) as u64) != after.messages;
    if !removed && delivered == after.messages {
        return Ok(());
    }
    if strict {
        return Err(format!(
            "messages were removed from the stream while it was read (delivered {delivered}, the stream holds {})",
            after.messages
        ));
    }
    // Ask the leader about every gap: the first message at or after its start must lie beyond it.
    let checks = futures_util::stream::iter(gaps.iter().copied().filter(|(a, _)| *a <= after.last))
        .map(|(a, b)| async move {
            match leader::first_at_or_after(&inner.stream, &inner.filter, a).await {
                Ok(Some(seq)) if seq <= b => Err(format!("the consumer skipped message {seq}")),
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .buffer_unordered(GAP_CHECKS);
    futures_util::pin_mut!(checks);
    while let Some(check) = checks.next().await {
        check?;
    }
    Ok(())
}

/// Serves a loaded table: swaps it in (keeping the leases, which come from `<bucket>-meta`),
/// and publishes its newest revision, so that watch sessions behind it read what they miss
/// from the new table, or are cancelled as compacted.
fn install(inner: &Inner, loaded: Loading) -> Position {
    let Loading { mut table, seqs, position, newest_at, .. } = loaded;
    let current = {
        let mut t = inner.table();
        for (id, ttl) in t.lease_list() {
            let _ = table.insert_lease(id, ttl);
        }
        *t = table;
        *inner.seqs() = seqs;
        t.revision()
    };
    let newest = inner
        .table()
        .events(&KeyRange::all(), current - 1, current)
        .ok()
        .and_then(|mut batches| batches.pop())
        .unwrap_or(RevisionEvents { revision: current, events: Vec::new() });
    inner.applied_at.store(newest_at, std::sync::atomic::Ordering::Relaxed);
    inner.applied.send_modify(|a| *a = (*a).max(current));
    inner.delivered.send_modify(|d| *d = (*d).max(position.next - 1));
    let _ = inner.feed.send(Arc::new(newest));
    inner.loads.send_modify(|l| *l += 1);
    position
}

/// Follows the stream from `position`. Returns why it stopped (a hole: messages removed before
/// this replica saw them, or a load asked for once `reload_wanted` changes), or `None` once the
/// backend closed.
async fn follow(inner: &Inner, cursor: &mut Cursor, mut position: Position, reload_wanted: u64) -> Option<Stop> {
    let mut idle = 0;
    let mut failing: Option<Instant> = None;
    let mut warned: Option<Instant> = None;
    loop {
        if inner.is_closed() {
            return None;
        }
        if *inner.reload_wanted.borrow() != reload_wanted {
            cursor.reset();
            return Some(Stop::Reload);
        }
        match cursor.next(position.next, IDLE).await {
            Next::Message(m) => {
                idle = 0;
                if let Some(since) = failing.take()
                    && warned.take().is_some()
                {
                    tracing::info!(after_s = since.elapsed().as_secs(), "reading the bucket from NATS again");
                }
                let Ok(info) = m.info() else {
                    cursor.reset();
                    continue;
                };
                let seq = info.stream_sequence as Revision;
                if seq < position.next {
                    tracing::debug!(sequence = seq, "dropping a message delivered twice");
                    continue;
                }
                if seq > position.next {
                    match leader::first_at_or_after(&inner.stream, &inner.filter, position.next).await {
                        Ok(Some(exists)) if exists < seq => {
                            tracing::error!(
                                expected = position.next,
                                delivered = seq,
                                skipped = exists,
                                "the NATS consumer skipped messages that exist; nothing after {} is applied or served \
                                 until they are read again",
                                position.next - 1
                            );
                            cursor.reset();
                            tokio::time::sleep(RETRY).await;
                            continue;
                        }
                        Ok(_) => return Some(Stop::Hole(position.next, seq - 1)),
                        Err(e) => {
                            tracing::debug!(error = %e, "cannot check a gap in the stream yet");
                            cursor.reset();
                            tokio::time::sleep(RETRY).await;
                            continue;
                        }
                    }
                }
                let wake = info.pending == 0 || seq % 4096 == 0;
                inner
                    .applied_at
                    .store(info.published.unix_timestamp_nanos() as i64, std::sync::atomic::Ordering::Relaxed);
                apply(inner, &mut position, &m, seq, wake);
            }
            Next::Idle => {
                // Behind the leader with nothing delivered: the consumer stalled, or the missing
                // messages were removed.
                let target = *inner.target.borrow();
                if target < position.next {
                    idle = 0;
                    continue;
                }
                idle += 1;
                if idle < 2 {
                    continue;
                }
                idle = 0;
                match leader::first_at_or_after(&inner.stream, &inner.filter, position.next).await {
                    Ok(Some(seq)) if seq <= target => {
                        tracing::debug!(next = position.next, "the bucket consumer stalled; re-creating it");
                        cursor.reset();
                    }
                    Ok(_) => return Some(Stop::Hole(position.next, target)),
                    Err(e) => tracing::debug!(error = %e, "cannot read the stream's leader"),
                }
            }
            Next::Failed(e) => {
                // Expected for a moment while a server restarts; worth a warning when it lasts.
                let since = *failing.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(5) && warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                    warned = Some(Instant::now());
                    tracing::warn!(error = %e, failing_s = since.elapsed().as_secs(), "cannot read the bucket from NATS; retrying");
                } else {
                    tracing::debug!(error = %e, "cannot read the bucket from NATS; retrying");
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
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
