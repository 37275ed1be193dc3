//! The datastore `kine-rs migrate` writes into: opened for writing (created if missing, as a
//! server would), and checked to be served by no kine-rs.

use super::e;
use crate::cli::Cli;
use crate::endpoint::{self, Endpoint};
use anyhow::{Context, Result, bail};
use kine_core::backend::Backend;
use kine_core::members::{Identity, Members};
use std::sync::Arc;

/// The target, with the embedded NATS server it is written through, if any.
pub struct Target {
    pub backend: Arc<dyn Backend>,
    embedded: crate::datastore::Embedded,
    /// A NATS bucket: revisions are stream sequences (`to_nats.rs`).
    pub nats: bool,
}

impl Target {
    pub async fn close(self) {
        self.backend.close().await;
        crate::datastore::shutdown_embedded(self.embedded).await;
    }
}

/// The target, opened for writing (created if missing, as a server would).
pub async fn open(to: &str, cli: &Cli) -> Result<Target> {
    let pool = kine_backend_sql::PoolOptions { max_idle: 2, max_open: Some(2), ..crate::datastore::pool_options(cli) };
    let tls = crate::datastore::sql_tls(cli);
    let sql = |backend: Arc<dyn Backend>| Target { backend, embedded: None, nats: false };
    Ok(match endpoint::parse_as("--to", to).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } => {
            sql(Arc::new(kine_backend_sql::SqliteBackend::open(kine_backend_sql::SqliteOptions { path })?))
        }
        Endpoint::Postgres { url } => {
            let options = kine_backend_sql::PostgresOptions { url, pool, tls, stop: None };
            sql(Arc::new(tokio::task::spawn_blocking(move || kine_backend_sql::PostgresBackend::open(options)).await??))
        }
        Endpoint::Mysql { url } => {
            let options = kine_backend_sql::MysqlOptions { url, pool, tls, stop: None };
            sql(Arc::new(tokio::task::spawn_blocking(move || kine_backend_sql::MysqlBackend::open(options)).await??))
        }
        Endpoint::Memory => bail!("memory:// keeps nothing: there is no point copying into it"),
        Endpoint::Nats(config) => open_nats(to, *config, cli).await?,
    })
}

/// A NATS bucket, through the servers the URL names (`noEmbed`), or through an embedded server
/// started on `dataDir` (created if missing), listening on loopback on a random port with a
/// token only this process knows, shut down after the copy.
async fn open_nats(to: &str, mut config: kine_backend_nats::config::NatsConfig, cli: &Cli) -> Result<Target> {
    if cli.skip_verify {
        bail!("--skip-verify is not supported with nats:// (give the server's CA with --ca-file)");
    }
    if endpoint::wants_embedded(&config) {
        if let Some(file) = &config.server_config {
            bail!(
                "serverConfig {}: kine-rs migrate starts an embedded NATS server on a store of its own only without a \
                 config file (a cluster's bucket is written through one of its servers: nats://HOST:PORT?noEmbed)",
                file.display()
            );
        }
        config.servers.clear();
        config.credentials = kine_backend_nats::config::Credentials::None;
    }
    let tls = kine_backend_nats::connect::ClientTls {
        ca_file: cli.ca_file.clone(),
        cert_file: cli.cert_file.clone(),
        key_file: cli.key_file.clone(),
    };
    let max_request_bytes = cli.max_request_bytes as usize;
    let (_trigger, stop) = crate::app::shutdown_channel();
    let (embedded, config) = crate::datastore::start_embedded(config, max_request_bytes, &stop)
        .await
        .map_err(|err| anyhow::anyhow!("{}", format!("{err:#}").replacen("--endpoint: ", "", 1)))?;
    let local = crate::datastore::local_server(&embedded);
    let values_dir = Some(kine_backend_nats::values_dir::values_dir());
    let options =
        kine_backend_nats::NatsOptions { config, tls, max_request_bytes, local, read_only: false, values_dir };
    match kine_backend_nats::NatsBackend::open(options).await {
        Ok(backend) => Ok(Target { backend: Arc::new(backend), embedded, nats: true }),
        Err(err) => {
            crate::datastore::shutdown_embedded(embedded).await;
            Err(crate::datastore::explain_foreign("--to", to, err.context("cannot open the NATS bucket")))
        }
    }
}

/// No kine-rs serves the target: none has refreshed its member record within
/// `members::STALE` (PostgreSQL, MySQL and NATS; an SQLite file keeps no such records).
pub async fn unserved(target: &Arc<dyn Backend>) -> Result<()> {
    let me = target.member_id();
    let members = Members::new(target.clone(), Identity::default()).list().await.map_err(e)?;
    let serving: Vec<String> = members
        .into_iter()
        .filter(|m| m.id != me)
        .map(|m| {
            format!("{} ({})", if m.name.is_empty() { format!("{:x}", m.id) } else { m.name }, m.client_urls.join(", "))
        })
        .collect();
    if !serving.is_empty() {
        bail!(
            "--to is being served by kine-rs {} (a member record refreshed within {} s): stop every kine-rs on it first",
            serving.join(", "),
            kine_core::members::STALE.as_secs()
        );
    }
    Ok(())
}

/// Opens `to` and checks nobody serves it.
pub async fn open_unserved(to: &str, cli: &Cli) -> Result<Target> {
    let target = open(to, cli).await.context("--to")?;
    if let Err(err) = unserved(&target.backend).await {
        target.close().await;
        return Err(err);
    }
    Ok(target)
}
