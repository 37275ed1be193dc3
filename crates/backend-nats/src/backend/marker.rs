//! The bucket's `~init` marker, the stream's first message: written once by the first kine-rs
//! on a new bucket (exactly one node's, through an expected last sequence of 0), read by every
//! node for the bucket name the stored subjects carry and for the store's birth time. A copy
//! waits for its mirror to bring the origin's marker.

use super::copy::MirrorStatus;
use super::origin::{Origin, stream_name};
use super::setup::{Final, PATIENCE};
use crate::config::NatsConfig;
use crate::message;
use anyhow::{anyhow, bail};
use async_nats::jetstream::{self, stream};
use std::time::{Duration, Instant};

/// How long an empty mirror may report an error before start-up gives up.
const MIRROR_ERROR_PATIENCE: Duration = Duration::from_secs(10);
/// How long a node waits for a bucket's marker another node has just written to be readable.
const MARKER_PATIENCE: Duration = Duration::from_secs(5);

/// The marker's time in unix nanoseconds.
fn birth(m: &jetstream::message::StreamMessage) -> i64 {
    m.time.unix_timestamp_nanos() as i64
}

/// Waits for a copy's mirror to hold its origin's `~init` marker, and returns the bucket name
/// the stored subjects carry and the marker's time. A mirror that stays empty is an error
/// (never a silent empty store), naming the mirror's own error when it has one.
pub(super) async fn wait_for_marker(
    js: &jetstream::Context,
    stream: &stream::Stream,
    bucket: &str,
    origin: &Origin,
) -> anyhow::Result<(String, i64)> {
    let started = Instant::now();
    let mut warned = started;
    // Since when the mirror has been reporting an error (its origin's stream missing, say).
    let mut failing: Option<Instant> = None;
    loop {
        match stream.get_first_raw_message_by_subject(format!("$KV.*.{}", message::INIT_TOKEN), 1).await {
            Ok(m) => {
                let stored = m
                    .subject
                    .strip_prefix("$KV.")
                    .and_then(|s| s.strip_suffix(&format!(".{}", message::INIT_TOKEN)))
                    .ok_or_else(|| anyhow!("the marker's subject {} is not a kine-rs bucket's", m.subject))?;
                return Ok((stored.to_string(), birth(&m)));
            }
            Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {}
            Err(e) => bail!("read the mirror {}: {e}", stream_name(bucket)),
        }
        let status = MirrorStatus::read(js, &stream_name(bucket)).await.ok();
        if status.as_ref().is_some_and(|s| s.messages > 0) {
            // Messages but no kine-rs marker: what are they?
            return Err(super::foreign::refusal(js, bucket, Some(&origin.describe())).await);
        }
        let error = status.and_then(|s| s.error);
        let failing_for = match &error {
            Some(_) => failing.get_or_insert_with(Instant::now).elapsed(),
            None => {
                failing = None;
                Duration::ZERO
            }
        };
        let why = error.unwrap_or_else(|| "the origin is unreachable, missing or empty".to_string());
        if started.elapsed() >= PATIENCE || failing_for >= MIRROR_ERROR_PATIENCE {
            return Err(Final(format!(
                "bucket {bucket} mirrors {} but has received nothing from it in {}s: {why}",
                origin.describe(),
                started.elapsed().as_secs()
            ))
            .into());
        }
        if warned.elapsed() >= Duration::from_secs(10) {
            warned = Instant::now();
            tracing::warn!(origin = %origin.describe(), reason = %why, "the mirror has received nothing from its origin yet; waiting");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A bucket of its own (or a promoted copy): the stored bucket name and the marker's time,
/// after checking the marker (written here, as the stream's first message, if the stream is
/// empty).
pub(super) async fn own_marker(
    js: &jetstream::Context,
    stream: &stream::Stream,
    cfg: &NatsConfig,
    info: &stream::Info,
    read_only: bool,
) -> anyhow::Result<(String, i64)> {
    let write = format!("$KV.{}.>", cfg.bucket);
    let stored = match &info.config.subject_transform {
        Some(t) if t.source == write => t
            .destination
            .strip_prefix("$KV.")
            .and_then(|d| d.strip_suffix(".>"))
            .ok_or_else(|| {
                anyhow!(
                    "stream {} transforms {write} into {}, not a bucket's subjects",
                    info.config.name,
                    t.destination
                )
            })?
            .to_string(),
        _ => cfg.bucket.clone(),
    };
    let init = message::init_subject(&stored);
    match stream.get_last_raw_message_by_subject(&init).await {
        Ok(m) => return Ok((stored, birth(&m))),
        Err(e) if e.kind() != stream::LastRawMessageErrorKind::NoMessageFound => {
            return Err(anyhow!("read bucket {}'s marker: {e}", cfg.bucket));
        }
        Err(_) if info.state.messages == 0 && info.state.last_sequence == 0 && read_only => {
            return Err(
                Final(format!("bucket {} is empty: no kine-rs store has been written in it", cfg.bucket)).into()
            );
        }
        Err(_) if info.state.messages == 0 && info.state.last_sequence == 0 && stored == cfg.bucket => {
            // The first kine-rs on this bucket writes the marker; the expectation makes sure
            // exactly one does, at sequence 1.
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Expected-Last-Sequence", "0");
            match js.publish_with_headers(init.clone(), headers, bytes::Bytes::new()).await {
                Ok(ack) => match ack.await {
                    Ok(_) => {}
                    Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {}
                    Err(e) => bail!("initialise bucket {}: {e}", cfg.bucket),
                },
                Err(e) => bail!("initialise bucket {}: {e}", cfg.bucket),
            }
        }
        // Messages but no kine-rs marker: Go kine's bucket, or something else; nothing is
        // written (the meta bucket is not created either).
        Err(_) => return Err(super::foreign::refusal(js, &cfg.bucket, None).await),
    }
    // Written just now (by this node or another): read it back for its time. When another
    // node's marker was still being stored, the leader refused this node's with a wrong last
    // sequence but does not hold it yet (seen in CI with three nodes starting on a new
    // three-server cluster): wait for it a little.
    let started = Instant::now();
    loop {
        match stream.get_last_raw_message_by_subject(&init).await {
            Ok(m) => return Ok((stored, birth(&m))),
            Err(e)
                if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound
                    && started.elapsed() < MARKER_PATIENCE =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(anyhow!("read bucket {}'s marker: {e}", cfg.bucket)),
        }
    }
}
