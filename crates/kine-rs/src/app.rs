//! Wiring: flags → backend → store → gRPC server, and the shutdown order.
//!
//! Shutdown order (on SIGINT/SIGTERM): stop accepting and end every stream (one shared
//! shutdown signal), wait for in-flight requests (bounded), stop background tasks, close the
//! backend (the SQLite writer finishes queued writes and checkpoints), remove the unix socket.

use crate::cli::Cli;
use crate::endpoint::{self, Endpoint};
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
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// How long each background task may take to stop once shutdown starts.
const TASK_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long in-flight requests may take to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Refuses datastore TLS flags for a datastore that has no network connection.
fn no_datastore_tls(cli: &Cli, kind: &str) -> Result<()> {
    let flags = [
        ("--ca-file", cli.ca_file.is_some()),
        ("--cert-file", cli.cert_file.is_some()),
        ("--key-file", cli.key_file.is_some()),
        ("--skip-verify", cli.skip_verify),
    ];
    let given: Vec<&str> = flags.iter().filter(|(_, set)| *set).map(|(name, _)| *name).collect();
    if !given.is_empty() {
        bail!("{} configure TLS to a network datastore; the {kind} endpoint has none", given.join(", "));
    }
    Ok(())
}

/// A running embedded NATS server, or nothing (feature off, or another datastore).
#[cfg(feature = "embedded-nats")]
pub(crate) type Embedded = Option<crate::embedded::Embedded>;
#[cfg(not(feature = "embedded-nats"))]
pub(crate) type Embedded = Option<std::convert::Infallible>;

pub(crate) async fn shutdown_embedded(embedded: Embedded) {
    #[cfg(feature = "embedded-nats")]
    if let Some(e) = embedded {
        e.shutdown().await;
    }
    #[cfg(not(feature = "embedded-nats"))]
    let _ = embedded;
}

/// The embedded server, which answers the NATS backend's read barriers in-process.
#[cfg(feature = "embedded-nats")]
pub(crate) fn local_server(embedded: &Embedded) -> Option<Arc<dyn kine_backend_nats::LocalServer>> {
    embedded.as_ref().map(crate::embedded::Embedded::local)
}
#[cfg(not(feature = "embedded-nats"))]
pub(crate) fn local_server(_: &Embedded) -> Option<Arc<dyn kine_backend_nats::LocalServer>> {
    None
}

#[cfg(feature = "embedded-nats")]
pub(crate) async fn start_embedded(
    config: kine_backend_nats::config::NatsConfig,
    max_request_bytes: usize,
    stop: &Shutdown,
) -> Result<(Embedded, kine_backend_nats::config::NatsConfig)> {
    if !endpoint::wants_embedded(&config) {
        return Ok((None, config));
    }
    let (embedded, config) = crate::embedded::start(config, max_request_bytes, stop).await?;
    Ok((Some(embedded), config))
}

#[cfg(not(feature = "embedded-nats"))]
pub(crate) async fn start_embedded(
    config: kine_backend_nats::config::NatsConfig,
    _max_request_bytes: usize,
    _stop: &Shutdown,
) -> Result<(Embedded, kine_backend_nats::config::NatsConfig)> {
    Ok((None, config))
}

/// kine's `--datastore-*` pool flags, in kine's meanings.
pub(crate) fn pool_options(cli: &Cli) -> kine_backend_sql::PoolOptions {
    let some = |d: std::time::Duration| (!d.is_zero()).then_some(d);
    let max_idle = match cli.datastore_max_idle_connections {
        0 => 20,
        n if n < 0 => 0,
        n => n as usize,
    };
    kine_backend_sql::PoolOptions {
        max_idle,
        // By default no more than are kept idle (none opened and closed per request); no limit
        // when asked for, or when nothing is kept idle.
        max_open: match cli.datastore_max_open_connections {
            0 => (max_idle > 0).then_some(max_idle),
            n if n < 0 => None,
            n => Some(n as usize),
        },
        max_lifetime: some(cli.datastore_connection_max_lifetime),
        max_idle_time: some(cli.datastore_connection_max_idle_time),
    }
}

/// The pool flags mean nothing to datastores without a connection pool: say so once.
fn pool_flags_unused(cli: &Cli, backend: &str) {
    let set = cli.datastore_max_idle_connections != 0
        || cli.datastore_max_open_connections != 0
        || !cli.datastore_connection_max_lifetime.is_zero()
        || cli.datastore_connection_max_idle_time != std::time::Duration::from_secs(120);
    if set {
        tracing::warn!("the --datastore-* connection pool flags have no effect with {backend} (it has no pool)");
    }
}

/// kine's datastore TLS flags, for the SQL databases.
pub(crate) fn sql_tls(cli: &Cli) -> kine_backend_sql::TlsFiles {
    kine_backend_sql::TlsFiles {
        ca_file: cli.ca_file.clone(),
        cert_file: cli.cert_file.clone(),
        key_file: cli.key_file.clone(),
        skip_verify: cli.skip_verify,
    }
}

async fn open_backend(cli: &Cli, stop: &Shutdown) -> Result<(Arc<dyn Backend>, Embedded)> {
    if !cli.endpoint.starts_with("postgres") && !cli.endpoint.starts_with("mysql") {
        let name = cli.endpoint.split("://").next().filter(|s| !s.is_empty()).unwrap_or("sqlite");
        pool_flags_unused(cli, name);
    }
    Ok(match endpoint::parse(&cli.endpoint).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } => {
            no_datastore_tls(cli, "sqlite")?;
            let options = kine_backend_sql::SqliteOptions { path: path.clone() };
            let backend = kine_backend_sql::SqliteBackend::open(options)
                .with_context(|| format!("--endpoint: cannot open SQLite database {}", path.display()))?;
            (Arc::new(backend), None)
        }
        Endpoint::Memory => {
            no_datastore_tls(cli, "memory")?;
            (Arc::new(kine_core::memory::MemoryBackend::new()), None)
        }
        Endpoint::Postgres { url } => {
            let options = kine_backend_sql::PostgresOptions {
                url,
                pool: pool_options(cli),
                tls: sql_tls(cli),
                stop: Some(stop.clone()),
            };
            // Connecting blocks (the synchronous PostgreSQL client runs its own runtime).
            let backend = tokio::task::spawn_blocking(move || kine_backend_sql::PostgresBackend::open(options))
                .await
                .context("open PostgreSQL")??;
            (Arc::new(backend), None)
        }
        Endpoint::Mysql { url } => {
            let options = kine_backend_sql::MysqlOptions {
                url,
                pool: pool_options(cli),
                tls: sql_tls(cli),
                stop: Some(stop.clone()),
            };
            let backend = tokio::task::spawn_blocking(move || kine_backend_sql::MysqlBackend::open(options))
                .await
                .context("open MySQL")??;
            (Arc::new(backend), None)
        }
        Endpoint::Nats(config) => {
            if cli.skip_verify {
                bail!("--skip-verify is not supported with nats:// (give the server's CA with --ca-file)");
            }
            let tls = kine_backend_nats::connect::ClientTls {
                ca_file: cli.ca_file.clone(),
                cert_file: cli.cert_file.clone(),
                key_file: cli.key_file.clone(),
            };
            let max_request_bytes = cli.max_request_bytes as usize;
            let (embedded, config) = start_embedded(*config, max_request_bytes, stop).await?;
            let local = local_server(&embedded);
            let values_dir = Some(kine_backend_nats::values_dir::values_dir());
            let options =
                kine_backend_nats::NatsOptions { config, tls, max_request_bytes, local, read_only: false, values_dir };
            // Opening waits for NATS (connection, a forming cluster, loading the bucket): a
            // shutdown signal ends the wait.
            let mut stop = stop.clone();
            let opened = tokio::select! {
                r = kine_backend_nats::NatsBackend::open(options) => r,
                _ = stop.wait() => Err(anyhow::anyhow!("stopped while opening the NATS bucket")),
            };
            match opened {
                Ok(backend) => (Arc::new(backend), embedded),
                Err(e) => {
                    shutdown_embedded(embedded).await;
                    return Err(e.context("--endpoint: cannot open the NATS bucket"));
                }
            }
        }
    })
}

fn server_tls(cli: &Cli) -> Result<Option<ServerTlsConfig>> {
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))
    };
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
            let mut tls = ServerTlsConfig::new()
                .identity(Identity::from_pem(read("--server-cert-file", cert)?, read("--server-key-file", key)?));
            if let Some(ca) = &cli.trusted_ca_file {
                tls = tls.client_ca_root(Certificate::from_pem(read("--trusted-ca-file", ca)?));
            }
            Ok(Some(tls))
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
    tracing::info!(
        backend = backend.name(),
        revision,
        listen = %bound.description,
        tls = tls.is_some(),
        metrics = %metrics_address,
        version = crate::version::LONG,
        "kine-rs ready: etcd clients connect to {}",
        bound.client_url
    );
    let config = kine_server::ServerConfig {
        max_request_bytes: cli.max_request_bytes as usize,
        emulated_version: cli.emulated_etcd_version.clone(),
        client_cert_auth: cli.trusted_ca_file.is_some(),
        snapshot_format: snapshot_format(),
    };
    let server = tokio::spawn(kine_server::serve(store.clone(), config, bound.listener, tls, health, stop.clone()));
    let mut stop_wait = stop.clone();
    let mut server = server;
    let served = tokio::select! {
        r = &mut server => Some(r),
        _ = stop_wait.wait() => None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn pool(args: &[&str]) -> kine_backend_sql::PoolOptions {
        pool_options(&Cli::try_parse_from(std::iter::once("kine-rs").chain(args.iter().copied())).unwrap())
    }

    #[test]
    fn pooled_connections_open_at_once_default_to_those_kept_idle() {
        let open = |p: kine_backend_sql::PoolOptions| p.max_open;
        assert_eq!(pool(&[]).max_idle, 20);
        assert_eq!(open(pool(&[])), Some(20));
        assert_eq!(open(pool(&["--datastore-max-idle-connections", "4"])), Some(4));
        assert_eq!(open(pool(&["--datastore-max-open-connections", "7"])), Some(7));
        assert_eq!(open(pool(&["--datastore-max-open-connections", "-1"])), None);
        let none_idle = pool(&["--datastore-max-idle-connections", "-1"]);
        assert_eq!((none_idle.max_idle, none_idle.max_open), (0, None));
    }
}
