//! Compaction by purge: the compact revision is recorded in `<bucket>-meta`, then every key
//! changed since the previous compaction that has messages superseded at that revision loses
//! them (one purge per key, with a subject filter and a sequence; a key written once since has
//! none, and costs nothing), fillers (`message::FILL_TOKEN`, written
//! by an import) at or below it go too, and the replica compacts in memory. The purges are
//! preceded by reads that load the history they will walk (`warm.rs`).
//!
//! A read-only copy applies its origin's compactions the same way once its replica holds the
//! compact revision: a JetStream mirror does not repeat its origin's purges, so without this
//! the mirror would keep every version ever written.

use super::{Inner, PURGE_CONCURRENCY, meta, timed};
use crate::message;
use futures_util::StreamExt;
use kine_core::backend::Revisions;
use kine_core::memory::PlannedKey;
use kine_core::{Error, Result, Revision};

impl Inner {
    /// Compacts at `revision` (a primary). Returns the current revision.
    pub(super) async fn compact(&self, revision: Revision) -> Result<Revision> {
        if let Some(refusal) = self.role().refusal() {
            return Err(refusal);
        }
        // One compaction at a time. Writes go on meanwhile: purges remove only messages at or
        // below the compact revision, and a write to a key whose messages were all purged fails
        // its expectation and is evaluated again (`find_emptied_keys`); a long compaction
        // (many keys, a long stream) must not stop writes.
        let _compaction = self.compaction.lock().await;
        self.barrier().await?;
        let (current, previous) = {
            let Revisions { current, compacted } = self.table().revisions();
            kine_core::txn::check_compact(revision, current, compacted)?;
            (current, compacted)
        };
        let started = std::time::Instant::now();
        let plan = self.plan(previous, revision).await;
        self.warm(previous, revision).await;
        let (planned, keys) = (started.elapsed(), plan.len());
        let record = || self.meta.put(meta::COMPACT_REVISION, revision.to_string().into());
        match timed("record the compact revision", record()).await {
            Ok(_) => {
                self.purge_superseded(plan, revision).await?;
                self.purge_fillers(revision, current).await?;
            }
            // JetStream at its storage limit refuses every publish, this small one too; the
            // purges need no room and make some. Compaction is how a user gets out of NOSPACE,
            // so it must work then: purge first, record after. (A crash between the two, while
            // the store is full, leaves the compact revision at its previous value.)
            Err(Error::Unavailable(text)) if super::write::stream_full(&text) => {
                tracing::warn!(revision, "the NATS store is full: purging before the compact revision is recorded");
                self.purge_superseded(plan, revision).await?;
                self.purge_fillers(revision, current).await?;
                timed("record the compact revision", record()).await?;
            }
            Err(e) => return Err(e),
        }
        let purged = started.elapsed();
        self.compact_table(revision).await?;
        tracing::debug!(
            revision,
            previous,
            keys,
            plan_ms = planned.as_millis() as u64,
            purge_ms = (purged - planned).as_millis() as u64,
            table_ms = (started.elapsed() - purged).as_millis() as u64,
            "compacted"
        );
        Ok(current)
    }

    /// On a read-only copy: applies the origin's compaction at `revision`, which the replica
    /// holds, to the mirror and to the table. Nothing happens if it is applied already.
    pub(super) async fn follow_compaction(&self, revision: Revision) -> Result<()> {
        let _compaction = self.compaction.lock().await;
        let Revisions { current, compacted } = self.table().revisions();
        if revision <= compacted || revision > current {
            return Ok(());
        }
        let plan = self.plan(compacted, revision).await;
        self.warm(compacted, revision).await;
        self.purge_superseded(plan, revision).await?;
        self.purge_fillers(revision, current).await?;
        self.compact_table(revision).await?;
        tracing::debug!(revision, "applied the origin's compaction");
        Ok(())
    }

    /// The keys whose messages a compaction at `revision` purges (`MemTable::changed_keys_between`),
    /// read from the replica a chunk at a time: its lock is released between chunks, so that
    /// writes and reads go on (theirs are above `revision` and change nothing of the plan).
    async fn plan(&self, previous: Revision, revision: Revision) -> Vec<PlannedKey> {
        let (mut plan, mut after) = (Vec::new(), None);
        loop {
            let (chunk, next) = self.table().changed_keys_chunk(previous, revision, after.as_deref());
            plan.extend(chunk);
            match next {
                Some(key) => after = Some(key),
                None => return plan,
            }
            tokio::task::yield_now().await;
        }
    }

    /// Compacts the replica's table in steps, its lock released between them (a step holds it
    /// for a few milliseconds whatever the size of the table). Nothing happens if the meta
    /// watch applied the compaction already (or is applying it).
    pub(super) async fn compact_table(&self, revision: Revision) -> Result<()> {
        let mut c = {
            let mut t = self.table();
            if t.revisions().compacted >= revision {
                return Ok(());
            }
            t.compact_begin(revision)?
        };
        while !self.table().compact_step(&mut c) {
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    /// Purges the fillers at or below `revision`, except the stream's last message (`current`,
    /// the replica's revision): the stream's last sequence is what read barriers ask for.
    async fn purge_fillers(&self, revision: Revision, current: Revision) -> Result<()> {
        let keep_from = (revision + 1).min(current);
        let subject = message::fill_subject(&self.stored);
        timed(
            "purge fillers",
            std::future::IntoFuture::into_future(self.stream.purge().filter(subject).sequence(keep_from as u64)),
        )
        .await?;
        Ok(())
    }

    /// Purges each planned key's messages superseded at `revision`: `(key, its newest version
    /// at or below it, whether that is a deletion)`. PURGE_CONCURRENCY purges are in flight
    /// (different subjects, so their order does not matter).
    async fn purge_superseded(&self, plan: Vec<PlannedKey>, revision: Revision) -> Result<()> {
        let purges = futures_util::stream::iter(plan).map(|(key, newest, deleted)| async move {
            let subject = message::subject(&self.stored, &key);
            // Keep the newest version at or below the compact revision, unless it is a deletion
            // below it (etcd keeps a deletion at the compact revision itself).
            let seq = self.seqs().get(&key, newest);
            let gone = deleted && newest < revision;
            let keep_from = if gone { seq + 1 } else { seq };
            timed(
                "purge superseded versions",
                std::future::IntoFuture::into_future(self.stream.purge().filter(subject).sequence(keep_from as u64)),
            )
            .await?;
            self.seqs().prune(&key, newest, gone);
            Ok::<(), Error>(())
        });
        let mut purges = purges.buffer_unordered(PURGE_CONCURRENCY);
        while let Some(done) = purges.next().await {
            done?;
        }
        Ok(())
    }
}
