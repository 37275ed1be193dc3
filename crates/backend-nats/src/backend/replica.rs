//! The replica: one ordered consumer over the whole bucket, applying messages in stream order
//! to the in-memory table and publishing them to the watch feed.

use super::{Inner, NATS_TIMEOUT};
use crate::batch::{Assembler, Ready};
use crate::message::{self, Decoded};
use async_nats::jetstream::{consumer, stream};
use futures_util::StreamExt;
use kine_core::Revision;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long the replica waits in the middle of a batch, with nothing delivered, before it asks
/// the stream whether the batch's missing members were purged.
const BATCH_RECHECK: Duration = Duration::from_millis(500);

pub(super) async fn replicate(inner: Arc<Inner>, first: u64) {
    let mut start = first;
    let mut batches = Assembler::default();
    let filter = format!("$KV.{}.>", inner.bucket);
    loop {
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let config = consumer::pull::OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: start },
            ..Default::default()
        };
        let messages = match inner.stream.create_consumer(config).await {
            Ok(c) => c.messages().await.map_err(|e| anyhow::anyhow!("{e}")),
            Err(e) => Err(anyhow::anyhow!("{e}")),
        };
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the bucket consumer; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            let msg = tokio::select! {
                msg = messages.next() => msg,
                _ = inner.resync.notified() => {
                    tracing::debug!(from = start, "re-creating the bucket consumer");
                    break;
                }
                // Nothing arrives in the middle of a batch: its remaining members may have been
                // purged (a trailing deletion compacted away at the end of the stream).
                _ = tokio::time::sleep(BATCH_RECHECK), if batches.pending_end().is_some() => {
                    finish_purged_batch(&inner, &mut batches, start as Revision - 1, &filter).await;
                    continue;
                }
            };
            let Some(msg) = msg else { break };
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "bucket consumer failed; resuming");
                    break;
                }
            };
            let Ok(info) = msg.info() else { continue };
            let seq = info.stream_sequence as Revision;
            let decoded = message::decode(&inner.bucket, msg.subject.as_str(), msg.headers.as_ref(), &msg.payload, seq);
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
            // Waking every waiter per message costs more than applying it during a bulk load:
            // while the consumer still has messages pending, advance silently and wake every
            // 4096 messages; once caught up, wake on each one.
            let wake = info.pending == 0 || seq % 4096 == 0;
            apply(&inner, ready, marker.then_some(seq), seq, &batches, wake);
            start = seq as u64 + 1;
            if info.pending == 0 && batches.pending_end().is_some() {
                finish_purged_batch(&inner, &mut batches, seq, &filter).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies `ready` changes to the table, records that the replica has applied up to `seq`
/// (never beyond a batch still being collected), then publishes the events: applied first,
/// published second (see the Backend invariants).
fn apply(inner: &Inner, ready: Vec<Ready>, marker: Option<Revision>, seq: Revision, batches: &Assembler, wake: bool) {
    let mut published = Vec::with_capacity(ready.len());
    {
        let mut t = inner.table();
        let mut seqs = inner.seqs();
        for r in ready {
            let revision = r.revision;
            let events = r.into_events(&mut seqs);
            published.push(t.apply_committed(revision, events));
        }
        if let Some(seq) = marker {
            t.advance(seq);
        }
    }
    let applied = batches.applied_limit().map_or(seq, |limit| limit.min(seq));
    inner.applied.send_if_modified(|a| {
        *a = (*a).max(applied);
        wake
    });
    for ev in published {
        let _ = inner.feed.send(Arc::new(ev));
    }
}

/// The replica delivered everything up to `seq` in the middle of a batch. If the batch's
/// missing members were purged, it is complete as it is: apply it.
async fn finish_purged_batch(inner: &Inner, batches: &mut Assembler, seq: Revision, filter: &str) {
    let Some(end) = batches.pending_end() else { return };
    if rest_purged(inner, seq, end, filter).await {
        let ready = batches.finish().into_iter().collect();
        apply(inner, ready, None, seq, batches, true);
    }
}

/// Whether no message after `seq` up to `end` exists, or ever will. The stream must first have
/// reached `end` (every member that exists is stored by then; a consumer can deliver a batch's
/// first members before the rest is stored), and only then may no message be found in
/// `(seq, end]`: asked in that order, a member stored in between cannot be missed.
async fn rest_purged(inner: &Inner, seq: Revision, end: Revision, filter: &str) -> bool {
    match tokio::time::timeout(NATS_TIMEOUT, inner.stream.get_info()).await {
        Ok(Ok(info)) if info.state.last_sequence as Revision >= end => {}
        _ => return false,
    }
    let next =
        tokio::time::timeout(NATS_TIMEOUT, inner.stream.get_first_raw_message_by_subject(filter, seq as u64 + 1));
    match next.await {
        // A later message exists; the consumer will deliver it (and `passed` ends the batch if
        // it lies beyond `end`).
        Ok(Ok(_)) => false,
        Ok(Err(e)) => e.kind() == stream::LastRawMessageErrorKind::NoMessageFound,
        Err(_) => false,
    }
}
