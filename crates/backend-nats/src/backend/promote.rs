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

use super::layout::{Origin, stream_name};
use super::{Inner, NATS_TIMEOUT, leader, meta, unavailable};
use crate::message;
use anyhow::anyhow;
use async_nats::jetstream::{self, stream};
use kine_core::backend::{Promotion, Role};
use kine_core::view::WriteView;
use kine_core::{Error, Result, Revision};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a promotion waits for the copy to catch up with a reachable origin.
const CATCH_UP: Duration = Duration::from_secs(30);
/// How long fencing waits for the origin's acknowledgement.
const FENCE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a promoted primary tries to fence an origin it could not reach.
const FENCE_RETRY: Duration = Duration::from_secs(1);

/// What fencing the old origin found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fence {
    /// It has its `superseded` record.
    Fenced,
    /// It is not there any more: a bucket of its name created since answered.
    Gone,
}

/// The answers of `listen_for_fence`.
const OK: &str = "ok";
const GONE: &str = "gone";

/// Where a kine-rs on bucket `bucket` in JetStream domain `domain` ("-": none) takes fences.
fn fence_subject(domain: &str, bucket: &str) -> String {
    format!("kine-rs.fence.{domain}.{bucket}")
}

/// Takes fences for this node's bucket from promoted copies in other JetStream domains, and
/// records them in the meta bucket (where every node of the bucket sees them).
pub(super) async fn listen_for_fence(inner: Arc<Inner>) {
    use futures_util::StreamExt;
    let domain = match inner.js.query_account().await {
        Ok(account) => account.domain.unwrap_or_else(|| "-".into()),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read this account's JetStream domain; fences from other domains are not taken");
            return;
        }
    };
    let subject = fence_subject(&domain, &inner.bucket);
    let mut requests = match inner.client.queue_subscribe(subject.clone(), "kine-rs-fence".into()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, subject, "cannot listen for fences from promoted copies");
            return;
        }
    };
    while let Some(request) = requests.next().await {
        let answer = match serde_json::from_slice::<Superseded>(&request.payload) {
            Ok(record) if record.birth != inner.birth => GONE.to_string(),
            Ok(_) => {
                match super::timed("record the fence", inner.meta.put(meta::SUPERSEDED, request.payload.clone())).await
                {
                    Ok(_) => {
                        inner.on_superseded(&request.payload);
                        OK.to_string()
                    }
                    Err(e) => format!("error: {e}"),
                }
            }
            _ => "error: not a fence".to_string(),
        };
        if let Some(reply) = request.reply {
            let _ = inner.client.publish(reply, answer.into()).await;
        }
    }
}

/// `promoted` in a promoted copy's meta bucket.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Promoted {
    origin_stream: String,
    origin_api: Option<String>,
    /// The origin's creation time (it is the copy's too): a fence names it.
    #[serde(default)]
    origin_birth: i64,
    /// The newest revision the copy had: revisions continue after it.
    revision: Revision,
    at_unix: u64,
    /// The old origin got its `superseded` record.
    fenced: bool,
}

/// `superseded` in the old origin's meta bucket.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Superseded {
    /// The creation time of the bucket superseded: a bucket created since under the same name is
    /// not the one superseded, and ignores it.
    birth: i64,
    /// The promoted copy's bucket.
    bucket: String,
    /// The promoted copy, for messages.
    by: String,
    /// Where its history leaves this one's (0: not known yet, the promotion is under way).
    revision: Revision,
    at_unix: u64,
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The origin a promoted copy recorded, if this bucket is one.
pub(super) async fn recorded_origin(meta: &jetstream::kv::Store) -> anyhow::Result<Option<Origin>> {
    Ok(read_record(meta).await?.map(|p| Origin { stream: p.origin_stream, api: p.origin_api }))
}

async fn read_record(meta: &jetstream::kv::Store) -> anyhow::Result<Option<Promoted>> {
    match meta.entry(meta::PROMOTED).await {
        Ok(Some(e)) if e.operation == jetstream::kv::Operation::Put => Ok(serde_json::from_slice(&e.value).ok()),
        Ok(_) => Ok(None),
        Err(e) => Err(anyhow!("read the promotion record: {e}")),
    }
}

/// Removes the mirror configuration of a stream: writes on `$KV.<name>.>` are stored as
/// `$KV.<stored>.>`. `bucket_stream`: the bucket's stream (atomic batches), else a meta bucket.
pub(super) async fn promote_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    name: &str,
    stored: &str,
    bucket_stream: bool,
) -> anyhow::Result<()> {
    if config.mirror.is_none() {
        return Ok(());
    }
    let write = format!("$KV.{name}.>");
    config.mirror = None;
    config.mirror_direct = false;
    config.subjects = vec![write.clone()];
    config.subject_transform =
        (name != stored).then(|| stream::SubjectTransform { source: write, destination: format!("$KV.{stored}.>") });
    config.allow_direct = true;
    config.allow_rollup = true;
    config.allow_atomic_publish = bucket_stream;
    js.update_stream(&config)
        .await
        .map_err(|e| anyhow!("promote stream {}: {e} (nats-server 2.12 or newer?)", config.name))?;
    tracing::info!(stream = %config.name, "the mirror is a stream of its own now");
    Ok(())
}

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
        *self.role.write().unwrap_or_else(|p| p.into_inner()) = Role::Primary;
        // It may be superseded in turn by a copy of its own.
        self.spawn(listen_for_fence(self.clone()));
        let revision = self.table().revision();
        tracing::info!(bucket = %self.bucket, revision, "promoted: this node serves reads and writes; revisions continue after {revision}");
        Ok(())
    }

    /// Writes `superseded` into the origin's meta bucket. In this JetStream domain it is
    /// published on the bucket's subject (stored even while no kine-rs runs on the origin).
    /// NATS does not carry `$KV.>` subjects between JetStream domains over leaf nodes, so an
    /// origin in another domain is asked on `kine-rs.fence.<domain>.<bucket>`, which a running
    /// kine-rs on it answers after recording the fence itself (`listen_for_fence`).
    async fn fence(&self, origin: &Origin, revision: Revision) -> anyhow::Result<Fence> {
        let record = Superseded {
            birth: self.birth,
            bucket: self.bucket.clone(),
            by: format!("the promoted copy {} (bucket {})", stream_name(&self.bucket), self.bucket),
            revision,
            at_unix: now_unix(),
        };
        let payload: bytes::Bytes = serde_json::to_vec(&record)?.into();
        let answered = tokio::time::timeout(FENCE_TIMEOUT, async {
            match origin.domain() {
                None if origin.api.is_none() => {
                    // Only the bucket this copy was made from: one created since under its name
                    // has another marker time.
                    let stream = self.js.get_stream(&origin.stream).await?;
                    let marker = stream.get_last_raw_message_by_subject(&message::init_subject(&self.stored)).await?;
                    if marker.time.unix_timestamp_nanos() as i64 != self.birth {
                        return Ok(Fence::Gone);
                    }
                    let subject = format!("$KV.{}-meta.{}", origin.bucket(), meta::SUPERSEDED);
                    self.js.publish(subject, payload).await?.await?;
                    Ok(Fence::Fenced)
                }
                None => Err(anyhow!(
                    "the origin is reached through {}, not a JetStream domain: stop it by hand",
                    origin.api.as_deref().unwrap_or_default()
                )),
                Some(domain) => {
                    let answer = self.client.request(fence_subject(domain, origin.bucket()), payload).await?;
                    match std::str::from_utf8(&answer.payload) {
                        Ok(OK) => Ok(Fence::Fenced),
                        Ok(GONE) => Ok(Fence::Gone),
                        other => Err(anyhow!("the origin answered {other:?}")),
                    }
                }
            }
        })
        .await
        .map_err(|_| anyhow!("no answer within {FENCE_TIMEOUT:?}"))?;
        if answered? == Fence::Gone {
            tracing::info!(origin = %origin.describe(), "the old origin bucket is gone (a new bucket has its name): nothing to fence");
            return Ok(Fence::Gone);
        }
        if revision == 0 {
            tracing::info!(origin = %origin.describe(), "the old origin is fenced: it refuses writes from now on");
        } else {
            tracing::debug!(origin = %origin.describe(), revision, "told the old origin where the histories part");
        }
        Ok(Fence::Fenced)
    }

    /// On a promoted primary whose old origin was not reached: fence it as soon as it can be.
    pub(super) async fn keep_fencing(self: Arc<Self>) {
        loop {
            let record = match read_record(&self.meta).await {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the promotion record");
                    tokio::time::sleep(FENCE_RETRY).await;
                    continue;
                }
            };
            if record.fenced || self.is_closed() {
                return;
            }
            let origin = Origin { stream: record.origin_stream.clone(), api: record.origin_api.clone() };
            if let Ok(fence) = self.fence(&origin, record.revision).await {
                if fence == Fence::Fenced {
                    self.report_fork(&origin, record.revision).await;
                }
                let done = Promoted { fenced: true, ..record };
                if let Ok(value) = serde_json::to_vec(&done) {
                    let _ = super::timed("record the fence", self.meta.put(meta::PROMOTED, value.into())).await;
                }
                return;
            }
            tokio::time::sleep(FENCE_RETRY).await;
        }
    }

    /// Logs how many revisions the old origin took after the promotion point (lost here).
    async fn report_fork(&self, origin: &Origin, revision: Revision) {
        let js = match &origin.api {
            Some(api) => jetstream::with_prefix(self.client.clone(), api),
            None => self.js.clone(),
        };
        if let Ok(state) = leader::stream_state(&js, &origin.stream).await
            && state.last > revision
        {
            tracing::error!(
                origin = %origin.describe(),
                promoted_at = revision,
                origin_revision = state.last,
                "the old origin took {} revision(s) after this copy was promoted; they are not in this datastore",
                state.last - revision
            );
        }
    }

    /// A `superseded` record in this datastore's meta bucket: a copy of it was promoted.
    pub(super) fn on_superseded(&self, value: &[u8]) {
        let Ok(record) = serde_json::from_slice::<Superseded>(value) else {
            tracing::warn!("ignoring an unreadable supersession record");
            return;
        };
        if record.birth != self.birth {
            tracing::warn!(by = %record.by, "ignoring a fence meant for an earlier bucket of this name");
            return;
        }
        if self.is_copy() {
            // Its origin's record, mirrored here (this copy's own fence while it is promoted, or
            // another copy's): the origin takes no writes any more.
            if self.promotion.try_lock().is_ok() {
                tracing::warn!(by = %record.by, "the origin of this copy was superseded: it takes no writes any more");
            }
            return;
        }
        let at = if record.revision > 0 { format!(" at revision {}", record.revision) } else { String::new() };
        let by = format!("{}{at}", record.by);
        let current = self.table().revision();
        let mut role = self.role.write().unwrap_or_else(|p| p.into_inner());
        if matches!(&*role, Role::Superseded { by: known } if **known == *by) {
            return;
        }
        if matches!(&*role, Role::Superseded { .. }) {
            tracing::info!(by = %by, revision = current, "the promoted copy told where the histories part");
        } else {
            tracing::error!(
                by = %by,
                revision = current,
                "this datastore was superseded by a promoted copy: it serves reads only from now on{}",
                if record.revision > 0 && current > record.revision {
                    format!("; {} revision(s) written here after {} are not in the new primary", current - record.revision, record.revision)
                } else {
                    String::new()
                }
            );
            *role = Role::Superseded { by: by.into() };
        }
    }
}
