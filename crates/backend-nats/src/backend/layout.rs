//! What the bucket's stream is, and the streams opened (or created) for it.
//!
//! Three kinds of stream `KV_<bucket>`:
//! - **a bucket of its own**, written by kine-rs on `$KV.<bucket>.>`;
//! - **a read-only copy**: a JetStream mirror of another kine-rs bucket, its origin. A mirror
//!   keeps its origin's sequences (so its revisions) and subjects, and takes no writes;
//! - **a promoted copy**: a former mirror whose mirror configuration a promotion removed. It
//!   takes writes on `$KV.<bucket>.>` and stores them, through a subject transform, under the
//!   subjects it always had, so a key's messages stay on one subject (and the old origin's
//!   subjects, still in use if it comes back, are never captured).
//!
//! The stored subjects name the bucket as it was first created (`stored`), read from its
//! `~init` marker. `<bucket>-meta` goes with the stream: a mirror of the origin's meta bucket on
//! a copy, promoted together with it.

use super::marker::{own_marker, wait_for_marker};
use super::origin::{DEDUPE_WINDOW, Origin, stream_name};
use super::setup::Final;
use crate::config::NatsConfig;
use anyhow::{Context as _, anyhow, bail};
use async_nats::jetstream::{self, context::GetStreamErrorKind, kv, stream};

/// The streams of an opened bucket.
pub(super) struct Opened {
    pub stream: stream::Stream,
    pub info: stream::Info,
    pub meta: kv::Store,
    /// The bucket name the stored subjects carry.
    pub stored: String,
    /// When the bucket was created (its marker's time, unix nanoseconds; kept by mirrors): tells
    /// one bucket from another of the same name.
    pub birth: i64,
    /// What the bucket mirrors (a read-only copy), or mirrored before a promotion.
    pub origin: Option<Origin>,
    /// The bucket is a mirror now.
    pub copy: bool,
}

/// Opens `KV_<bucket>` and `<bucket>-meta`, creating them if missing: a bucket of its own, or
/// with `mirror=` a read-only copy. `read_only`: nothing is created or changed, and a bucket
/// that is missing or was never written is an error.
pub(super) async fn open(js: &jetstream::Context, cfg: &NatsConfig, read_only: bool) -> anyhow::Result<Opened> {
    let name = stream_name(&cfg.bucket);
    let mut stream = match js.get_stream(&name).await {
        Ok(s) => s,
        Err(e) if not_found(&e) && read_only => {
            return Err(Final(format!(
                "no bucket {} on this NATS server (stream {name} not found): nothing to read (?bucket=NAME names \
                 another)",
                cfg.bucket
            ))
            .into());
        }
        Err(e) if not_found(&e) => match &cfg.mirror {
            Some(origin) => create_mirror(js, cfg, &Origin::wanted(origin, &cfg.mirror_source)).await?,
            None => create_bucket(js, cfg).await?,
        },
        Err(e) => bail!("read stream {name}: {e}"),
    };
    let info = stream.info().await.with_context(|| format!("read stream {name}"))?.clone();
    let copy = info.config.mirror.is_some();
    let origin = match &info.config.mirror {
        Some(source) => Some(check_mirror(cfg, source)?),
        None => {
            if let Some(wanted) = &cfg.mirror {
                bail!(
                    "bucket {} exists and is not a mirror (a bucket of its own, or a copy promoted already), so it \
                     cannot be a read-only copy of {wanted}; remove mirror= to serve it, or copy into another bucket",
                    cfg.bucket
                );
            }
            None
        }
    };
    let (stored, birth) = match &origin {
        Some(origin) => wait_for_marker(js, &stream, &cfg.bucket, origin).await?,
        None => own_marker(js, &stream, cfg, &info, read_only).await?,
    };
    let meta = open_meta(js, cfg, &stored, copy.then_some(origin.as_ref()).flatten(), read_only).await?;
    let limit = info.config.max_messages_per_subject.max(0);
    if copy && limit > 0 {
        tracing::warn!(
            stream = %name,
            history = limit,
            "this mirror keeps only the newest {limit} version(s) of each key: reads at older revisions and watches \
             from them fail as compacted (create the mirror with mirror= for a full copy)"
        );
    } else if !copy && limit != cfg.rev_history {
        tracing::warn!(
            stream = %name,
            stream_limit = limit,
            rev_history = cfg.rev_history,
            "the stream's per-key message limit differs from revHistory (0: none); the stream's is used"
        );
    }
    if !copy && !info.config.allow_atomic_publish {
        tracing::warn!(stream = %name, "atomic batch publish is off on this stream; writes that change several keys will fail");
    }
    if !copy && !read_only && info.config.duplicate_window > DEDUPE_WINDOW {
        shorten_dedupe_window(js, &info.config).await;
    }
    // A promoted copy remembers its origin (for the fence, `promote.rs`).
    let origin = match origin {
        Some(o) => Some(o),
        None => super::record::recorded_origin(&meta).await?,
    };
    Ok(Opened { stream, info, meta, stored, birth, origin, copy })
}

/// A bucket created before kine-rs set its own window (or by another tool) keeps the server's
/// default of 2 minutes: shortened, best effort.
async fn shorten_dedupe_window(js: &jetstream::Context, config: &stream::Config) {
    let mut config = config.clone();
    let before = config.duplicate_window;
    config.duplicate_window = DEDUPE_WINDOW;
    match js.update_stream(&config).await {
        Ok(_) => tracing::info!(
            stream = %config.name,
            before_s = before.as_secs(),
            now_s = DEDUPE_WINDOW.as_secs(),
            "shortened the stream's duplicate window (write ids kept in memory by the server)"
        ),
        Err(e) => tracing::warn!(
            stream = %config.name,
            error = %e,
            "cannot shorten the stream's duplicate window; the NATS server keeps every write's id for {}s",
            before.as_secs()
        ),
    }
}

fn not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

async fn create_bucket(js: &jetstream::Context, cfg: &NatsConfig) -> anyhow::Result<stream::Stream> {
    let name = stream_name(&cfg.bucket);
    let config = stream::Config {
        name: name.clone(),
        subjects: vec![format!("$KV.{}.>", cfg.bucket)],
        max_messages_per_subject: if cfg.rev_history > 0 { cfg.rev_history } else { -1 },
        allow_rollup: true,
        allow_direct: true,
        allow_atomic_publish: true,
        duplicate_window: DEDUPE_WINDOW,
        num_replicas: cfg.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    // A cluster that is still forming answers "no suitable peers" for a while (`patiently`).
    js.create_stream(config).await.map_err(|e| anyhow!("create stream {name}: {e}"))
}

/// Creates `KV_<bucket>` and `KV_<bucket>-meta` as mirrors of the origin's two streams.
async fn create_mirror(js: &jetstream::Context, cfg: &NatsConfig, origin: &Origin) -> anyhow::Result<stream::Stream> {
    let name = stream_name(&cfg.bucket);
    let config = stream::Config {
        name: name.clone(),
        description: Some(format!("kine-rs read-only copy of {}", origin.describe())),
        mirror: Some(origin.source(origin.stream.clone())),
        max_messages_per_subject: if cfg.rev_history > 0 { cfg.rev_history } else { -1 },
        num_replicas: cfg.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    let stream = js.create_stream(config).await.map_err(|e| anyhow!("create the mirror {name}: {e}"))?;
    tracing::info!(stream = %name, origin = %origin.describe(), "created a mirror for a read-only copy");
    Ok(stream)
}

/// A mirror serves as a copy only if it mirrors a whole kine-rs bucket (and, with `mirror=`, the
/// one named there).
fn check_mirror(cfg: &NatsConfig, source: &stream::Source) -> anyhow::Result<Origin> {
    let origin = Origin::from_source(source);
    let name = stream_name(&cfg.bucket);
    if !source.name.starts_with("KV_") {
        bail!("stream {name} mirrors {}, which is not a kine-rs bucket (no KV_ prefix)", origin.describe());
    }
    if source.filter_subject.as_deref().is_some_and(|f| !f.is_empty()) || !source.subject_transforms.is_empty() {
        bail!(
            "stream {name} mirrors only part of {} (a filter or transform): a copy needs all of it",
            origin.describe()
        );
    }
    if let Some(wanted) = &cfg.mirror {
        let wanted = Origin::wanted(wanted, &cfg.mirror_source);
        if wanted != origin {
            bail!(
                "stream {name} is a mirror of {}, not of {} as the endpoint's mirror= asks; use another bucket",
                origin.describe(),
                wanted.describe()
            );
        }
    }
    Ok(origin)
}

/// `<bucket>-meta`: a mirror of the origin's on a copy (created if missing); otherwise a KV bucket
/// of its own, created if missing, or finished promoting if a promotion stopped half-way.
async fn open_meta(
    js: &jetstream::Context,
    cfg: &NatsConfig,
    stored: &str,
    copy_of: Option<&Origin>,
    read_only: bool,
) -> anyhow::Result<kv::Store> {
    let name = format!("{}-meta", cfg.bucket);
    let stream_name = stream_name(&name);
    let existing = match js.get_stream(&stream_name).await {
        Ok(s) => Some(s),
        Err(e) if not_found(&e) => None,
        Err(e) => bail!("read stream {stream_name}: {e}"),
    };
    let mut stream = match (existing, copy_of) {
        (Some(s), _) => s,
        (None, _) if read_only => {
            return Err(Final(format!(
                "bucket {} has no {name} bucket (its compact revision and leases): not a kine-rs store, or one \
                 still being created",
                cfg.bucket
            ))
            .into());
        }
        (None, Some(origin)) => {
            let config = stream::Config {
                name: stream_name.clone(),
                description: Some(format!("kine-rs read-only copy of {}-meta", origin.describe())),
                mirror: Some(origin.source(format!("{}-meta", origin.stream))),
                max_messages_per_subject: 1,
                num_replicas: cfg.replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            };
            js.create_stream(config).await.map_err(|e| anyhow!("create the mirror {stream_name}: {e}"))?
        }
        (None, None) => {
            js.create_key_value(kv::Config {
                bucket: name.clone(),
                description: "kine-rs compact revision and leases".into(),
                history: 1,
                num_replicas: cfg.replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("create KV bucket {name}: {e}"))?;
            js.get_stream(&stream_name).await.map_err(|e| anyhow!("read stream {stream_name}: {e}"))?
        }
    };
    let config = stream.info().await.with_context(|| format!("read stream {stream_name}"))?.config.clone();
    match (&config.mirror, copy_of) {
        (Some(source), Some(origin)) => {
            let found = Origin::from_source(source);
            let expected = Origin { stream: format!("{}-meta", origin.stream), api: origin.api.clone() };
            if found != expected {
                bail!(
                    "stream {stream_name} mirrors {}, not {}: the copy's meta bucket must mirror its origin's",
                    found.describe(),
                    expected.describe()
                );
            }
        }
        (None, Some(origin)) => bail!(
            "stream {stream_name} is not a mirror of {}-meta although {} mirrors {}; delete {stream_name} so that \
             kine-rs creates the mirror",
            origin.stream,
            self::stream_name(&cfg.bucket),
            origin.describe()
        ),
        (Some(_), None) if read_only => {
            tracing::warn!(stream = %stream_name, "the meta bucket's promotion was interrupted; read as it is");
        }
        (Some(_), None) => {
            // The bucket's stream was promoted but its meta bucket not yet: finish.
            tracing::warn!(stream = %stream_name, "finishing an interrupted promotion of the meta bucket");
            promote_stream(js, config, &name, &format!("{stored}-meta"), false).await?;
            stream = js.get_stream(&stream_name).await.map_err(|e| anyhow!("read stream {stream_name}: {e}"))?;
        }
        (None, None) => {}
    }
    Ok(kv::Store {
        name: name.clone(),
        stream_name,
        prefix: format!("$KV.{stored}-meta."),
        // Writes on `$KV.<bucket>-meta.…`: a promoted meta bucket stores them under its old name.
        put_prefix: (stored != cfg.bucket).then(|| format!("$KV.{name}.")),
        use_jetstream_prefix: false,
        stream,
    })
}

/// Removes the mirror configuration of a stream: writes on `$KV.<name>.>` are stored as
/// `$KV.<stored>.>`. `bucket_stream`: the bucket's stream (atomic batches), else a meta bucket.
pub(super) async fn promote_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    name: &str,
    stored: &str,
    bucket_stream: bool,
) -> anyhow::Result<()> {
    if config.mirror.is_none() {
        return Ok(());
    }
    let write = format!("$KV.{name}.>");
    config.mirror = None;
    config.mirror_direct = false;
    config.subjects = vec![write.clone()];
    config.subject_transform =
        (name != stored).then(|| stream::SubjectTransform { source: write, destination: format!("$KV.{stored}.>") });
    config.allow_direct = true;
    config.allow_rollup = true;
    config.allow_atomic_publish = bucket_stream;
    if bucket_stream {
        config.duplicate_window = DEDUPE_WINDOW;
    }
    js.update_stream(&config)
        .await
        .map_err(|e| anyhow!("promote stream {}: {e} (nats-server 2.12 or newer?)", config.name))?;
    tracing::info!(stream = %config.name, "the mirror is a stream of its own now");
    Ok(())
}
