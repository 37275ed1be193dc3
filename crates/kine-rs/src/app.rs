//! Wiring: flags → backend → store → gRPC server, and the shutdown order.
//!
//! Shutdown order (on SIGINT/SIGTERM): stop accepting and end every stream (one shared
//! shutdown signal), wait for in-flight requests (bounded), stop background tasks, close the
//! backend (the SQLite writer finishes queued writes and checkpoints), remove the unix socket.

use crate::cli::Cli;
use crate::datastore::{open_backend, shutdown_embedded};
use crate::listen;
use anyhow::{Context, Result, bail};
use kine_core::auth::AuthOptions;
use kine_core::backend::Backend;
use kine_core::compactor::CompactOptions;
use kine_core::members::Identity as MemberIdentity;
use kine_core::shutdown::{self, Shutdown, ShutdownTrigger};
use kine_core::store::{Store, StoreOptions};
use std::sync::Arc;
use std::time::Duration;

/// How long each background task may take to stop once shutdown starts.
const TASK_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long in-flight requests may take to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

fn server_tls(cli: &Cli) -> Result<Option<kine_server::Tls>> {
    match (&cli.server_cert_file, &cli.server_key_file) {
        (None, None) => {
            if cli.trusted_ca_file.is_some() {
                bail!(
                    "--trusted-ca-file needs --server-cert-file and --server-key-file (client certificates are only checked over TLS)"
                );
            }
            Ok(None)
        }
        (Some(_), None) => bail!("--server-cert-file is set but --server-key-file is not"),
        (None, Some(_)) => bail!("--server-key-file is set but --server-cert-file is not"),
        (Some(cert), Some(key)) => {
            let ca = cli.trusted_ca_file.as_deref();
            let config = crate::tls_config::etcd(cert, key, ca)?;
            let explainer =
                kine_server::tls::Explainer::new(cert.display().to_string(), ca.map(|ca| ca.display().to_string()));
            Ok(Some(kine_server::Tls { config, explainer: Arc::new(explainer) }))
        }
    }
}

/// Runs kine-rs until `stop` fires. Returns once everything is shut down.
pub async fn run(cli: Cli, trigger: ShutdownTrigger, stop: Shutdown) -> Result<()> {
    let address = listen::parse(&cli.listen_address)?;
    let tls = server_tls(&cli)?;
    // The etcd port is taken first: a busy port fails before the datastore starts, and an
    // embedded NATS server picking a random port can never take it. Connections wait in the
    // backlog until the store is ready (as with etcd).
    let bound = listen::bind(&address, tls.is_some()).await?;
    // The metrics port likewise (a busy one stops start-up, as kine's does).
    let metrics_listener = match crate::metrics_http::address(&cli.metrics_bind_address)? {
        Some(addr) => Some(crate::metrics_http::bind(&addr).await?),
        None => None,
    };
    let metrics_tls = match (&cli.server_cert_file, &cli.server_key_file, &metrics_listener) {
        (Some(cert), Some(key), Some(_)) if !cli.metrics_ignore_tls_config => {
            Some(crate::metrics_http::tls(cert, key)?)
        }
        _ => None,
    };
    if cli.metrics_enable_profiling {
        tracing::warn!(
            "--metrics-enable-profiling: kine-rs has no Go profiler endpoints; use perf or valgrind instead"
        );
    }
    let remove_socket = |socket: &Option<std::path::PathBuf>| {
        if let Some(path) = socket {
            let _ = std::fs::remove_file(path);
        }
    };
    let (backend, embedded) = match open_backend(&cli, &stop).await {
        Ok(v) => v,
        Err(e) => {
            remove_socket(&bound.socket_path);
            if stop.is_triggered() {
                tracing::info!("kine-rs stopped during start-up");
                return Ok(());
            }
            return Err(e);
        }
    };
    // S3 durability: the bucket and the database brought together (a restore into an empty
    // one) before anything is served; or, while another node holds the writer lock, a
    // read-only copy of the bucket's store served until this node takes over.
    let (backend, s3) = match crate::s3::attach(&cli, backend, &bound.client_url, &stop, &trigger).await {
        Ok(Some(attached)) => attached,
        other => {
            remove_socket(&bound.socket_path);
            return other.map(|_| tracing::info!("kine-rs stopped during start-up"));
        }
    };
    let store_options = StoreOptions {
        watch_progress_interval: cli.watch_progress_notify_interval,
        compact: CompactOptions {
            interval: cli.compact_interval,
            min_retain: cli.compact_min_retain,
            batch_size: cli.compact_batch_size,
            timeout: cli.compact_timeout,
        },
        auth: AuthOptions {
            bcrypt_cost: cli.bcrypt_cost,
            token_ttl: Duration::from_secs(cli.auth_token_ttl),
            tokens: cli.auth_token.clone(),
        },
        identity: MemberIdentity { name: cli.name.clone(), client_urls: vec![bound.client_url.clone()] },
    };
    let backend: Arc<dyn Backend> = Arc::new(
        kine_core::metered::Metered::new(backend, cli.slow_sql_threshold, cli.slow_sql_warning_threshold)
            .with_timeout(cli.request_timeout),
    );
    kine_core::range::set_max_response_bytes(cli.max_response_bytes as usize);
    let store = match Store::open(backend.clone(), store_options).await.context("load leases") {
        Ok(store) => store,
        Err(e) => {
            backend.close().await;
            shutdown_embedded(embedded).await;
            remove_socket(&bound.socket_path);
            return Err(e);
        }
    };
    // This node is listed (MemberList, other nodes, `kine-rs migrate`'s check that a target is
    // not served) from the moment it says it is ready; the heartbeat task refreshes the record.
    if let Err(e) = store.members().announce().await {
        tracing::warn!(error = %e, "cannot store this node's member record yet");
    }
    let mut tasks = store.spawn_tasks(&stop);
    let (s3_failure, s3_stop) = match s3 {
        Some(running) => {
            tasks.push(running.task);
            (Some(running.failure), Some(running.stop))
        }
        None => (None, None),
    };
    let revision = store.current_revision().await?;
    let m = kine_core::metrics::metrics();
    m.build_info.with_label_values(&[crate::version::VERSION, crate::version::COMMIT, crate::version::FEATURES]).set(1);
    m.server_version.with_label_values(&[cli.emulated_etcd_version.as_str()]).set(1);
    let health = kine_server::HealthReporter::new();
    tasks.push(tokio::spawn(crate::metrics_http::follow_grpc_health(store.clone(), health.clone(), stop.clone())));
    let metrics_address = match metrics_listener {
        Some(listener) => {
            let shown = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
            let scheme = if metrics_tls.is_some() { "https" } else { "http" };
            tasks.push(tokio::spawn(crate::metrics_http::serve(listener, metrics_tls, store.clone(), stop.clone())));
            format!("{scheme}://{shown}")
        }
        None => "off".to_string(),
    };
    // The certificate and the CA clients must be signed by, as given (kube-apiserver's
    // --etcd-cafile must hold the CA that signed the first).
    let tls_shown = match &tls {
        None => "off".to_string(),
        Some(t) => format!(
            "certificate {}, client certificates {}",
            t.explainer.server_cert,
            t.explainer.client_ca.as_deref().map_or("not asked for".to_string(), |ca| format!("signed by {ca}"))
        ),
    };
    tracing::info!(
        backend = backend.name(),
        revision,
        listen = %bound.description,
        tls = %tls_shown,
        metrics = %metrics_address,
        version = crate::version::LONG,
        "kine-rs ready: etcd clients connect to {}",
        bound.client_url
    );
    crate::notify::notify("READY=1");
    let config = kine_server::ServerConfig {
        max_request_bytes: cli.max_request_bytes as usize,
        emulated_version: cli.emulated_etcd_version.clone(),
        client_cert_auth: cli.trusted_ca_file.is_some(),
        snapshot_format: snapshot_format(),
    };
    let server = tokio::spawn(kine_server::serve(store.clone(), config, bound.listener, tls, health, stop.clone()));
    let mut stop_wait = stop.clone();
    let mut server = server;
    // A stop also ends the server: the stop is looked at first, so that a shutdown always
    // drains (and says so) rather than passing for a server that ended on its own.
    let served = tokio::select! {
        biased;
        _ = stop_wait.wait() => None,
        r = &mut server => Some(r),
    };
    let result = match served {
        // The server ended on its own: an error.
        Some(r) => {
            trigger.trigger();
            match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("gRPC server failed")),
                Err(e) => Err(anyhow::anyhow!("gRPC server task failed: {e}")),
            }
        }
        None => {
            tracing::info!("shutting down: draining requests");
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!("requests still running after {DRAIN_TIMEOUT:?}; closing anyway");
                    server.abort();
                }
            }
            Ok(())
        }
    };
    if let Some(stop) = s3_stop {
        let _ = stop.send(());
    }
    // Background tasks stop at the shutdown signal; one stuck on an unreachable datastore
    // must not hold the process.
    for mut task in tasks {
        if tokio::time::timeout(TASK_STOP_TIMEOUT, &mut task).await.is_err() {
            tracing::warn!("a background task did not stop within {TASK_STOP_TIMEOUT:?}; aborting it");
            task.abort();
        }
    }
    backend.close().await;
    shutdown_embedded(embedded).await;
    remove_socket(&bound.socket_path);
    tracing::info!("kine-rs stopped");
    if let Some(failure) = s3_failure.and_then(|f| f.lock().unwrap_or_else(|p| p.into_inner()).take()) {
        return Err(failure.context("S3 shipping stopped"));
    }
    result
}

pub fn shutdown_channel() -> (ShutdownTrigger, Shutdown) {
    shutdown::channel()
}

/// Snapshots are etcd's bbolt files when the Go shim (and with it bbolt) is built in.
#[cfg(feature = "embedded-nats")]
fn snapshot_format() -> Option<std::sync::Arc<dyn kine_core::snapshot::Format>> {
    Some(std::sync::Arc::new(crate::etcd_snapshot::Etcd))
}

/// Without the Go shim there is no bbolt: snapshots are kine-rs's own format.
#[cfg(not(feature = "embedded-nats"))]
fn snapshot_format() -> Option<std::sync::Arc<dyn kine_core::snapshot::Format>> {
    None
}
