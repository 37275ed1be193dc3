//! Questions only the stream's leader answers: what the stream holds now. Followers may be
//! behind, so the replica's checks and the read barrier ask these, never a direct get.

use super::{NATS_TIMEOUT, transient, unavailable};
use async_nats::jetstream::{self, kv, stream};
use kine_core::{Result, Revision};
use std::time::{Duration, Instant};

/// The stream's state as its leader reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StreamState {
    /// Messages the stream holds.
    pub messages: u64,
    /// The sequence of the newest message ever stored (it may have been removed since).
    pub last: Revision,
}

/// One request's limit: a leader that died answers nothing, and the next attempt may reach the
/// one elected after it.
const ATTEMPT: Duration = Duration::from_millis(1500);

/// Retries `f` while the NATS cluster elects a leader, within [`NATS_TIMEOUT`].
async fn patiently<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + NATS_TIMEOUT;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let error = match tokio::time::timeout(remaining.min(ATTEMPT), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !transient(&e) => return Err(unavailable(format!("{what}: {e}"))),
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {:?}", remaining.min(ATTEMPT)),
        };
        if deadline.saturating_duration_since(Instant::now()) < Duration::from_millis(200) {
            return Err(unavailable(format!("{what}: {error}")));
        }
        tracing::debug!(error = %error, "{what}: retrying");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What `STREAM.INFO` answers, as far as the barrier needs it: parsing only this costs far less
/// than the whole stream description.
#[derive(serde::Deserialize)]
struct Info {
    state: State,
    cluster: Option<Cluster>,
}

#[derive(serde::Deserialize)]
struct State {
    messages: u64,
    last_seq: u64,
}

#[derive(serde::Deserialize)]
struct Cluster {
    leader: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Answer {
    Err { error: jetstream::Error },
    Ok(Info),
}

/// The state of stream `name`, from its leader. While the stream's Raft group has no leader its
/// members answer for themselves, possibly behind: such an answer (no leader named) is not
/// taken.
pub(super) async fn stream_state(js: &jetstream::Context, name: &str) -> Result<StreamState> {
    let subject = format!("STREAM.INFO.{name}");
    patiently("read the stream state", || async {
        let answer: Answer = js.request(subject.clone(), &()).await.map_err(|e| e.to_string())?;
        let info = match answer {
            Answer::Ok(info) => info,
            Answer::Err { error } => return Err(error.to_string()),
        };
        if info.cluster.is_some_and(|c| c.leader.is_none_or(|l| l.is_empty())) {
            return Err("the stream has no leader (an election is under way)".to_string());
        }
        Ok(StreamState { messages: info.state.messages, last: info.state.last_seq as Revision })
    })
    .await
}

/// The sequence of the first message at or after `seq` under `filter`, if any exists.
pub(super) async fn first_at_or_after(
    stream: &stream::Stream,
    filter: &str,
    seq: Revision,
) -> Result<Option<Revision>> {
    patiently("read the stream", || async {
        match stream.get_first_raw_message_by_subject(filter, seq.max(1) as u64).await {
            Ok(m) => Ok(Some(m.sequence as Revision)),
            Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// The compact revision recorded in `<bucket>-meta`, from that stream's leader (-1: never
/// compacted).
pub(super) async fn compact_revision(meta: &kv::Store) -> Result<Revision> {
    let subject = format!("{}compact_revision", meta.prefix);
    patiently("read the compact revision", || async {
        match meta.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => std::str::from_utf8(&m.payload)
                .ok()
                .and_then(|s| s.parse::<Revision>().ok())
                .ok_or_else(|| "compact_revision is not a number".to_string()),
            // Never compacted.
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(-1),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}
