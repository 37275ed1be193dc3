//! The replica's view of the stream: an ephemeral pull consumer that delivers the bucket's
//! messages from a given sequence.
//!
//! The consumer is the replica's own, never async-nats's ordered consumer: that one re-creates
//! itself on errors and, when it has delivered nothing yet, starts again from the first message
//! of the stream. Here, any doubt (an error, missed heartbeats, a stall) drops the consumer, and
//! the next call creates a new one at exactly the sequence the replica expects. What the
//! consumer delivers is still checked by the replica (see `replica.rs`): a consumer is served by
//! one NATS server, whose copy of the stream may be behind or being rebuilt.

use async_nats::jetstream::{self, consumer, stream};
use futures_util::{FutureExt, StreamExt};
use kine_core::Revision;
use std::time::Duration;

/// A consumer request that gets no answer within this fails (the server may be gone, or the
/// JetStream meta group without a leader: such a request is dropped, not answered, and a new
/// one after the election succeeds at once). After four unanswered ones in a row each allows a
/// second more, up to [`CREATE_LIMIT`], so a creation that is only slow still succeeds.
const CREATE_FIRST: Duration = Duration::from_secs(1);
const CREATE_LIMIT: Duration = Duration::from_secs(4);
/// The server sends a heartbeat when it has nothing to deliver; two missed ones end the consumer.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Messages asked for per pull request.
const BATCH: usize = 1024;
/// The server deletes a consumer that nobody pulled from for this long (one left behind by a
/// connection that broke).
const INACTIVE: Duration = Duration::from_secs(10);

pub(super) enum Next {
    Message(Box<jetstream::Message>),
    /// Nothing arrived within the idle time.
    Idle,
    /// The consumer failed and was dropped; the next call creates another.
    Failed(String),
}

pub(super) struct Cursor {
    stream: stream::Stream,
    filter: String,
    messages: Option<(String, consumer::pull::Stream)>,
    /// Consecutive creations that got no answer.
    timeouts: u32,
}

impl Cursor {
    pub fn new(stream: stream::Stream, filter: String) -> Cursor {
        Cursor { stream, filter, messages: None, timeouts: 0 }
    }

    /// Drops the consumer; the next call to [`Cursor::next`] creates one.
    pub fn reset(&mut self) {
        if let Some((name, _)) = self.messages.take() {
            // Best effort: the server also removes it once inactive.
            let stream = self.stream.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(CREATE_LIMIT, stream.delete_consumer(&name)).await;
            });
        }
    }

    /// The next message, from a consumer that starts at `from` if one has to be created.
    pub async fn next(&mut self, from: Revision, idle: Duration) -> Next {
        if self.messages.is_none() {
            let limit = create_timeout(self.timeouts);
            match tokio::time::timeout(limit, self.create(from)).await {
                Ok(Ok(m)) => {
                    self.timeouts = 0;
                    self.messages = Some(m)
                }
                Ok(Err(e)) => {
                    self.timeouts = 0;
                    return Next::Failed(format!("create the bucket consumer at {from}: {e}"));
                }
                Err(_) => {
                    self.timeouts += 1;
                    return Next::Failed(format!("create the bucket consumer at {from}: no answer within {limit:?}"));
                }
            }
        }
        let Some((_, messages)) = self.messages.as_mut() else { return Next::Idle };
        // A message already buffered needs no timer (a bulk load takes millions in a row).
        let item = match messages.next().now_or_never() {
            Some(item) => item,
            None => match tokio::time::timeout(idle, messages.next()).await {
                Ok(item) => item,
                Err(_) => return Next::Idle,
            },
        };
        match item {
            Some(Ok(m)) => Next::Message(Box::new(m)),
            Some(Err(e)) => {
                self.reset();
                Next::Failed(format!("bucket consumer: {e}"))
            }
            None => {
                self.reset();
                Next::Failed("bucket consumer: ended".into())
            }
        }
    }

    async fn create(&self, from: Revision) -> anyhow::Result<(String, consumer::pull::Stream)> {
        let name = format!("kine-rs-{:016x}", kine_core::id::random_u64());
        let config = consumer::pull::Config {
            name: Some(name.clone()),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: from.max(1) as u64 },
            ack_policy: consumer::AckPolicy::None,
            filter_subject: self.filter.clone(),
            memory_storage: true,
            num_replicas: 1,
            inactive_threshold: INACTIVE,
            ..Default::default()
        };
        let consumer = self.stream.create_consumer(config).await?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(BATCH)
            .heartbeat(HEARTBEAT)
            .expires(HEARTBEAT * 5)
            .messages()
            .await?;
        Ok((name, messages))
    }
}

/// How long a creation waits for its answer after `timeouts` consecutive ones went unanswered:
/// 1 s four times (an election is over within a few seconds), then a second more each time, up
/// to [`CREATE_LIMIT`].
fn create_timeout(timeouts: u32) -> Duration {
    (CREATE_FIRST * timeouts.saturating_sub(2).max(1)).min(CREATE_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_waits_longer_after_each_unanswered_one() {
        let steps: Vec<u64> = (0..9).map(|t| create_timeout(t).as_millis() as u64).collect();
        assert_eq!(steps, [1000, 1000, 1000, 1000, 2000, 3000, 4000, 4000, 4000]);
    }
}
