//! Writes: evaluated on the replica, published with a JetStream expectation that makes them
//! conditional on exactly the state they were evaluated on (never a blind publish), evaluated
//! again when another writer came first.

use super::{Inner, MAX_WRITE_ATTEMPTS, NATS_TIMEOUT, unavailable};
use crate::message;
use crate::write_locks;
use async_nats::jetstream::{self, stream};
use kine_core::request::{RequestOp, ResponseOp, Revisioned, TxnRequest, TxnResponse};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, RangeEnd, Result, Revision};
use std::collections::HashSet;
use std::time::Duration;

/// How a write is made conditional.
enum Expect {
    /// Each message carries its key's last sequence: the write read nothing but those keys.
    PerKey,
    /// The first message carries the stream's last sequence.
    Stream(Revision),
}

impl Inner {
    /// Evaluates a write on the replica: the outcome, the revision it was evaluated at, and
    /// the expectations that make publishing it conditional on exactly that state (taken under
    /// the same lock, never later).
    fn evaluate(&self, op: &WriteOp) -> Result<(kine_core::txn::Applied, Revision, Expect, Vec<Revision>)> {
        let mut t = self.table();
        let base = t.revision();
        let applied = t.evaluate(op)?;
        let seqs = self.seqs();
        let key_last: Vec<Revision> = applied
            .events
            .as_ref()
            .map(|ev| {
                ev.events
                    .iter()
                    .map(|e| t.newest(&e.kv.key).map_or(0, |(rev, _)| seqs.last_subject_seq(&e.kv.key, rev)))
                    .collect()
            })
            .unwrap_or_default();
        let expect = match (op, &applied.response, &applied.events) {
            (WriteOp::Txn(req), WriteResponse::Txn(resp), Some(ev)) => {
                let written: HashSet<Vec<u8>> = ev.events.iter().map(|e| e.kv.key.clone()).collect();
                if per_key(req, resp, &written) { Expect::PerKey } else { Expect::Stream(base) }
            }
            _ => Expect::Stream(base),
        };
        Ok((applied, base, expect, key_last))
    }

    /// Publishes the messages of one write. `key_last[i]` is the last revision of event `i`'s
    /// key when the write was evaluated. `None`: an expectation failed.
    async fn publish(
        &self,
        events: &[kine_core::Event],
        expect: Expect,
        key_last: &[Revision],
    ) -> Result<Option<Revision>> {
        // Every subject checked before anything is sent: a batch is all or nothing.
        let subjects: Vec<String> = events.iter().map(|e| message::subject(&self.bucket, &e.kv.key)).collect();
        // Stored under `$KV.<stored>.` (a promoted copy's transform): the longer name counts.
        let name = if self.stored.len() > self.bucket.len() { &self.stored } else { &self.bucket };
        let limit = message::max_subject_len(self.max_control_line, name)
            .saturating_sub(self.stored.len().saturating_sub(self.bucket.len()));
        for (event, subject) in events.iter().zip(&subjects) {
            message::check_key(&event.kv.key, subject.len(), limit, self.max_control_line)?;
        }
        let batch_id = (events.len() > 1).then(|| format!("kine-{:x}", kine_core::id::random_u64()));
        let mut ack = None;
        for (i, event) in events.iter().enumerate() {
            let (mut headers, payload) = message::encode(event);
            match &expect {
                Expect::PerKey => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", key_last[i].to_string().as_str());
                }
                Expect::Stream(last) if i == 0 => {
                    headers.insert("Nats-Expected-Last-Sequence", last.to_string().as_str());
                }
                Expect::Stream(_) => {}
            }
            if let Some(id) = &batch_id {
                message::mark_batch(&mut headers, i, events.len());
                headers.insert("Nats-Batch-Id", id.as_str());
                headers.insert("Nats-Batch-Sequence", (i + 1).to_string().as_str());
                if i + 1 == events.len() {
                    headers.insert("Nats-Batch-Commit", "1");
                }
            }
            let subject = subjects[i].clone();
            let sent = match tokio::time::timeout(NATS_TIMEOUT, self.js.publish_with_headers(subject, headers, payload))
                .await
            {
                Ok(Ok(future)) => future,
                // Larger than the server's max_payload: a size error, never an outage (an
                // unfinished batch is dropped by the server).
                Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                    return Err(Error::RequestTooLarge);
                }
                Ok(Err(e)) => return Err(unavailable(format!("publish: {e}"))),
                Err(_) => return Err(unavailable(format!("publish: timed out after {NATS_TIMEOUT:?}"))),
            };
            if batch_id.is_some() && i + 1 < events.len() {
                // Batch members before the commit are not acknowledged one by one.
                continue;
            }
            let future = sent;
            ack = Some(match tokio::time::timeout(NATS_TIMEOUT, future).await {
                Ok(Ok(ack)) => ack,
                Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => return Ok(None),
                Ok(Err(e)) => {
                    let text = e.to_string();
                    // Wrong-last-sequence inside a batch, or a replicated stream's variant of it.
                    if text.contains("wrong last sequence") || text.contains("10071") || text.contains("10164") {
                        return Ok(None);
                    }
                    if stream_full(&text) {
                        tracing::warn!(error = %text, "the NATS stream has no room for a write");
                        return Err(Error::NoSpace);
                    }
                    return Err(unavailable(format!("publish: {text}")));
                }
                Err(_) => return Err(unavailable("publish: no acknowledgement within 5 s")),
            });
        }
        Ok(ack.map(|a| a.sequence as Revision))
    }
}

/// Does a refused publish say the stream (its max_bytes/max_msgs with discard=new) or the
/// server's JetStream storage is full?
pub(super) fn stream_full(text: &str) -> bool {
    [
        "maximum bytes exceeded",
        "maximum messages exceeded",
        "insufficient resources",
        "insufficient storage",
        // The disk itself full before JetStream's limit: the server's store write failed.
        "no space left on device",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// Can this write be made conditional on its own keys alone? Only if everything it read is a
/// single key it also writes, and it ran no Range.
fn per_key(req: &TxnRequest, resp: &TxnResponse, written: &HashSet<Vec<u8>>) -> bool {
    for c in &req.compare {
        if c.range.end != RangeEnd::Single || !written.contains(&c.range.start) {
            return false;
        }
    }
    let branch = if resp.succeeded { &req.success } else { &req.failure };
    for (op, r) in branch.iter().zip(&resp.responses) {
        match (op, r) {
            (RequestOp::Range(_), _) => return false,
            (RequestOp::Put(_), _) => {}
            (RequestOp::DeleteRange(d), _) => {
                if d.range.end != RangeEnd::Single {
                    return false;
                }
            }
            (RequestOp::Txn(inner), ResponseOp::Txn(inner_resp)) => {
                if !per_key(inner, inner_resp, written) {
                    return false;
                }
            }
            (RequestOp::Txn(_), _) => return false,
        }
    }
    true
}

impl Inner {
    /// Evaluates on the replica and publishes conditionally. The first attempt skips the read
    /// barrier: the expectations reject a write evaluated on a stale replica, and only then is
    /// the replica synchronised. An answer that writes nothing (a failed compare, an error)
    /// carries no expectation, so it is only given from a synchronised replica.
    pub(super) async fn conditional_write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        let inner = self;
        inner.check_open()?;
        let mut synced = false;
        let keys = write_locks::request_keys(&op);
        let mut exclusive = keys.is_none();
        let mut lost: Vec<Vec<u8>> = Vec::new();
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let _guard = match &keys {
                Some(keys) if !exclusive => inner.locks.keys(keys).await,
                _ => inner.locks.alone().await,
            };
            let evaluated = inner.evaluate(&op);
            let (applied, base, expect, key_last) = match evaluated {
                Ok(v) => v,
                Err(_) if !synced => {
                    inner.barrier().await?;
                    synced = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if matches!(expect, Expect::Stream(_)) && applied.events.is_some() && !exclusive {
                // Conditional on the whole stream: evaluate again with this process's other
                // writes held back.
                exclusive = true;
                continue;
            }
            let Some(ev) = &applied.events else {
                if !synced {
                    inner.barrier().await?;
                    synced = true;
                    continue;
                }
                return Ok(Revisioned { revision: base, value: applied.response });
            };
            // Never publish from a node that may not write (a Txn that only reads is answered
            // above): on a copy the subject might even reach the origin over a leaf connection.
            if let Some(refusal) = inner.role().refusal() {
                return Err(refusal);
            }
            match inner.publish(&ev.events, expect, &key_last).await? {
                Some(seq) => {
                    let mut response = applied.response;
                    if let WriteResponse::Txn(t) = &mut response {
                        // Evaluated as revision `base + 1`; it landed at `seq`.
                        t.renumber(base + 1, seq);
                    }
                    // Committed. Give the replica a moment to apply it, so that this node's
                    // next write is evaluated on it (reads wait for it anyway); a slow replica
                    // does not turn a committed write into an error.
                    let _ = inner.wait_applied(seq, Duration::from_secs(1)).await;
                    return Ok(Revisioned { revision: seq, value: response });
                }
                None => {
                    tracing::debug!("conditional write lost to another writer; evaluating again");
                    inner.barrier().await?;
                    self.find_emptied_keys(&ev.events).await?;
                    lost = ev.events.iter().map(|e| e.kv.key.clone()).collect();
                    synced = true;
                    continue;
                }
            }
        }
        for key in lost {
            let newest = inner.table().newest(&key);
            if let Some((rev, false)) = newest
                && !self.subject_exists(&key).await?
            {
                return Err(unavailable(format!(
                    "key {:?} has no message in the NATS stream although this node holds its version at \
                     revision {rev}: the stream was changed outside kine-rs (purged?)",
                    String::from_utf8_lossy(&key)
                )));
            }
        }
        Err(unavailable("a write kept conflicting with other writers"))
    }

    /// Does the stream (its leader) hold a message for `key`?
    pub(super) async fn subject_exists(&self, key: &[u8]) -> Result<bool> {
        let subject = message::subject(&self.stored, key);
        match tokio::time::timeout(NATS_TIMEOUT, self.stream.get_last_raw_message_by_subject(&subject)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Ok(Err(e)) => Err(unavailable(format!("read the last message of a key: {e}"))),
            Err(_) => Err(unavailable("read the last message of a key: timed out")),
        }
    }

    /// After a failed expectation, on a synchronised replica: a written key whose newest
    /// version here is a deletion, and whose subject is empty on the server, was compacted away
    /// (by another node, or by a compaction this replica has not applied yet): its next write
    /// must expect an empty subject. The replica's history is never changed on such an answer:
    /// a key whose newest version is a put is left alone whatever the server says (a stream
    /// leader still catching up after a restart can miss a subject; believing it once dropped a
    /// key's whole history here), and a wrong "empty" costs one more failed expectation, never
    /// a lost update.
    async fn find_emptied_keys(&self, events: &[kine_core::Event]) -> Result<()> {
        let deleted: Vec<(Vec<u8>, Revision)> = {
            let t = self.table();
            events
                .iter()
                .filter_map(|e| match t.newest(&e.kv.key) {
                    Some((rev, true)) => Some((e.kv.key.clone(), rev)),
                    _ => None,
                })
                .collect()
        };
        for (key, rev) in deleted {
            if !self.subject_exists(&key).await? {
                self.seqs().mark_emptied(&key, rev);
            }
        }
        Ok(())
    }
}
