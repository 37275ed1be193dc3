//! A read-only copy at run time: how far behind its origin it is and whether the link works,
//! the origin's compactions applied once the replica holds them, and a promotion made by
//! another node of the copy noticed.
//!
//! The mirror's own state answers (`STREAM.INFO` of the copy's stream, from its leader): `lag`,
//! the messages the origin still holds for it; `active`, the time since it last heard from the
//! origin (heartbeats arrive every second on a working link); `error`, why the mirror cannot
//! consume (the origin's stream missing, say).

use super::Inner;
use super::origin::Origin;
use kine_core::Revision;
use kine_core::backend::Replication;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the copy looks at its mirror.
const POLL: Duration = Duration::from_secs(1);
/// The link counts as down when the mirror heard nothing from its origin for this long.
const LINK_DOWN_AFTER: Duration = Duration::from_secs(3);
/// How long a node whose stream another node promoted waits for that node's record.
const PROMOTION_RECORD_WAIT: Duration = Duration::from_secs(10);

/// The state of a copy's mirror stream.
#[derive(Clone, Debug)]
pub(crate) struct MirrorStatus {
    /// Messages the stream holds.
    pub messages: u64,
    /// Its last sequence.
    pub last: Revision,
    /// It is still a mirror (not promoted).
    pub mirroring: bool,
    /// Messages its origin holds that it does not have yet.
    pub lag: u64,
    /// Since it last heard from its origin (`None`: never).
    pub active: Option<Duration>,
    /// Why it cannot consume from its origin.
    pub error: Option<String>,
}

#[derive(serde::Deserialize)]
struct Info {
    config: Config,
    state: State,
    mirror: Option<Source>,
}

#[derive(serde::Deserialize)]
struct Config {
    mirror: Option<serde_json::Value>,
}

#[derive(serde::Deserialize)]
struct State {
    messages: u64,
    last_seq: u64,
}

#[derive(serde::Deserialize)]
struct Source {
    #[serde(default)]
    lag: u64,
    #[serde(default = "never")]
    active: i64,
    error: Option<ApiError>,
}

fn never() -> i64 {
    -1
}

#[derive(serde::Deserialize)]
struct ApiError {
    #[serde(default)]
    description: String,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Answer {
    Err { error: ApiError },
    Ok(Info),
}

impl MirrorStatus {
    pub async fn read(js: &async_nats::jetstream::Context, stream: &str) -> Result<MirrorStatus, String> {
        let answer: Answer =
            tokio::time::timeout(super::NATS_TIMEOUT, js.request(format!("STREAM.INFO.{stream}"), &()))
                .await
                .map_err(|_| "no answer".to_string())?
                .map_err(|e| e.to_string())?;
        let info = match answer {
            Answer::Ok(info) => info,
            Answer::Err { error } => return Err(error.description),
        };
        let mirror = info.mirror.unwrap_or(Source { lag: 0, active: -1, error: None });
        Ok(MirrorStatus {
            messages: info.state.messages,
            last: info.state.last_seq as Revision,
            mirroring: info.config.mirror.is_some(),
            lag: mirror.lag,
            active: u64::try_from(mirror.active).ok().map(Duration::from_nanos),
            error: mirror.error.map(|e| e.description),
        })
    }
}

fn unix_nanos() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

impl Inner {
    /// The copy's distance to its origin from its mirror's state.
    ///
    /// Revisions: what the mirror knows the origin holds beyond what the replica applied (while
    /// the link is down the origin's new writes are unknown here). Seconds: 0 when up to date;
    /// while catching up, the age of the newest change applied (the origin's clock); while the
    /// link is down, the time since the copy last heard from the origin if it was up to date
    /// then, else the larger of that and the age of the newest change applied.
    fn replication_from(&self, origin: &Origin, status: Result<MirrorStatus, String>) -> Replication {
        let applied = *self.applied.borrow();
        let newest = self.applied_at.load(Ordering::Relaxed);
        let age = if newest == 0 { 0.0 } else { (unix_nanos() - newest).max(0) as f64 / 1e9 };
        let s = match status {
            Ok(s) => s,
            Err(e) => {
                return Replication {
                    origin: origin.describe().into(),
                    lag_revisions: 0,
                    lag_seconds: age,
                    link_up: false,
                    link_error: Some(format!("cannot read the mirror's state: {e}")),
                    last_contact_seconds: None,
                };
            }
        };
        let lag_revisions = s.lag as i64 + (s.last - applied).max(0);
        let link_up = s.error.is_none() && s.active.is_some_and(|a| a < LINK_DOWN_AFTER);
        let lag_seconds = if link_up {
            self.current_at_contact.store(lag_revisions == 0, Ordering::Relaxed);
            if lag_revisions == 0 { 0.0 } else { age }
        } else {
            let silent = s.active.map_or(age, |a| a.as_secs_f64());
            if self.current_at_contact.load(Ordering::Relaxed) { silent } else { silent.max(age) }
        };
        Replication {
            origin: origin.describe().into(),
            lag_revisions,
            lag_seconds,
            link_up,
            link_error: s.error.clone().or_else(|| match s.active {
                None => Some("nothing heard from the origin yet".into()),
                Some(a) if a >= LINK_DOWN_AFTER => Some(format!("nothing heard from the origin for {}s", a.as_secs())),
                Some(_) => None,
            }),
            last_contact_seconds: s.active.map(|a| a.as_secs_f64()),
        }
    }

    /// Reads the mirror's state once: the copy's lag, for the start-up log and `replication()`.
    pub(super) async fn look_at_mirror(&self, origin: &Origin) -> Option<MirrorStatus> {
        let status = MirrorStatus::read(&self.js, &self.stream_name).await;
        let replication = self.replication_from(origin, status.clone());
        *self.replication.lock().unwrap_or_else(|p| p.into_inner()) = Some(replication);
        status.ok()
    }
}

/// Runs while this node serves a copy: every second, the mirror's state; the origin's
/// compactions once the replica holds them; the switch to primary when another node promoted
/// the copy.
pub(super) async fn follow(inner: Arc<Inner>, origin: Origin) {
    let mut link_up: Option<bool> = None;
    let mut compactions = inner.pending_compaction.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = compactions.changed() => {}
        }
        if inner.is_closed() || !inner.is_copy() {
            return;
        }
        let pending = *inner.pending_compaction.borrow();
        if pending > inner.table().revisions().compacted
            && *inner.applied.borrow() >= pending
            && let Err(e) = inner.follow_compaction(pending).await
        {
            tracing::warn!(error = %e, revision = pending, "cannot apply the origin's compaction yet");
        }
        let Some(status) = inner.look_at_mirror(&origin).await else {
            if link_up != Some(false) {
                tracing::warn!("cannot read the copy's mirror state");
                link_up = Some(false);
            }
            continue;
        };
        if !status.mirroring {
            switch_after_promotion(&inner, &origin).await;
            return;
        }
        let replication = inner.replication.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(r) = replication else { continue };
        if link_up != Some(r.link_up) {
            if r.link_up {
                tracing::info!(origin = %r.origin, lag_revisions = r.lag_revisions, "the link to the origin is up");
            } else {
                tracing::warn!(origin = %r.origin, reason = r.link_error.as_deref().unwrap_or(""), "the link to the origin is down; serving what the copy has");
            }
            link_up = Some(r.link_up);
        }
    }
}

/// Another node of this copy promoted it: take writes too, once the promotion is finished.
async fn switch_after_promotion(inner: &Arc<Inner>, origin: &Origin) {
    // A promotion through this node holds the lock until it is done.
    let _one = inner.promotion.lock().await;
    if !inner.is_copy() {
        return;
    }
    tracing::info!("the copy's stream was promoted by another node; loading it again to take writes");
    let deadline = tokio::time::Instant::now() + PROMOTION_RECORD_WAIT;
    loop {
        match super::record::recorded_origin(&inner.meta).await {
            Ok(Some(_)) => break,
            _ if tokio::time::Instant::now() >= deadline => {
                // The node that promoted it stopped half-way: finish for it.
                if let Err(e) = inner.finish_promotion(origin, false, false).await {
                    tracing::error!(error = %e, "cannot finish the promotion; serving the copy read-only");
                    return;
                }
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    match inner.become_primary().await {
        Ok(()) => inner.start_fencing(),
        Err(e) => tracing::error!(error = %e, "cannot take writes after the promotion; serving the copy read-only"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mirror_state_is_read() {
        let json = r#"{"config":{"name":"KV_c","mirror":{"name":"KV_o"}},"created":"2026-01-01T00:00:00Z",
            "state":{"messages":4,"bytes":1,"first_seq":2,"last_seq":5},
            "mirror":{"name":"KV_o","lag":3,"active":380646409,"error":{"code":404,"err_code":10059,"description":"stream not found"}}}"#;
        let super::Answer::Ok(info) = serde_json::from_str::<super::Answer>(json).unwrap() else { panic!() };
        let m = info.mirror.unwrap();
        assert_eq!((m.lag, m.active), (3, 380646409));
        assert_eq!(m.error.unwrap().description, "stream not found");
        assert!(info.config.mirror.is_some());
        let json = r#"{"config":{"name":"KV_c"},"state":{"messages":0,"last_seq":0}}"#;
        let super::Answer::Ok(info) = serde_json::from_str::<super::Answer>(json).unwrap() else { panic!() };
        assert!(info.config.mirror.is_none() && info.mirror.is_none());
        let json = r#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#;
        assert!(matches!(serde_json::from_str::<super::Answer>(json).unwrap(), super::Answer::Err { .. }));
    }
}
