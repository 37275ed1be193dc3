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

/// A consumer request that gets no answer within this fails (the server may be gone).
const CREATE_TIMEOUT: Duration = Duration::from_secs(2);
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
}

impl Cursor {
    pub fn new(stream: stream::Stream, filter: String) -> Cursor {
        Cursor { stream, filter, messages: None }
    }

    /// Drops the consumer; the next call to [`Cursor::next`] creates one.
    pub fn reset(&mut self) {
        if let Some((name, _)) = self.messages.take() {
            // Best effort: the server also removes it once inactive.
            let stream = self.stream.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(CREATE_TIMEOUT, stream.delete_consumer(&name)).await;
            });
        }
    }

    /// The next message, from a consumer that starts at `from` if one has to be created.
    pub async fn next(&mut self, from: Revision, idle: Duration) -> Next {
        if self.messages.is_none() {
            match tokio::time::timeout(CREATE_TIMEOUT, self.create(from)).await {
                Ok(Ok(m)) => self.messages = Some(m),
                Ok(Err(e)) => return Next::Failed(format!("create the bucket consumer at {from}: {e}")),
                Err(_) => return Next::Failed(format!("create the bucket consumer at {from}: timed out")),
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
