//! The read barrier's question asked of a standalone nats-server as a direct get of the
//! stream's last message (`$JS.API.DIRECT.GET.<stream>` with `last_by_subj: ">"`), instead of
//! `STREAM.INFO`: the same answer (the message at the stream's last sequence, looked up by its
//! sequence), served in the server's client read loop rather than by its JetStream API
//! workers. On this machine it costs nats-server 35–39 µs of CPU against 61–64 µs for
//! `STREAM.INFO` (docs/benchmarks-history.md, tenth pass).
//!
//! Direct gets are answered by every replica of a stream and by mirrors that serve them for
//! their origin (a mirror does by default when its origin allows direct gets), any of which
//! may be behind. So the question is asked only while the stream's leader confirmed, within the
//! last second (the barrier's `STREAM.INFO` answers, one a second while direct gets answer),
//! that the stream has no other replica and lives on the server this node is connected to, and
//! only if that server is not part of a cluster (where a stream's replicas may be added at any
//! time): NATS hands a request to a subscriber on the server it arrived at before any other,
//! so the stream itself answers, unless a mirror on the same server does. An answer counts only
//! if it is a message of this very stream (its `Nats-Stream` header): anything else (a mirror
//! answered, the last message was removed, the stream is empty, no answer within a second)
//! sends the node back to `STREAM.INFO` for a second. So does an answer carrying a large value,
//! whose copying would cost more than the question saves.

use super::leader::ATTEMPT;
use async_nats::header::{NATS_SEQUENCE, NATS_STREAM};
use bytes::Bytes;
use kine_core::Revision;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The request: the last message of any subject, i.e. the message at the last sequence.
const LAST: &[u8] = br#"{"last_by_subj":">"}"#;

/// How long the node asks `STREAM.INFO` instead after an answer it could not use.
const PAUSE: Duration = Duration::from_secs(1);

/// How long a `STREAM.INFO` answer saying the stream lives alone on this node's server counts.
const CONFIRMED: Duration = Duration::from_secs(1);

/// A value at least this large in an answer pauses the direct question (see the module
/// documentation); a `STREAM.INFO` answer is about 1 KiB.
const LARGE: usize = 16 * 1024;

pub(super) struct Direct {
    client: async_nats::Client,
    subject: async_nats::Subject,
    stream: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Until when the stream is known to live alone on the server this node is connected to.
    confirmed_until: Option<Instant>,
    /// Until when the node asks `STREAM.INFO` anyway.
    paused_until: Option<Instant>,
}

impl Direct {
    pub fn new(client: async_nats::Client, stream: &str) -> Direct {
        Direct {
            client,
            subject: format!("$JS.API.DIRECT.GET.{stream}").into(),
            stream: stream.to_string(),
            state: Mutex::new(State::default()),
        }
    }

    /// Takes what a `STREAM.INFO` answer said: `here`, the stream has no other replica and is
    /// led by the server this node is connected to.
    pub fn confirm(&self, here: bool) {
        self.state().confirmed_until = here.then(|| Instant::now() + CONFIRMED);
    }

    /// The stream's last sequence, if the direct question may be asked now and was answered by
    /// the stream itself; None: ask the stream leader.
    pub async fn last(&self) -> Option<Revision> {
        if !self.may_ask() || self.client.server_info().cluster.is_some() {
            return None;
        }
        let answer =
            match tokio::time::timeout(ATTEMPT, self.client.request(self.subject.clone(), Bytes::from_static(LAST)))
                .await
            {
                Ok(Ok(message)) => last_of(&message, &self.stream),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {ATTEMPT:?}")),
            };
        match answer {
            Ok((last, size)) => {
                if size >= LARGE {
                    self.pause();
                }
                Some(last)
            }
            Err(why) => {
                tracing::debug!(%why, stream = %self.stream, "read barrier: no direct answer, asking STREAM.INFO for {PAUSE:?}");
                self.pause();
                None
            }
        }
    }

    fn may_ask(&self) -> bool {
        let now = Instant::now();
        let state = self.state();
        state.confirmed_until.is_some_and(|t| now < t) && state.paused_until.is_none_or(|t| now >= t)
    }

    fn pause(&self) {
        self.state().paused_until = Some(Instant::now() + PAUSE);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sequence of the message `answer` carries, and its size, if it is a message of `stream`.
fn last_of(answer: &async_nats::Message, stream: &str) -> Result<(Revision, usize), String> {
    if let Some(status) = answer.status.filter(|s| !s.is_success()) {
        return Err(format!("{status} {}", answer.description.as_deref().unwrap_or("")));
    }
    // The server appends these after the headers the message was stored with: the last value
    // is the server's.
    let header = |name| answer.headers.as_ref().and_then(|h| h.get_last(name)).map(|v| v.as_str());
    match header(NATS_STREAM) {
        Some(s) if s == stream => {}
        Some(s) => return Err(format!("answered by stream {s}, not {stream} (a mirror?)")),
        None => return Err("the answer names no stream".into()),
    }
    let last = header(NATS_SEQUENCE)
        .and_then(|s| s.parse::<Revision>().ok())
        .ok_or_else(|| "the answer carries no sequence".to_string())?;
    Ok((last, answer.payload.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::{self, stream};
    use async_nats::{HeaderMap, Message, StatusCode};
    use kine_testkit::nats::NatsServer;

    /// Against a real nats-server: the stream's mirror on the same server answers some of the
    /// direct gets sent for the stream (as mirrors do by default); only the stream's own
    /// answers are taken. (The mirror is caught up here, so its answers carry the same
    /// sequence: what is checked is that they are refused.)
    #[tokio::test]
    async fn a_mirrors_answers_are_not_taken() {
        let nats = NatsServer::start();
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        let config = stream::Config {
            name: "KV_o".into(),
            subjects: vec!["$KV.o.>".into()],
            allow_direct: true,
            ..Default::default()
        };
        js.create_stream(config).await.unwrap();
        for i in 0..5 {
            js.publish(format!("$KV.o.k{i}"), "v".into()).await.unwrap().await.unwrap();
        }
        let mirror = stream::Config {
            name: "KV_m".into(),
            mirror: Some(stream::Source { name: "KV_o".into(), ..Default::default() }),
            ..Default::default()
        };
        let mut mirror = js.create_stream(mirror).await.unwrap();
        while mirror.info().await.unwrap().state.messages < 5 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let direct = Direct::new(client, "KV_o");
        assert_eq!(direct.last().await, None, "not confirmed yet: STREAM.INFO is asked");
        let (mut taken, mut refused) = (0, 0);
        // The mirror starts answering a moment after it caught up: ask until both answered.
        let deadline = Instant::now() + Duration::from_secs(20);
        while (taken < 10 || refused < 10) && Instant::now() < deadline {
            *direct.state() = State::default();
            direct.confirm(true);
            match direct.last().await {
                Some(last) => {
                    assert_eq!(last, 5);
                    taken += 1;
                }
                None => {
                    // A refused answer pauses the direct question: STREAM.INFO is asked instead.
                    assert_eq!(direct.last().await, None);
                    refused += 1;
                }
            }
        }
        // The stream and its mirror share the requests: both must have come up.
        assert!(taken >= 10 && refused >= 10, "taken {taken}, refused {refused}");
    }

    fn answer(status: Option<StatusCode>, headers: &[(&str, &str)], payload: usize) -> Message {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(*k, *v);
        }
        Message {
            subject: "_INBOX.x".into(),
            reply: None,
            payload: vec![b'x'; payload].into(),
            headers: (!headers.is_empty()).then_some(map),
            status,
            description: status.map(|_| "Message Not Found".to_string()),
            length: payload,
        }
    }

    #[test]
    fn only_a_message_of_this_stream_answers() {
        let ours = [("Nats-Stream", "KV_k"), ("Nats-Sequence", "42"), ("Nats-Subject", "$KV.k.a")];
        assert_eq!(last_of(&answer(None, &ours, 256), "KV_k"), Ok((42, 256)));
        // Headers stored with the message come first, the server's after them.
        let stored =
            [("Nats-Stream", "KV_copy"), ("Nats-Sequence", "7"), ("Nats-Stream", "KV_k"), ("Nats-Sequence", "42")];
        assert_eq!(last_of(&answer(None, &stored, 10), "KV_k"), Ok((42, 10)));
        let mirror = [("Nats-Stream", "KV_copy"), ("Nats-Sequence", "40")];
        assert!(last_of(&answer(None, &mirror, 256), "KV_k").unwrap_err().contains("KV_copy"));
        // No message at the last sequence (removed) or an empty stream: says nothing of which
        // stream answered.
        assert!(last_of(&answer(Some(StatusCode::NOT_FOUND), &[], 0), "KV_k").is_err());
        assert!(last_of(&answer(None, &[("Nats-Sequence", "42")], 1), "KV_k").is_err());
        assert!(last_of(&answer(None, &[("Nats-Stream", "KV_k")], 1), "KV_k").is_err());
        assert!(last_of(&answer(None, &[("Nats-Stream", "KV_k"), ("Nats-Sequence", "x")], 1), "KV_k").is_err());
    }
}
