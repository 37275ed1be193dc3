//! A bucket Go kine wrote, read message by message for `kine-rs migrate` (read only: one
//! ephemeral consumer, removed at the end or by the server once idle; nothing is published).
//!
//! Go kine's bucket (kine-behaviour.md §6): the stream `KV_<bucket>`, one subject per key
//! (base58 tokens, `gokine.rs`), the etcd revision the stream sequence. A put is a message whose
//! payload is the S2-compressed JSON record `{"KV":{…,"Value":<base64>,"CreateRevision":…,
//! "Lease":…},"PrevRevision":…,"Create":…,"Delete":…}`; a delete is two messages on the key's
//! subject: that record with `"Delete": true` (the deletion), then a `KV-Operation: DEL` marker
//! (a revision with no change).

use crate::config::NatsConfig;
use crate::connect::{self, ClientTls};
use crate::gokine;
use anyhow::{Context, Result, bail};
use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// One message of Go kine's bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoKineMessage {
    /// Its stream sequence: the revision.
    pub seq: u64,
    pub key: Vec<u8>,
    pub change: GoKineChange,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoKineChange {
    /// A version of the key. `create_revision` as Go kine reads it (the sequence for a create).
    Put { value: Vec<u8>, create_revision: i64, lease: i64, create: bool },
    /// The key's deletion (its tombstone record).
    Delete,
    /// A delete or purge marker: no change of its own.
    Marker,
}

/// The stream's state when the read began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoKineStream {
    pub first_seq: u64,
    pub last_seq: u64,
    pub messages: u64,
}

/// Connects as `cfg` says and reads every message of bucket `cfg.bucket` up to the stream's
/// last sequence when the read began, in order, handing each to `each`.
pub async fn read(
    cfg: &NatsConfig,
    tls: &ClientTls,
    mut each: impl FnMut(GoKineMessage) -> Result<()>,
) -> Result<GoKineStream> {
    let closing = Arc::new(AtomicBool::new(false));
    let (servers, opts, last_error) = connect::options(cfg, tls, closing.clone()).await?;
    let client = opts
        .connect(servers.clone())
        .await
        .with_context(|| format!("connect to NATS at {}", connect::shown(&servers)))?;
    connect::wait_connected(&client, &servers, &last_error, Duration::from_secs(30)).await?;
    let js = jetstream::new(client.clone());
    let name = format!("KV_{}", cfg.bucket);
    let mut stream = js.get_stream(&name).await.with_context(|| format!("read stream {name}"))?;
    let info = stream.info().await.with_context(|| format!("read stream {name}"))?.state.clone();
    let state = GoKineStream { first_seq: info.first_sequence, last_seq: info.last_sequence, messages: info.messages };
    if state.messages > 0 {
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::None,
                memory_storage: true,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .with_context(|| format!("read stream {name}"))?;
        let mut messages = consumer.messages().await.with_context(|| format!("read stream {name}"))?;
        loop {
            let message = match tokio::time::timeout(Duration::from_secs(30), messages.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(e))) => bail!("read stream {name}: {e}"),
                Ok(None) => bail!("read stream {name}: the consumer ended"),
                Err(_) => bail!("read stream {name}: nothing delivered for 30 s"),
            };
            let seq = message.info().map_err(|e| anyhow::anyhow!("read stream {name}: {e}"))?.stream_sequence;
            if seq > state.last_seq {
                break;
            }
            each(decode(seq, &message.subject, message.headers.as_ref(), &message.payload)?)?;
            if seq == state.last_seq {
                break;
            }
        }
    }
    closing.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(2), client.drain()).await;
    Ok(state)
}

/// One message as Go kine wrote it.
pub fn decode(
    seq: u64,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) -> Result<GoKineMessage> {
    let fail = |why: String| anyhow::anyhow!("message at sequence {seq} (subject {subject}) is not Go kine's: {why}");
    let tokens = subject.strip_prefix("$KV.").and_then(|rest| rest.split_once('.')).map(|(_, t)| t);
    let key = tokens.and_then(gokine::decode_key).ok_or_else(|| fail("its subject is not a base58 key".into()))?;
    let operation = headers.and_then(|h| h.get("KV-Operation")).map(|v| v.as_str().to_string());
    if matches!(operation.as_deref(), Some("DEL" | "PURGE")) {
        return Ok(GoKineMessage { seq, key, change: GoKineChange::Marker });
    }
    let json = if payload.starts_with(&[0xff, 0x06, 0x00, 0x00]) {
        gokine::s2_decode(payload).map_err(fail)?
    } else {
        payload.to_vec()
    };
    let record: Record =
        serde_json::from_slice(&json).map_err(|e| fail(format!("its record is not JSON of Go kine's: {e}")))?;
    if record.kv.key.as_bytes() != key.as_slice() {
        return Err(fail(format!("its record's key {:?} is not the one its subject names", record.kv.key)));
    }
    let change = if record.delete {
        GoKineChange::Delete
    } else {
        use base64::Engine;
        let value = match &record.kv.value {
            Some(v) => {
                base64::engine::general_purpose::STANDARD.decode(v).map_err(|e| fail(format!("its value: {e}")))?
            }
            None => Vec::new(),
        };
        GoKineChange::Put {
            value,
            create_revision: record.kv.create_revision,
            lease: record.kv.lease,
            create: record.create,
        }
    };
    Ok(GoKineMessage { seq, key, change })
}

#[derive(serde::Deserialize)]
struct Record {
    #[serde(rename = "KV")]
    kv: RecordKv,
    #[serde(rename = "Create", default)]
    create: bool,
    #[serde(rename = "Delete", default)]
    delete: bool,
}

#[derive(serde::Deserialize)]
struct RecordKv {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value", default)]
    value: Option<String>,
    #[serde(rename = "CreateRevision", default)]
    create_revision: i64,
    #[serde(rename = "Lease", default)]
    lease: i64,
}
