//! The newest sequence a replicated stream's leader has accepted, proposals still in flight
//! included: an upper bound on every message any replica may have stored.
//!
//! `STREAM.INFO` reports what the leader has stored, and a leader stores a committed entry on
//! its own apply goroutine, while a follower stores it as soon as it learns of the commit:
//! another node, reading from a follower, may already serve a message the leader's answer does
//! not include yet. The leader checks a publish's expected last sequence against its proposals
//! (`clseq`), before anything is proposed, and refuses a mismatch naming that sequence. So a
//! publish whose expectation can never hold (`i64::MAX`) is refused with the bound, and costs
//! no revision: nothing is stored.

use super::leader;
use async_nats::HeaderMap;
use kine_core::Revision;

/// The expected last sequence no stream reaches: the publish is always refused.
const NEVER: &str = "9223372036854775807";

/// What the leader answered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Proposed {
    /// The newest sequence it accepted.
    Last(Revision),
    /// It refused the publish for another reason before looking at the expectation (a full
    /// stream, say): no bound learnt.
    Unknown(String),
}

/// Asks the leader of the stream that takes `subject` for the newest sequence it accepted, as
/// patiently as the leader's other questions (`leader::patiently`: while a cluster elects a
/// leader, nobody answers).
pub(super) async fn ask(client: &async_nats::Client, subject: &str) -> kine_core::Result<Proposed> {
    leader::patiently("ask the stream leader for its newest sequence", || async {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Last-Sequence", NEVER);
        let answer = client
            .request_with_headers(subject.to_string(), headers, bytes::Bytes::new())
            .await
            .map_err(|e| e.to_string())?;
        Ok(parse(&answer.payload))
    })
    .await
}

/// The leader's answer to the publish.
fn parse(payload: &[u8]) -> Proposed {
    #[derive(serde::Deserialize)]
    struct Answer {
        error: Option<ApiError>,
        seq: Option<u64>,
    }
    #[derive(serde::Deserialize)]
    struct ApiError {
        #[serde(default)]
        err_code: u64,
        #[serde(default)]
        description: String,
    }
    let text = String::from_utf8_lossy(payload);
    let answer: Answer = match serde_json::from_slice(payload) {
        Ok(a) => a,
        Err(e) => return Proposed::Unknown(format!("unreadable answer {text:?}: {e}")),
    };
    match (answer.error, answer.seq) {
        // JSStreamWrongLastSequenceErrF: "wrong last sequence: {seq}".
        (Some(e), _) if e.err_code == 10071 => {
            match e.description.rsplit_once(": ").and_then(|(_, n)| n.trim().parse::<u64>().ok()) {
                Some(n) => Proposed::Last(n as Revision),
                None => Proposed::Unknown(e.description),
            }
        }
        (Some(e), _) => Proposed::Unknown(e.description),
        // Stored: impossible with this expectation; its sequence is the stream's newest anyway.
        (None, Some(seq)) => {
            tracing::error!(seq, "a NATS read barrier's publish was stored although it expected sequence {NEVER}");
            Proposed::Last(seq as Revision)
        }
        (None, None) => Proposed::Unknown(format!("unexpected answer {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::{self, stream};
    use kine_testkit::nats::{NatsCluster, NatsServer};
    use std::time::Duration;

    async fn stream_on(urls: &str, replicas: usize) -> (async_nats::Client, stream::Stream) {
        let addrs: Vec<async_nats::ServerAddr> = urls.split(',').map(|u| u.parse().unwrap()).collect();
        let client = async_nats::connect(addrs).await.unwrap();
        let js = jetstream::new(client.clone());
        let config = stream::Config {
            name: "KV_p".into(),
            subjects: vec!["$KV.p.>".into()],
            num_replicas: replicas,
            ..Default::default()
        };
        // A forming cluster refuses stream creation for a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match js.create_stream(config.clone()).await {
                Ok(s) => return (client, s),
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("create the stream: {e}; again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("create the stream: {e}"),
            }
        }
    }

    /// Against real servers: the answer is the stream's last sequence when nothing is in
    /// flight, at least the acknowledged writes' while writers publish, and nothing is stored.
    async fn bounds_acknowledged_writes_and_stores_nothing(urls: &str, replicas: usize) {
        let (client, mut stream) = stream_on(urls, replicas).await;
        let js = jetstream::new(client.clone());
        // A replicated stream just created answers "stream not found" until its leader is
        // elected (seen in CI on a loaded machine).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match js.publish("$KV.p.k0", "v".into()).await.unwrap().await {
                Ok(_) => break,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("the first publish: {e}; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the first publish: {e}"),
            }
        }
        for i in 1..5 {
            js.publish(format!("$KV.p.k{i}"), "v".into()).await.unwrap().await.unwrap();
        }
        assert_eq!(ask(&client, "$KV.p.~init").await.unwrap(), Proposed::Last(5));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let js = js.clone();
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    for i in 0..100 {
                        let ack = js.publish(format!("$KV.p.w{w}.{i}"), "v".into()).await.unwrap().await.unwrap();
                        acked.push(ack.sequence as Revision);
                    }
                    acked
                })
            })
            .collect();
        let mut answers = 0;
        while !writers.iter().all(|w| w.is_finished()) {
            // Every write acknowledged before the question is below its answer.
            let before = stream.info().await.unwrap().state.last_sequence as Revision;
            match ask(&client, "$KV.p.~init").await.unwrap() {
                Proposed::Last(n) => assert!(n >= before, "answer {n} below the stored {before}"),
                other => panic!("{other:?}"),
            }
            answers += 1;
        }
        let mut newest = 0;
        for w in writers {
            newest = newest.max(w.await.unwrap().into_iter().max().unwrap());
        }
        assert!(answers > 0);
        assert_eq!(ask(&client, "$KV.p.~init").await.unwrap(), Proposed::Last(newest));
        let state = stream.info().await.unwrap().state.clone();
        assert_eq!((state.messages, state.last_sequence), (405, 405), "the questions stored nothing");
    }

    #[tokio::test]
    async fn a_standalone_server_names_its_last_sequence() {
        let nats = NatsServer::start();
        bounds_acknowledged_writes_and_stores_nothing(&nats.url(), 1).await;
    }

    #[tokio::test]
    async fn a_replicated_streams_leader_names_its_proposals() {
        let cluster = NatsCluster::start();
        bounds_acknowledged_writes_and_stores_nothing(&cluster.urls(0), 3).await;
    }

    #[test]
    fn the_refusal_names_the_bound() {
        let refused =
            br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4711"},"stream":"KV_kine"}"#;
        assert_eq!(parse(refused), Proposed::Last(4711));
        let full =
            br#"{"error":{"code":503,"err_code":10077,"description":"maximum bytes exceeded"},"stream":"KV_kine"}"#;
        assert_eq!(parse(full), Proposed::Unknown("maximum bytes exceeded".into()));
        let constant =
            br#"{"error":{"code":400,"err_code":10164,"description":"wrong last sequence"},"stream":"KV_kine"}"#;
        assert_eq!(parse(constant), Proposed::Unknown("wrong last sequence".into()));
        assert!(matches!(parse(b"nonsense"), Proposed::Unknown(_)));
    }
}
