//! Opening a bucket: the stream and the `<bucket>-meta` KV bucket created if needed, the
//! compact revision and the leases read, all patient with a NATS cluster that is still forming.

use super::Inner;
use crate::config::NatsConfig;
use crate::message;
use anyhow::{Context as _, anyhow, bail};
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use std::time::{Duration, Instant};

/// How long start-up waits for JetStream to answer (a forming cluster, a leader election)
/// before giving up with the last error.
const PATIENCE: Duration = Duration::from_secs(60);
/// A bound on one attempt of a step (each NATS request in it has its own 5 s timeout; loading
/// many leases takes many requests).
const ATTEMPT_LIMIT: Duration = Duration::from_secs(30);

/// Runs a start-up step until it succeeds, retrying while it fails the way a NATS cluster that is
/// forming or electing a leader fails (no responders, timeouts, "temporarily unavailable", no
/// peers yet), for up to [`PATIENCE`]. Other errors, and the last one after that, fail at once.
pub(super) async fn patiently<T, F, Fut>(what: &str, mut step: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let started = Instant::now();
    let mut warned = started;
    loop {
        let error = match tokio::time::timeout(ATTEMPT_LIMIT, step()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(_) => anyhow!("{what}: timed out after {ATTEMPT_LIMIT:?}"),
        };
        if !super::transient(&format!("{error:#}")) || started.elapsed() >= PATIENCE {
            return Err(error);
        }
        tracing::debug!(error = format!("{error:#}"), "{what}: JetStream not ready; retrying");
        if warned.elapsed() >= Duration::from_secs(10) {
            warned = Instant::now();
            tracing::warn!(
                waited_s = started.elapsed().as_secs(),
                error = format!("{error:#}"),
                "{what}: still waiting for JetStream"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(super) async fn ensure_stream(js: &jetstream::Context, cfg: &NatsConfig) -> anyhow::Result<stream::Stream> {
    let name = format!("KV_{}", cfg.bucket);
    let config = stream::Config {
        name: name.clone(),
        subjects: vec![format!("$KV.{}.>", cfg.bucket)],
        max_messages_per_subject: if cfg.rev_history > 0 { cfg.rev_history } else { -1 },
        allow_rollup: true,
        allow_direct: true,
        allow_atomic_publish: true,
        num_replicas: cfg.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    // A cluster that is still forming answers "no suitable peers" for a while (`patiently`).
    let mut stream = match js.get_stream(&name).await {
        Ok(s) => s,
        Err(_) => js.create_stream(config).await.map_err(|e| anyhow!("create stream {name}: {e}"))?,
    };
    let info = stream.info().await.with_context(|| format!("read stream {name}"))?.clone();
    let limit = info.config.max_messages_per_subject.max(0);
    if limit != cfg.rev_history {
        tracing::warn!(
            stream = %name,
            stream_limit = limit,
            rev_history = cfg.rev_history,
            "the stream's per-key message limit differs from revHistory (0: none); the stream's is used"
        );
    }
    if !info.config.allow_atomic_publish {
        tracing::warn!(stream = %name, "atomic batch publish is off on this stream; writes that change several keys will fail");
    }
    let init = message::init_subject(&cfg.bucket);
    match stream.get_last_raw_message_by_subject(&init).await {
        Ok(_) => {}
        Err(e) if e.kind() != stream::LastRawMessageErrorKind::NoMessageFound => {
            return Err(anyhow!("read bucket {}'s marker: {e}", cfg.bucket));
        }
        Err(_) if info.state.messages == 0 && info.state.last_sequence == 0 => {
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
        Err(_) => bail!(
            "bucket {} holds data that kine-rs did not write (a bucket of Go kine?); use another bucket (?bucket=NAME)",
            cfg.bucket
        ),
    }
    Ok(stream)
}

pub(super) async fn ensure_meta(js: &jetstream::Context, cfg: &NatsConfig) -> anyhow::Result<jetstream::kv::Store> {
    let name = format!("{}-meta", cfg.bucket);
    if let Ok(kv) = js.get_key_value(&name).await {
        return Ok(kv);
    }
    js.create_key_value(jetstream::kv::Config {
        bucket: name.clone(),
        description: "kine-rs compact revision and leases".into(),
        history: 1,
        num_replicas: cfg.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow!("create KV bucket {name}: {e}"))
}

pub(super) async fn load_leases(inner: &Inner) -> anyhow::Result<()> {
    let mut keys = inner.meta.keys().await.context("list leases")?;
    while let Some(key) = keys.next().await {
        let key = key.context("list leases")?;
        if let Some(entry) = inner.meta.entry(&key).await.context("read a lease")? {
            inner.apply_meta(&entry);
        }
    }
    Ok(())
}
