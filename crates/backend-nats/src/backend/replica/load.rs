//! Loading the bucket into a private table, checked before it is served (see the invariants
//! in `replica.rs`).

use super::{IDLE, Position, RETRY, take};
use crate::backend::Inner;
use crate::backend::consumer::{Cursor, Next};
use crate::backend::leader::{self, StreamState};
use crate::batch::{Assembler, MessageSeqs};
use crate::message;
use futures_util::StreamExt;
use kine_core::memory::MemTable;
use kine_core::view::WriteView;
use kine_core::{KeyRange, Revision, RevisionEvents};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a load insists on a stream that nothing was removed from while it was read, before
/// it settles for checking every gap with the leader.
const STRICT_LOAD: Duration = Duration::from_secs(30);
/// Gap checks in flight while a load is verified.
const GAP_CHECKS: usize = 64;

/// A table being built from the stream.
pub(super) struct Loading {
    table: MemTable,
    seqs: MessageSeqs,
    position: Position,
    /// Ranges of sequences (inclusive) that the consumer did not deliver.
    gaps: Vec<(Revision, Revision)>,
    /// When the newest message read was stored (unix nanoseconds).
    newest_at: i64,
}

/// Loads the stream into a new table, again and again until one load is verified. `None` once
/// the backend closed.
pub(super) async fn load(inner: &Inner, cursor: &mut Cursor, hole: Revision) -> Option<(Loading, u64)> {
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
pub(super) fn install(inner: &Inner, loaded: Loading) -> Position {
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
