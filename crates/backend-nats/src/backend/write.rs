//! Writes: evaluated on the replica, published with a JetStream expectation that makes them
//! conditional on exactly the state they were evaluated on (never a blind publish), evaluated
//! again when another writer came first.

use super::{Inner, NATS_TIMEOUT, WRITE_PATIENCE, unavailable};
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
pub(super) enum Expect {
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

    /// Publishes the messages of one write, the last carrying `id` (`imported`: another store's
    /// versions at this revision, `message::encode_imported`). `key_last[i]` is the last
    /// revision of event `i`'s key when the write was evaluated. `None`: an expectation failed
    /// (or so an answer said, `sent.rs`).
    pub(super) async fn publish(
        &self,
        events: &[kine_core::Event],
        expect: Expect,
        key_last: &[Revision],
        id: &str,
        imported: Option<Revision>,
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
            let (mut headers, payload) = match imported {
                Some(revision) => message::encode_imported(event, revision),
                None => message::encode(event),
            };
            match &expect {
                Expect::PerKey => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", key_last[i].to_string().as_str());
                }
                Expect::Stream(last) if i == 0 => {
                    headers.insert("Nats-Expected-Last-Sequence", last.to_string().as_str());
                }
                Expect::Stream(_) => {}
            }
            if let Some(batch) = &batch_id {
                message::mark_batch(&mut headers, i, events.len());
                headers.insert("Nats-Batch-Id", batch.as_str());
                headers.insert("Nats-Batch-Sequence", (i + 1).to_string().as_str());
                if i + 1 == events.len() {
                    headers.insert("Nats-Batch-Commit", "1");
                }
            }
            if i + 1 == events.len() {
                // Found by the replica (`sent.rs`); and sent again with the same id, a message
                // JetStream holds already is acknowledged with its sequence instead of being
                // checked (and refused) a second time.
                headers.insert("Nats-Msg-Id", id);
            }
            let subject = &subjects[i];
            if batch_id.is_some() && i + 1 < events.len() {
                // Batch members before the commit are not acknowledged one by one.
                self.send(subject, headers, payload).await?;
                continue;
            }
            let deadline = tokio::time::Instant::now() + NATS_TIMEOUT;
            let published = loop {
                let future = self.send(subject, headers.clone(), payload.clone()).await?;
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                match tokio::time::timeout(remaining, future).await {
                    Ok(Ok(ack)) => break ack,
                    Ok(Err(e)) => match refusal(&e) {
                        Refusal::Expectation => return Ok(None),
                        Refusal::InProcess if batch_id.is_none() && tokio::time::Instant::now() < deadline => {
                            // This very message is being stored (JetStream saw it twice): its
                            // outcome is known once it is; ask again with the same id.
                            tracing::debug!(error = %e, "the message is in process; publishing it again");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Refusal::Full => {
                            tracing::warn!(error = %e, "the NATS stream has no room for a write");
                            return Err(Error::NoSpace);
                        }
                        _ => return Err(unavailable(format!("publish: {e}"))),
                    },
                    Err(_) => return Err(unavailable("publish: no acknowledgement within 5 s")),
                }
            };
            ack = Some(published);
        }
        Ok(ack.map(|a| a.sequence as Revision))
    }

    /// Sends one message; the acknowledgement is awaited by the caller.
    pub(super) async fn send(
        &self,
        subject: &str,
        headers: async_nats::HeaderMap,
        payload: bytes::Bytes,
    ) -> Result<jetstream::context::PublishAckFuture> {
        match tokio::time::timeout(NATS_TIMEOUT, self.js.publish_with_headers(subject.to_string(), headers, payload))
            .await
        {
            Ok(Ok(future)) => Ok(future),
            // Larger than the server's max_payload: a size error, never an outage (an
            // unfinished batch is dropped by the server).
            Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                Err(Error::RequestTooLarge)
            }
            Ok(Err(e)) => Err(unavailable(format!("publish: {e}"))),
            Err(_) => Err(unavailable(format!("publish: timed out after {NATS_TIMEOUT:?}"))),
        }
    }
}

/// After the `conflicts`-th refusal of a write in a row: the first two are evaluated again at
/// once (on the replica synchronised by the barrier, which holds the write that came first),
/// later ones after a random pause of up to 1, 2, 4 … 32 ms, so that writers that keep meeting
/// on one key stop meeting.
async fn back_off(conflicts: u32) {
    if conflicts < 3 {
        return;
    }
    let ceiling_us = 1000u64 << (conflicts - 3).min(5);
    let pause = Duration::from_micros(kine_core::id::random_u64() % ceiling_us);
    tokio::time::sleep(pause).await;
}

/// A published write that JetStream refused, or so an answer said.
struct Attempt<'a> {
    sent: super::sent::Registered<'a>,
    response: WriteResponse,
    base: Revision,
}

/// Why JetStream refused a message.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// An expected last sequence did not hold: another writer came first.
    Expectation,
    /// A message with the same id is being stored (10158).
    InProcess,
    /// The stream or the server's storage is full.
    Full,
    Other,
}

pub(super) fn refusal(e: &jetstream::context::PublishError) -> Refusal {
    if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence {
        return Refusal::Expectation;
    }
    let text = e.to_string();
    // Wrong-last-sequence inside a batch, or a replicated stream's variant of it.
    if text.contains("wrong last sequence") || text.contains("10071") || text.contains("10164") {
        Refusal::Expectation
    } else if text.contains("10158") || text.contains("duplicate message id is in process") {
        Refusal::InProcess
    } else if stream_full(&text) {
        Refusal::Full
    } else {
        Refusal::Other
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
        // Every attempt published and refused, with what it answers if it was stored after all
        // (`sent.rs`): until this write is answered, the replica may still apply one of them.
        let mut refused: Vec<Attempt> = Vec::new();
        let patience = tokio::time::Instant::now() + WRITE_PATIENCE;
        let mut conflicts = 0u32;
        while conflicts == 0 || tokio::time::Instant::now() < patience {
            let guard = match &keys {
                Some(keys) if !exclusive => inner.locks.keys(keys).await,
                _ => inner.locks.alone().await,
            };
            if let Some(done) = self.stored_after_all(&mut refused).await {
                return Ok(done);
            }
            let evaluated = inner.evaluate(&op);
            let (applied, base, expect, key_last) = match evaluated {
                Ok(v) => v,
                Err(_) if !synced => {
                    inner.barrier().await?;
                    synced = true;
                    continue;
                }
                Err(e) => {
                    // Evaluated on a replica that may hold one of this write's own messages.
                    return match self.stored_after_all(&mut refused).await {
                        Some(done) => Ok(done),
                        None => Err(e),
                    };
                }
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
                return Ok(match self.stored_after_all(&mut refused).await {
                    Some(done) => done,
                    None => Revisioned { revision: base, value: applied.response },
                });
            };
            // Never publish from a node that may not write (a Txn that only reads is answered
            // above): on a copy the subject might even reach the origin over a leaf connection.
            if let Some(refusal) = inner.role().refusal() {
                return Err(refusal);
            }
            let sent = inner.sent.register(&format!("kine-{:016x}", kine_core::id::random_u64()));
            match inner.publish(&ev.events, expect, &key_last, &sent.id, None).await? {
                Some(seq) => return Ok(self.committed(applied.response, base, seq).await),
                None => {
                    tracing::debug!("conditional write refused (another writer came first?); evaluating again");
                    let keys: Vec<Vec<u8>> = ev.events.iter().map(|e| e.kv.key.clone()).collect();
                    refused.push(Attempt { sent, response: applied.response, base });
                    // Synchronised, the replica holds the write if the refusal was wrong.
                    inner.barrier().await?;
                    synced = true;
                    if refused.iter().all(|a| inner.sent.applied_at(&a.sent.id).is_none()) {
                        self.find_emptied_keys(&keys).await?;
                        if conflicts == 2 {
                            // Refused three times on a synchronised replica: a subject
                            // emptied behind kine-rs's back would refuse it forever.
                            self.live_keys_have_messages(&keys).await?;
                        }
                    }
                    lost = keys;
                    conflicts += 1;
                    // This process's other writes go on meanwhile.
                    drop(guard);
                    back_off(conflicts).await;
                    continue;
                }
            }
        }
        if let Some(done) = self.stored_after_all(&mut refused).await {
            return Ok(done);
        }
        self.live_keys_have_messages(&lost).await?;
        Err(unavailable(format!("a write kept conflicting with other writers for {WRITE_PATIENCE:?}")))
    }

    /// Fails, naming the cause, if a key this synchronised replica holds a live version of has
    /// no message in the stream: its expectation can never hold again (the stream was purged
    /// behind kine-rs's back), so trying again would only run into the request's timeout.
    async fn live_keys_have_messages(&self, keys: &[Vec<u8>]) -> Result<()> {
        for key in keys {
            let newest = self.table().newest(key);
            if let Some((rev, false)) = newest
                && !self.subject_exists(key).await?
            {
                return Err(unavailable(format!(
                    "key {:?} has no message in the NATS stream although this node holds its version at \
                     revision {rev}: the stream was changed outside kine-rs (purged?)",
                    String::from_utf8_lossy(key)
                )));
            }
        }
        Ok(())
    }

    /// The answer of a write stored at `seq`, evaluated at `base`.
    async fn committed(&self, mut response: WriteResponse, base: Revision, seq: Revision) -> Revisioned<WriteResponse> {
        if let WriteResponse::Txn(t) = &mut response {
            // Evaluated as revision `base + 1`; it landed at `seq`.
            t.renumber(base + 1, seq);
        }
        // Committed. Give the replica a moment to apply it, so that this node's next write is
        // evaluated on it (reads wait for it anyway); a slow replica does not turn a committed
        // write into an error.
        let _ = self.wait_applied(seq, Duration::from_secs(1)).await;
        Revisioned { revision: seq, value: response }
    }

    /// The answer of a refused attempt that the replica applied after all, if one was.
    async fn stored_after_all(&self, refused: &mut Vec<Attempt<'_>>) -> Option<Revisioned<WriteResponse>> {
        let i = refused.iter().position(|a| self.sent.applied_at(&a.sent.id).is_some())?;
        let a = refused.swap_remove(i);
        let seq = self.sent.applied_at(&a.sent.id)?;
        tracing::info!(revision = seq, "a write refused by a stale NATS answer was stored: answered as committed");
        Some(self.committed(a.response, a.base, seq).await)
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
    async fn find_emptied_keys(&self, keys: &[Vec<u8>]) -> Result<()> {
        let deleted: Vec<(Vec<u8>, Revision)> = {
            let t = self.table();
            keys.iter()
                .filter_map(|k| match t.newest(k) {
                    Some((rev, true)) => Some((k.clone(), rev)),
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
