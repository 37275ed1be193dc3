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
    /// For a stream with other replicas: how long ago the leader that answered last heard from
    /// a quorum of them (see [`LEASE`]).
    pub contact: Option<Duration>,
    /// The stream has no other replicas and is led by the server this client is connected to.
    pub here: bool,
}

/// A replicated stream's leader answers for the stream only while it heard from a quorum of its
/// replicas within this. One cut off from them keeps believing it leads until its Raft term
/// times out (10 to 20 s), while the others elect a new leader once their election timeout
/// (4 to 9 s) passes without hearing from it; answers from such a leader are stale (as are a
/// deposed leader's, whose link comes back before the Raft traffic telling it that it was
/// deposed: both answer requests for a while). The followers hear from a leader at least every
/// second (its heartbeats), so 2 s leaves a working leader room and expires well before another
/// can be elected: etcd's leader lease, with nats-server's timeouts.
pub(super) const LEASE: Duration = Duration::from_secs(2);

/// How long ago the leader last heard from a quorum of its other `replicas`: the oldest contact
/// among the most recent ones a quorum needs. None: no other replicas.
fn quorum_contact(replicas: &[Replica]) -> Option<Duration> {
    if replicas.is_empty() {
        return None;
    }
    let mut ages: Vec<Duration> = replicas
        .iter()
        .map(|r| match r.active {
            Some(ns) if ns > 0 => Duration::from_nanos(ns),
            _ if r.current => Duration::ZERO,
            _ => Duration::MAX,
        })
        .collect();
    ages.sort();
    // Of the len+1 replicas (the leader included), a quorum needs (len+1)/2+1: (len+1)/2 others.
    ages.get(replicas.len().div_ceil(2) - 1).copied()
}

/// One request's limit: a leader that died answers nothing, and the next attempt may reach the
/// one elected after it.
pub(super) const ATTEMPT: Duration = Duration::from_secs(1);

/// Retries `f` while the NATS cluster elects a leader, within [`NATS_TIMEOUT`].
pub(super) async fn patiently<T, F, Fut>(what: &str, mut f: F) -> Result<T>
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
    #[serde(default)]
    replicas: Vec<Replica>,
}

/// A replica other than the leader, as the leader sees it.
#[derive(serde::Deserialize)]
struct Replica {
    /// Nanoseconds since the leader last heard from it (absent or 0: never, unless current).
    #[serde(default)]
    active: Option<u64>,
    #[serde(default)]
    current: bool,
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
    state(js, name, false).await
}

/// [`stream_state`], from a leader that heard from a quorum of its replicas within [`LEASE`]
/// (another answer is asked for meanwhile): what a read barrier may trust.
pub(super) async fn leading_state(js: &jetstream::Context, name: &str) -> Result<StreamState> {
    state(js, name, true).await
}

async fn state(js: &jetstream::Context, name: &str, leased: bool) -> Result<StreamState> {
    let subject = format!("STREAM.INFO.{name}");
    patiently("read the stream state", || async {
        let answer: Answer = js.request(subject.clone(), &()).await.map_err(|e| e.to_string())?;
        let info = match answer {
            Answer::Ok(info) => info,
            Answer::Err { error } => return Err(error.to_string()),
        };
        if info.cluster.as_ref().is_some_and(|c| c.leader.as_ref().is_none_or(|l| l.is_empty())) {
            return Err("the stream has no leader (an election is under way)".to_string());
        }
        let contact = info.cluster.as_ref().and_then(|c| quorum_contact(&c.replicas));
        if leased && contact.is_some_and(|c| c > LEASE) {
            // "leader" in the text: retried (`transient`), another answer may come from the
            // leader elected since.
            return Err(format!(
                "the stream leader has not heard from a quorum of its replicas for {:?}",
                contact.unwrap_or_default()
            ));
        }
        let leader = info.cluster.as_ref().and_then(|c| c.leader.as_deref());
        let here = contact.is_none() && leader.is_some_and(|l| l == js.client().server_info().server_name);
        Ok(StreamState { messages: info.state.messages, last: info.state.last_seq as Revision, contact, here })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn contact(json: &str) -> Option<Duration> {
        let cluster: Cluster = serde_json::from_str(json).unwrap();
        quorum_contact(&cluster.replicas)
    }

    #[test]
    fn a_quorum_needs_the_most_recent_contacts() {
        assert_eq!(contact(r#"{"leader":"a"}"#), None, "no other replicas");
        // R3: the leader and its most recent follower are a quorum.
        let r3 = r#"{"leader":"a","replicas":[{"name":"b","current":true,"active":250000000},
            {"name":"c","current":false,"active":9000000000}]}"#;
        assert_eq!(contact(r3), Some(Duration::from_millis(250)));
        // Cut off from both: the leader's quorum contact is as old as the newer of them.
        let cut = r#"{"leader":"a","replicas":[{"name":"b","current":true,"active":6000000000},
            {"name":"c","current":true,"active":7000000000}]}"#;
        assert!(contact(cut).unwrap() > LEASE);
        // R5: two others are needed.
        let r5 = r#"{"leader":"a","replicas":[{"active":100},{"active":3000000000},{"active":200},{"current":false}]}"#;
        assert_eq!(contact(r5), Some(Duration::from_nanos(200)));
        // Never heard from (no active, not current) counts as never; current and 0 as now.
        assert_eq!(contact(r#"{"replicas":[{"current":false},{"current":false}]}"#), Some(Duration::MAX));
        assert_eq!(contact(r#"{"replicas":[{"current":true,"active":0},{"current":false}]}"#), Some(Duration::ZERO));
    }
}
