//! Promotion: a read-only copy becomes the writable primary (etcd's MemberPromote of a
//! learner), for disaster recovery or a planned move.
//!
//! 1. The old origin is **fenced** if it can be reached: a `superseded` record in its meta
//!    bucket makes every kine-rs on it refuse writes from then on. The copy then catches up with
//!    everything the origin holds (a planned move loses nothing). An origin that cannot be
//!    reached (it is lost) is fenced later, as soon as it can be: a promoted primary keeps
//!    trying, so an old origin that comes back stops taking writes instead of forking the
//!    history silently; what it took meanwhile is counted in both logs.
//! 2. The mirror configuration is removed from the bucket's stream (nats-server 2.12+): it keeps
//!    every message and sequence, so every revision, and takes writes on `$KV.<bucket>.>`,
//!    stored through a subject transform under the subjects it always had.
//! 3. [`Inner::finish_promotion`]: an atomic batch the mirror received only part of is removed
//!    (its origin acknowledged it, but the copy never had all of it: a request is all or
//!    nothing), the meta bucket is promoted too, and a `promoted` record is written. Every
//!    node of the copy runs this, idempotently, before it takes writes.
//! 4. The replica is loaded again and the node takes writes; revisions continue from the
//!    newest one the copy had.

use super::fence::{Fence, listen_for_fence};
use super::layout::promote_stream;
use super::origin::Origin;
use super::record::{Promoted, now_unix};
use super::{Inner, NATS_TIMEOUT, leader, meta, unavailable};
use crate::message;
use async_nats::jetstream::{self, stream};
use kine_core::backend::{Promotion, Role};
use kine_core::view::WriteView;
use kine_core::{Error, Result, Revision};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a promotion waits for the copy to catch up with a reachable origin.
const CATCH_UP: Duration = Duration::from_secs(30);

impl Inner {
    /// Promotes this copy (see the module documentation).
    pub(super) async fn promote(self: &Arc<Self>) -> Result<Promotion> {
        let _one = self.promotion.lock().await;
        if !self.is_copy() {
            return Err(Error::NotLearner);
        }
        let origin = self.origin.clone().ok_or(Error::NotLearner)?;
        let fenced = match self.fence(&origin, 0).await {
            Ok(Fence::Fenced) => {
                self.catch_up(&origin).await;
                true
            }
            // Nothing left to fence or catch up with.
            Ok(Fence::Gone) => true,
            Err(e) => {
                tracing::warn!(origin = %origin.describe(), error = %e, "cannot reach the origin to fence it; promoting without it (it is fenced once it can be reached)");
                false
            }
        };
        let info = super::timed("read the stream", self.stream.get_info()).await?;
        promote_stream(&self.js, info.config, &self.bucket, &self.stored, true).await.map_err(Error::Backend)?;
        let revision = self.finish_promotion(&origin, fenced, true).await?;
        if fenced {
            // Tell the old origin where the histories part.
            let _ = self.fence(&origin, revision).await;
        }
        self.become_primary().await?;
        Ok(Promotion { revision, origin_fenced: fenced })
    }

    /// Step 3 (idempotent; `promoting`: this node removed the mirror and writes the record
    /// whatever is there, others write it only if missing). Returns the revision the new primary
    /// continues from.
    pub(super) async fn finish_promotion(&self, origin: &Origin, fenced: bool, promoting: bool) -> Result<Revision> {
        let state = leader::stream_state(&self.js, &self.stream_name).await?;
        self.drop_incomplete_batch(state.last).await?;
        let meta_name = format!("{}-meta", self.bucket);
        let meta_info = super::timed("read the meta stream", self.meta.stream.get_info()).await?;
        promote_stream(&self.js, meta_info.config, &meta_name, &format!("{}-meta", self.stored), false)
            .await
            .map_err(Error::Backend)?;
        // A fence in the meta bucket now is the one for the origin (this copy's, or an earlier
        // one), mirrored here with the rest: it is not about this bucket.
        if let Ok(Some(entry)) = self.meta.entry(meta::SUPERSEDED).await
            && entry.operation == jetstream::kv::Operation::Put
        {
            super::timed("remove the origin's fence", self.meta.purge(meta::SUPERSEDED)).await?;
        }
        // The meta bucket's mirror may have run ahead of the stream's: a compact revision beyond
        // what the copy holds would hide revisions it has, or lie past its newest one.
        let recorded = leader::compact_revision(&self.meta).await?;
        if recorded > state.last {
            let compacted = self.table().revisions().compacted.min(state.last);
            super::timed(
                "record the compact revision",
                self.meta.put(meta::COMPACT_REVISION, compacted.to_string().into()),
            )
            .await?;
        }
        let record = Promoted {
            origin_stream: origin.stream.clone(),
            origin_api: origin.api.clone(),
            origin_birth: self.birth,
            revision: state.last,
            at_unix: now_unix(),
            fenced,
        };
        let value: bytes::Bytes = serde_json::to_vec(&record).map_err(|e| Error::Backend(e.into()))?.into();
        if promoting {
            super::timed("record the promotion", self.meta.put(meta::PROMOTED, value)).await?;
        } else {
            match tokio::time::timeout(NATS_TIMEOUT, self.meta.create(meta::PROMOTED, value)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == jetstream::kv::CreateErrorKind::AlreadyExists => {}
                Ok(Err(e)) => return Err(unavailable(format!("record the promotion: {e}"))),
                Err(_) => return Err(unavailable("record the promotion: timed out")),
            }
        }
        Ok(state.last)
    }

    /// Removes the members of an atomic batch at the end of the stream whose last member never
    /// arrived.
    async fn drop_incomplete_batch(&self, last: Revision) -> Result<()> {
        let filter = format!("$KV.{}.>", self.stored);
        let newest = match self.stream.get_last_raw_message_by_subject(&filter).await {
            Ok(m) => m,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => return Ok(()),
            Err(e) => return Err(unavailable(format!("read the stream's newest message: {e}"))),
        };
        let seq = newest.sequence as Revision;
        let Some((i, n)) = message::batch_position(Some(&newest.headers)) else { return Ok(()) };
        let start = seq - (i - 1);
        if start + n - 1 <= last {
            return Ok(());
        }
        tracing::warn!(
            revision = start + n - 1,
            received = seq - start + 1,
            changes = n,
            "dropping a write of several keys that the copy received only part of (its origin acknowledged it: it is lost with the origin)"
        );
        for s in start..=seq {
            match self.stream.delete_message(s as u64).await {
                Ok(_) => {}
                Err(e) if e.to_string().contains("no message found") || e.to_string().contains("not found") => {}
                Err(e) => {
                    return Err(unavailable(format!(
                        "remove message {s} of an incomplete batch: {e} (a mirror created with deny_delete cannot drop it)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Waits (bounded) until the replica holds everything a reachable origin holds.
    async fn catch_up(&self, origin: &Origin) {
        let js = match &origin.api {
            Some(api) => jetstream::with_prefix(self.client.clone(), api),
            None => self.js.clone(),
        };
        let last = match leader::stream_state(&js, &origin.stream).await {
            Ok(state) => state.last,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the origin's last revision; promoting at what the copy has");
                return;
            }
        };
        let started = Instant::now();
        let mut delivered = self.delivered.subscribe();
        match tokio::time::timeout(CATCH_UP, delivered.wait_for(|d| *d >= last)).await {
            Ok(Ok(_)) => tracing::info!(
                revision = last,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "caught up with the origin"
            ),
            _ => tracing::warn!(
                origin_revision = last,
                "the copy did not catch up with the origin within {CATCH_UP:?}; promoting at what it has"
            ),
        }
    }

    /// Loads the replica again, then takes writes.
    pub(super) async fn become_primary(self: &Arc<Self>) -> Result<()> {
        self.reload().await?;
        self.rounds.promoted();
        *self.role.write().unwrap_or_else(|p| p.into_inner()) = Role::Primary;
        // It may be superseded in turn by a copy of its own.
        self.spawn(listen_for_fence(self.clone()));
        let revision = self.table().revision();
        tracing::info!(bucket = %self.bucket, revision, "promoted: this node serves reads and writes; revisions continue after {revision}");
        Ok(())
    }
}
