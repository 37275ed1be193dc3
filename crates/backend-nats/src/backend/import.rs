//! `WriteOp::Import` (`kine-rs migrate` into NATS): another store's versions written at their
//! own revisions.
//!
//! A revision is a stream sequence, so a version at revision R is the message at sequence R,
//! and a revision that changed n keys is one atomic batch on sequences R-n+1..R (applied at
//! its last one, `batch.rs`). Sequences at which the other store changed nothing get a filler
//! (`message::FILL_TOKEN`), a revision with no change. Every message expects the stream's
//! last sequence to be the one before it: nothing is published blindly, and a write by
//! anything else meanwhile stops the import (migrate refuses a served target anyway).
//! Single messages (fillers, revisions of one change) are pipelined, [`IN_FLIGHT`] at a time;
//! a batch is published once everything before it is acknowledged.

use super::write::{Expect, Refusal, refusal};
use super::{Inner, NATS_TIMEOUT, timed, unavailable};
use crate::message;
use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishAckFuture;
use bytes::Bytes;
use kine_core::request::Revisioned;
use kine_core::txn::{Import, ImportedVersion, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, Event, LeaseId, Result, Revision};
use std::collections::VecDeque;
use std::time::Duration;

/// Single messages published and not yet acknowledged, at most.
const IN_FLIGHT: usize = 256;
/// How long the replica may take to apply an import before the answer fails.
const APPLY_LIMIT: Duration = Duration::from_secs(120);

/// Messages published one by one, each expecting the sequence before its own.
struct Pipeline<'a> {
    inner: &'a Inner,
    acks: VecDeque<(Revision, PublishAckFuture)>,
    /// The sequence of the last message published.
    last: Revision,
}

impl Pipeline<'_> {
    /// Publishes one message at sequence `self.last + 1`.
    async fn push(&mut self, subject: &str, mut headers: HeaderMap, payload: Bytes) -> Result<()> {
        let seq = self.last + 1;
        headers.insert("Nats-Expected-Last-Sequence", self.last.to_string().as_str());
        let ack = self.inner.send(subject, headers, payload).await?;
        self.acks.push_back((seq, ack));
        self.last = seq;
        if self.acks.len() >= IN_FLIGHT {
            self.settle_one().await?;
        }
        Ok(())
    }

    /// Fillers up to sequence `to`.
    async fn fill(&mut self, to: Revision) -> Result<()> {
        let subject = message::fill_subject(&self.inner.bucket);
        while self.last < to {
            self.push(&subject, HeaderMap::new(), Bytes::new()).await?;
        }
        Ok(())
    }

    async fn settle_one(&mut self) -> Result<()> {
        let Some((seq, ack)) = self.acks.pop_front() else { return Ok(()) };
        match tokio::time::timeout(NATS_TIMEOUT, ack).await {
            Ok(Ok(ack)) if ack.sequence as Revision == seq => Ok(()),
            Ok(Ok(ack)) => Err(unavailable(format!(
                "import: the message meant for sequence {seq} was stored at {} (was the stream written meanwhile?)",
                ack.sequence
            ))),
            Ok(Err(e)) => Err(refused(&e, seq)),
            Err(_) => {
                Err(unavailable(format!("import: no acknowledgement for sequence {seq} within {NATS_TIMEOUT:?}")))
            }
        }
    }

    /// Waits for every acknowledgement.
    async fn settle(&mut self) -> Result<()> {
        while !self.acks.is_empty() {
            self.settle_one().await?;
        }
        Ok(())
    }
}

fn refused(e: &async_nats::jetstream::context::PublishError, seq: Revision) -> Error {
    match refusal(e) {
        Refusal::Expectation => written_meanwhile(seq - 1),
        Refusal::Full => Error::NoSpace,
        _ => unavailable(format!("import: publish sequence {seq}: {e}")),
    }
}

fn written_meanwhile(expected: Revision) -> Error {
    Error::Backend(anyhow::anyhow!(
        "import: the stream is no longer at sequence {expected} (another writer wrote into the bucket meanwhile: is \
         a kine-rs serving it?)"
    ))
}

/// `(revision, its versions in sub order)`, revisions ascending.
fn by_revision(mut versions: Vec<ImportedVersion>) -> Vec<(Revision, Vec<Event>)> {
    versions.sort_by_key(|v| (v.revision, v.sub));
    let mut groups: Vec<(Revision, Vec<Event>)> = Vec::new();
    for v in versions {
        match groups.last_mut() {
            Some((rev, events)) if *rev == v.revision => events.push(v.event),
            _ => groups.push((v.revision, vec![v.event])),
        }
    }
    groups
}

/// Checks that each revision's messages fit after the stream's last sequence `last`.
fn check_room(groups: &[(Revision, Vec<Event>)], mut last: Revision) -> Result<()> {
    for (revision, events) in groups {
        let n = events.len() as Revision;
        if revision - n < last {
            return Err(Error::InvalidArgument(format!(
                "revision {revision} changed {n} key(s); NATS stores them on sequences {}..={revision}, and the \
                 stream is at {last}",
                revision - n + 1
            )));
        }
        last = *revision;
    }
    Ok(())
}

impl Inner {
    pub(super) async fn import(&self, import: Import) -> Result<Revisioned<WriteResponse>> {
        self.check_open()?;
        if let Some(refusal) = self.role().refusal() {
            return Err(refusal);
        }
        if self.history_limited {
            return Err(Error::Unsupported(
                "the bucket keeps a limited history per key (max_msgs_per_subject), which would remove the fillers an \
                 import writes: import into a bucket without that limit"
                    .into(),
            ));
        }
        // Nothing else of this process's writes in between.
        let _alone = self.locks.alone().await;
        self.barrier().await?;
        let start = self.table().revision();
        let Import { versions, revision, add_leases, remove_leases } = import;
        let groups = by_revision(versions);
        check_room(&groups, start)?;
        let mut pipe = Pipeline { inner: self, acks: VecDeque::new(), last: start };
        for (rev, events) in groups {
            let n = events.len() as Revision;
            pipe.fill(rev - n).await?;
            if n == 1 {
                let subject = message::subject(&self.bucket, &events[0].kv.key);
                self.check_subject(&events[0], &subject)?;
                let (headers, payload) = message::encode_imported(&events[0], rev);
                pipe.push(&subject, headers, payload).await?;
                continue;
            }
            // An atomic batch, once everything before it is stored.
            pipe.settle().await?;
            let id = format!("kine-import-{:016x}", kine_core::id::random_u64());
            match self.publish(&events, Expect::Stream(rev - n), &[], &id, Some(rev)).await? {
                Some(seq) if seq == rev => pipe.last = rev,
                Some(seq) => {
                    return Err(unavailable(format!(
                        "import: the batch of revision {rev} was stored at sequence {seq} (was the stream written \
                         meanwhile?)"
                    )));
                }
                None => return Err(written_meanwhile(rev - n)),
            }
        }
        pipe.fill(revision).await?;
        pipe.settle().await?;
        let last = pipe.last;
        self.import_leases(add_leases, remove_leases).await?;
        // Answered once this node's replica holds it: the next request sees the import.
        self.wait_applied(last, APPLY_LIMIT).await?;
        Ok(Revisioned { revision: last, value: WriteResponse::Imported })
    }

    /// A key whose subject no server would carry is refused before it is published.
    fn check_subject(&self, event: &Event, subject: &str) -> Result<()> {
        // As `publish` counts it: a promoted copy's subjects are stored under a longer name.
        let name = if self.stored.len() > self.bucket.len() { &self.stored } else { &self.bucket };
        let limit = message::max_subject_len(self.max_control_line, name)
            .saturating_sub(self.stored.len().saturating_sub(self.bucket.len()));
        message::check_key(&event.kv.key, subject.len(), limit, self.max_control_line)
    }

    /// Lease records put or removed in `<bucket>-meta`, as a grant or a revoke writes them
    /// (their keys were imported with the versions).
    async fn import_leases(&self, add: Vec<(LeaseId, i64)>, remove: Vec<LeaseId>) -> Result<()> {
        for (id, ttl) in add {
            self.lease_renew(id, ttl).await?;
            self.table().insert_lease(id, ttl)?;
        }
        for id in remove {
            timed("remove a lease record", self.meta.delete(format!("lease.{id}"))).await?;
            self.table().remove_lease(id)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kine_core::{EventKind, KeyValue};

    fn version(revision: Revision, sub: usize, key: &str) -> ImportedVersion {
        let kv = KeyValue { key: key.into(), mod_revision: revision, ..Default::default() };
        ImportedVersion { revision, sub, event: Event { kind: EventKind::Put, kv, prev_kv: None } }
    }

    #[test]
    fn revisions_need_room_for_their_batches() {
        let groups = by_revision(vec![version(9, 1, "b"), version(4, 0, "x"), version(9, 0, "a")]);
        let keys: Vec<(Revision, Vec<Vec<u8>>)> =
            groups.iter().map(|(r, ev)| (*r, ev.iter().map(|e| e.kv.key.clone()).collect())).collect();
        assert_eq!(keys, vec![(4, vec![b"x".to_vec()]), (9, vec![b"a".to_vec(), b"b".to_vec()])]);
        // Sequences 8 and 9 for revision 9, 4 for revision 4: the stream may be at 3.
        assert!(check_room(&groups, 3).is_ok());
        let Err(Error::InvalidArgument(text)) = check_room(&groups, 4) else { panic!() };
        assert!(text.contains("revision 4 changed 1 key(s)"), "{text}");
        let groups = by_revision(vec![version(5, 0, "a"), version(6, 0, "b"), version(6, 1, "c")]);
        let Err(Error::InvalidArgument(text)) = check_room(&groups, 1) else { panic!() };
        assert!(text.contains("revision 6 changed 2 key(s); NATS stores them on sequences 5..=6"), "{text}");
        assert!(text.contains("the stream is at 5"), "{text}");
    }
}
