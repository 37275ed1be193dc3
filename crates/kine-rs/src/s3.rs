//! `--s3-*`: the SQLite datastore kept in S3-compatible object storage as well (kine-durable):
//! restored from it into an empty database at start, shipped to it while served.

use crate::cli::s3::S3Args;
use anyhow::{Context, Result, bail};
use kine_core::backend::Backend;
use kine_durable::follow::Begun;
use kine_durable::node::Options;
use kine_objstore::{S3Config, S3Store, StaticKeys};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

impl S3Args {
    fn config(&self, bucket: &str) -> Result<S3Config> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let access_key = self.s3_access_key.clone().or_else(|| env("AWS_ACCESS_KEY_ID"));
        let secret_key = self.s3_secret_key.clone().or_else(|| env("AWS_SECRET_ACCESS_KEY"));
        let keys = match (access_key, secret_key) {
            (Some(access_key), Some(secret_key)) => Some(StaticKeys {
                access_key,
                secret_key,
                session_token: self.s3_session_token.clone().or_else(|| env("AWS_SESSION_TOKEN")),
            }),
            (None, None) if self.s3_session_token.is_some() => {
                bail!("--s3-session-token needs --s3-access-key and --s3-secret-key")
            }
            (None, None) => None,
            (Some(_), None) => bail!("--s3-access-key needs --s3-secret-key (or AWS_SECRET_ACCESS_KEY)"),
            (None, Some(_)) => bail!("--s3-secret-key needs --s3-access-key (or AWS_ACCESS_KEY_ID)"),
        };
        let ca_bundle = match &self.s3_ca_bundle {
            Some(path) => {
                Some(std::fs::read(path).with_context(|| format!("--s3-ca-bundle: cannot read {}", path.display()))?)
            }
            None => None,
        };
        if self.s3_lock_lease < Duration::from_secs(2) {
            bail!("--s3-lock-lease must be at least 2s");
        }
        Ok(S3Config {
            bucket: bucket.to_string(),
            folder: self.s3_folder.clone(),
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone().or_else(|| env("AWS_REGION")).unwrap_or_else(|| "us-east-1".into()),
            keys,
            ca_bundle,
        })
    }
}

/// What S3 durability runs: the shipping task, and its error if it ended with one.
pub struct Running {
    pub task: JoinHandle<()>,
    pub failure: Arc<Mutex<Option<anyhow::Error>>>,
    /// Stops shipping (after what is left): sent once the server stopped taking requests, so
    /// that every write it acknowledged is shipped.
    pub stop: tokio::sync::oneshot::Sender<()>,
}

/// With `--s3-bucket`: [`start`], else `backend` as it is. `None`: stopped meanwhile. On
/// failure `backend` is closed.
pub async fn attach(
    cli: &crate::cli::Cli,
    backend: Arc<dyn Backend>,
    address: &str,
    stop: &kine_core::shutdown::Shutdown,
    trigger: &kine_core::shutdown::ShutdownTrigger,
) -> Result<Option<(Arc<dyn Backend>, Option<Running>)>> {
    let Some(bucket) = &cli.s3.s3_bucket else { return Ok(Some((backend, None))) };
    let path = match crate::endpoint::parse(&cli.endpoint).map_err(anyhow::Error::msg)? {
        crate::endpoint::Endpoint::Sqlite { path } => Some(path),
        _ => None,
    };
    let mut stopping = stop.clone();
    let local = Local { backend: backend.clone(), path };
    let starting = start(&cli.s3, bucket, local, &cli.name, address, cli.request_timeout, trigger.clone());
    let started = tokio::select! {
        r = starting => Some(r),
        _ = stopping.wait() => None,
    };
    match started {
        Some(Ok((served, running))) => Ok(Some((served, Some(running)))),
        failed => {
            backend.close().await;
            failed.transpose().map(|_| None)
        }
    }
}

/// The local datastore: the backend opened on `--endpoint`, and its SQLite file.
pub struct Local {
    pub backend: Arc<dyn Backend>,
    pub path: Option<std::path::PathBuf>,
}

/// The local database as kine-durable keeps it: with its standby marker beside it, emptied by
/// closing it, removing its files and opening a new one.
fn standby(backend: Arc<dyn Backend>, path: std::path::PathBuf) -> kine_durable::standby::Standby {
    let marker = kine_durable::marker::path_for(&path);
    let reset: kine_durable::standby::Reset = Arc::new(move |old: Arc<dyn Backend>| {
        let path = path.clone();
        Box::pin(async move {
            old.close().await;
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let file = format!("{}{suffix}", path.display());
                match std::fs::remove_file(&file) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => bail!("cannot remove {file}: {err}"),
                    _ => {}
                }
            }
            let options = kine_backend_sql::SqliteOptions { path: path.clone() };
            let opened = kine_backend_sql::SqliteBackend::open(options)
                .with_context(|| format!("cannot open SQLite database {}", path.display()))?;
            Ok(Arc::new(opened) as Arc<dyn Backend>)
        })
    });
    kine_durable::standby::Standby::new(backend, marker, reset)
}

/// Brings the local database (SQLite) and the bucket together (a restore into an empty
/// database), then returns the backend to serve and the shipping task, which stops when told
/// (shipping what is left) or, with an error and `trigger` pulled, once another node took the
/// lock.
pub async fn start(
    args: &S3Args,
    bucket: &str,
    local: Local,
    node_name: &str,
    address: &str,
    request_timeout: Duration,
    trigger: kine_core::shutdown::ShutdownTrigger,
) -> Result<(Arc<dyn Backend>, Running)> {
    let Local { backend, path } = local;
    let Some(path) = path.filter(|_| backend.name() == "sqlite") else {
        bail!("--s3-bucket works with the SQLite datastore (sqlite:// or the default), not {}", backend.name());
    };
    let config = args.config(bucket)?;
    let shown = format!("s3://{bucket}/{}", args.s3_folder);
    let store = Arc::new(S3Store::connect(&config).await.with_context(|| format!("--s3-bucket: {shown}"))?);
    let options = Options {
        ship_interval: args.s3_ship_interval,
        checkpoint_interval: args.s3_checkpoint_interval,
        checkpoint_segments: args.s3_checkpoint_segments,
        lease: args.s3_lock_lease,
        node: node_name.to_string(),
        address: address.to_string(),
        read_wait: request_timeout,
    };
    let begun = kine_durable::follow::begin(store, standby(backend, path), &options, args.s3_sync)
        .await
        .with_context(|| format!("--s3-bucket: {shown}"))?;
    let failure = Arc::new(Mutex::new(None));
    let failed = failure.clone();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let report = move |err: anyhow::Error| {
        tracing::error!(error = format!("{err:#}"), "S3 shipping stopped; kine-rs stops");
        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(err);
        trigger.trigger();
    };
    let (served, task): (Arc<dyn Backend>, _) = match begun {
        Begun::Writer(started) => {
            tracing::info!(
                target = %shown,
                sync = args.s3_sync,
                ship_interval = ?args.s3_ship_interval,
                revision = *started.handle.shipped.borrow(),
                "shipping the datastore to S3"
            );
            let served = Arc::new(kine_durable::backend::Durable::new(
                started.backend.clone(),
                started.handle.clone(),
                args.s3_sync,
                request_timeout,
            ));
            let task = tokio::spawn(async move {
                if let Err(err) = started.runner.run(async move { stopped.await.unwrap_or_default() }).await {
                    report(err);
                }
            });
            (served, task)
        }
        Begun::Following(following, follower) => {
            let task = tokio::spawn(async move {
                let mut stop = std::pin::pin!(async { (&mut stopped).await.unwrap_or_default() });
                let result = match follower.run(&mut stop).await {
                    Ok(Some(runner)) => runner.run(stop).await,
                    Ok(None) => Ok(()),
                    Err(err) => Err(err),
                };
                if let Err(err) = result {
                    report(err);
                }
            });
            (following, task)
        }
    };
    Ok((served, Running { task, failure, stop }))
}

/// `kine-rs s3-restore`: the bucket's store into a new SQLite database, up to `revision`. The
/// bucket is only read (no lock, no manifest change); the database must not exist, and none is
/// left behind when the restore fails.
pub async fn restore(cli: &crate::cli::Cli, revision: Option<i64>) -> Result<()> {
    let Some(bucket) = &cli.s3.s3_bucket else { bail!("s3-restore needs --s3-bucket (and --s3-folder …)") };
    let path = match crate::endpoint::parse(&cli.endpoint).map_err(anyhow::Error::msg)? {
        crate::endpoint::Endpoint::Sqlite { path } => path,
        _ => bail!("--endpoint: s3-restore writes a new SQLite database (sqlite://PATH)"),
    };
    if path.exists() {
        bail!("--endpoint: {} exists; s3-restore writes a new database and never over one", path.display());
    }
    let config = cli.s3.config(bucket)?;
    let shown = format!("s3://{bucket}/{}", cli.s3.s3_folder);
    let store = S3Store::connect(&config).await.with_context(|| format!("--s3-bucket: {shown}"))?;
    let backend = kine_backend_sql::SqliteBackend::open(kine_backend_sql::SqliteOptions { path: path.clone() })
        .with_context(|| format!("--endpoint: cannot create {}", path.display()))?;
    let started = std::time::Instant::now();
    let result = kine_durable::restore::restore(&store, &backend, revision).await;
    backend.close().await;
    match result {
        Ok(r) => {
            tracing::info!(
                from = %shown,
                database = %path.display(),
                revision = r.revision,
                checkpoint = ?r.checkpoint,
                segments = r.segments,
                versions = r.versions,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "restored from S3"
            );
            Ok(())
        }
        Err(e) => {
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            Err(e.context(format!("--s3-bucket: restore from {shown}")))
        }
    }
}
