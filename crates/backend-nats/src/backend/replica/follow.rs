//! Following the stream message by message once the table is served, every delivered sequence
//! checked (see the invariants in `replica.rs`).

use super::{IDLE, Position, RETRY, Stop, apply};
use crate::backend::Inner;
use crate::backend::consumer::{Cursor, Next};
use crate::backend::leader;
use kine_core::Revision;
use std::time::{Duration, Instant};

/// How often a lasting failure to read the stream is logged at warn.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// How long consumers may keep skipping existing messages at one position before it is a
/// warning (it is normal for a moment after a NATS server restarts).
const SKIP_WARN_AFTER: Duration = Duration::from_secs(5);

/// Follows the stream from `position`. Returns why it stopped (a hole: messages removed before
/// this replica saw them, or a load asked for once `reload_wanted` changes), or `None` once the
/// backend closed.
pub(super) async fn follow(
    inner: &Inner,
    cursor: &mut Cursor,
    mut position: Position,
    reload_wanted: u64,
) -> Option<Stop> {
    let mut idle = 0;
    let mut failing: Option<Instant> = None;
    let mut warned: Option<Instant> = None;
    // Where the consumer first skipped messages that exist, and when (see below).
    let mut skipping: Option<(Revision, Instant)> = None;
    let mut skip_warned: Option<Instant> = None;
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
                            // A consumer served by a server whose copy is behind (one that just
                            // restarted, say): read again from a new one, usually at once. Nothing
                            // past the gap is applied meanwhile, so no reader sees it; a warning
                            // only if it lasts.
                            let since = *skipping.get_or_insert((position.next, Instant::now()));
                            let lasting = since.0 == position.next && since.1.elapsed() >= SKIP_WARN_AFTER;
                            if lasting && skip_warned.is_none_or(|w: Instant| w.elapsed() >= WARN_EVERY) {
                                skip_warned = Some(Instant::now());
                                tracing::warn!(
                                    expected = position.next,
                                    delivered = seq,
                                    skipped = exists,
                                    waiting_s = since.1.elapsed().as_secs(),
                                    "the NATS consumers keep skipping messages that exist; nothing after {} is applied \
                                     or served until they are read",
                                    position.next - 1
                                );
                            } else {
                                tracing::debug!(
                                    expected = position.next,
                                    delivered = seq,
                                    skipped = exists,
                                    "the NATS consumer skipped messages that exist; reading them again"
                                );
                            }
                            if since.0 != position.next {
                                skipping = Some((position.next, Instant::now()));
                            }
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
