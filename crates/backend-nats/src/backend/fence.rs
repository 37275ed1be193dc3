//! Fencing: a promoted copy tells its old origin that it was superseded, so that kine-rs on
//! the old origin refuses writes instead of forking the history silently (see `promote.rs`).
//!
//! The record (`superseded` in the origin's meta bucket) names the bucket it supersedes by its
//! creation time, so a bucket created since under the same name is left alone. In the copy's
//! JetStream domain it is published on the meta bucket's subject; NATS does not carry `$KV.>`
//! subjects between domains over leaf nodes, so an origin in another domain is asked on
//! `kine-rs.fence.<domain>.<bucket>`, which a running kine-rs there answers after recording it.

use super::origin::{Origin, stream_name};
use super::record::{Promoted, now_unix, read_record};
use super::{Inner, leader, meta};
use crate::message;
use anyhow::anyhow;
use async_nats::jetstream;
use kine_core::Revision;
use kine_core::backend::Role;
use kine_core::view::WriteView;
use std::sync::Arc;
use std::time::Duration;

/// How long fencing waits for the origin's acknowledgement.
const FENCE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a promoted primary tries to fence an origin it could not reach.
const FENCE_RETRY: Duration = Duration::from_secs(1);

/// What fencing the old origin found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fence {
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

impl Inner {
    /// Writes `superseded` into the origin's meta bucket. In this JetStream domain it is
    /// published on the bucket's subject (stored even while no kine-rs runs on the origin).
    /// NATS does not carry `$KV.>` subjects between JetStream domains over leaf nodes, so an
    /// origin in another domain is asked on `kine-rs.fence.<domain>.<bucket>`, which a running
    /// kine-rs on it answers after recording the fence itself (`listen_for_fence`).
    pub(super) async fn fence(&self, origin: &Origin, revision: Revision) -> anyhow::Result<Fence> {
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
