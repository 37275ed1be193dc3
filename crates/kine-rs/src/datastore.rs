//! Flags → datastore: the backend the `--endpoint` names, opened with its flags (pool, TLS),
//! and the NATS server embedded in this process when the endpoint asks for it.

use crate::cli::Cli;
use crate::endpoint::{self, Endpoint};
use anyhow::{Context, Result, bail};
use kine_core::backend::Backend;
use kine_core::shutdown::Shutdown;
use std::sync::Arc;

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

/// A datastore's refusal of data kine-rs does not own (`kine_core::foreign`, found by the
/// backend before it created or wrote anything), as people read it: the flag and the endpoint
/// (password hidden), what was found, and what to do instead. Other errors are returned as
/// they are.
pub(crate) fn explain_foreign(flag: &str, endpoint: &str, error: anyhow::Error) -> anyhow::Error {
    use kine_core::foreign::{Foreign, ForeignKind};
    let Some(foreign) = Foreign::find(&error) else { return error };
    let url = if endpoint.is_empty() {
        format!("sqlite://{}", endpoint::DEFAULT_SQLITE_PATH)
    } else {
        endpoint::shown(endpoint)
    };
    let what = if endpoint.is_empty() { format!("{flag} \"\" ({url})") } else { format!("{flag} {url}") };
    let todo = match foreign.kind {
        ForeignKind::GoKine => format!(
            ". kine-rs does not serve Go kine's data, nor create its own store beside it; convert it into a new \
             datastore with: kine-rs migrate --from {} --to <a new datastore> (docs/operations.md, \"Moving to \
             kine-rs\")",
            shell_word(&url)
        ),
        ForeignKind::Etcd => {
            ". kine-rs does not serve etcd's files; `kine-rs snapshot restore` takes an etcd member's \
             member/snap/db into a new SQLite database: kine-rs snapshot restore <etcd data dir>/member/snap/db \
             --endpoint sqlite://<a new file> (README, \"Backups\")"
                .to_string()
        }
        ForeignKind::Other => String::new(),
    };
    let text = format!("{what}: {}{todo}", foreign.found);
    anyhow::Error::new(kine_core::foreign::Explained { text, foreign: foreign.clone() })
}

/// `text` as one shell word (in single quotes when it holds anything a shell would read).
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/:._-@,=+%".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
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

pub(crate) async fn open_backend(cli: &Cli, stop: &Shutdown) -> Result<(Arc<dyn Backend>, Embedded)> {
    if !cli.endpoint.starts_with("postgres") && !cli.endpoint.starts_with("mysql") {
        let name = cli.endpoint.split("://").next().filter(|s| !s.is_empty()).unwrap_or("sqlite");
        pool_flags_unused(cli, name);
    }
    let foreign = |e: anyhow::Error| explain_foreign("--endpoint", &cli.endpoint, e);
    Ok(match endpoint::parse(&cli.endpoint).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } => {
            no_datastore_tls(cli, "sqlite")?;
            let options = kine_backend_sql::SqliteOptions { path: path.clone() };
            let backend = kine_backend_sql::SqliteBackend::open(options).map_err(|e| {
                if kine_core::foreign::Foreign::find(&e).is_some() {
                    foreign(e)
                } else {
                    e.context(format!("--endpoint: cannot open SQLite database {}", path.display()))
                }
            })?;
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
                .context("open PostgreSQL")?
                .map_err(foreign)?;
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
                .context("open MySQL")?
                .map_err(foreign)?;
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
                    return Err(match kine_core::foreign::Foreign::find(&e) {
                        Some(_) => foreign(e),
                        None => e.context("--endpoint: cannot open the NATS bucket"),
                    });
                }
            }
        }
    })
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
