//! A datastore opened only to be read, by `kine-rs inspect` and as `kine-rs migrate`'s source:
//! nothing is created, migrated or written, and a datastore that is missing is an error.
//!
//! - SQLite: the file, opened read-only.
//! - PostgreSQL and MySQL: read-only transactions; a database without a kine-rs store is refused.
//! - NATS: the bucket, read through a NATS server (`?noEmbed`: the server or cluster named, while
//!   kine-rs serves it or not). Without `?noEmbed`, the embedded server of a stopped single
//!   node is started on its store (`dataDir`), on a random loopback port that only this
//!   process knows, and stopped afterwards.

use crate::cli::Cli;
use crate::datastore::Embedded;
use crate::endpoint::{self, Endpoint};
use anyhow::{Context, Result, bail};
use kine_core::backend::Backend;

/// A datastore opened read-only, with the embedded NATS server it was read through, if any.
pub struct ReadOnly {
    backend: Box<dyn Backend>,
    embedded: Embedded,
}

impl ReadOnly {
    pub fn new(backend: Box<dyn Backend>) -> ReadOnly {
        ReadOnly { backend, embedded: None }
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub async fn close(self) {
        self.backend.close().await;
        crate::datastore::shutdown_embedded(self.embedded).await;
    }
}

/// The datastore `endpoint` names, opened read-only; the SQL pool and the TLS flags come from
/// `cli`. Errors name `flag`.
pub async fn open_read_only(flag: &str, endpoint: &str, cli: &Cli) -> Result<ReadOnly> {
    let pool = kine_backend_sql::PoolOptions { max_idle: 2, max_open: Some(2), ..crate::datastore::pool_options(cli) };
    let tls = crate::datastore::sql_tls(cli);
    // Data kine-rs does not own (Go kine's, etcd's) is refused as the server refuses it.
    let failed = |e: anyhow::Error, context: String| match kine_core::foreign::Foreign::find(&e) {
        Some(_) => crate::datastore::explain_foreign(flag, endpoint, e),
        None => e.context(context),
    };
    let backend: Box<dyn Backend> = match endpoint::parse_as(flag, endpoint).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } => Box::new(
            kine_backend_sql::SqliteBackend::open_read_only(&path)
                .map_err(|e| failed(e, format!("{flag}: cannot read it")))?,
        ),
        Endpoint::Postgres { url } => {
            let options = kine_backend_sql::PostgresOptions { url, pool, tls, stop: None };
            Box::new(
                tokio::task::spawn_blocking(move || kine_backend_sql::PostgresBackend::open_read_only(options))
                    .await
                    .context("open PostgreSQL")?
                    .map_err(|e| failed(e, flag.to_string()))?,
            )
        }
        Endpoint::Mysql { url } => {
            let options = kine_backend_sql::MysqlOptions { url, pool, tls, stop: None };
            Box::new(
                tokio::task::spawn_blocking(move || kine_backend_sql::MysqlBackend::open_read_only(options))
                    .await
                    .context("open MySQL")?
                    .map_err(|e| failed(e, flag.to_string()))?,
            )
        }
        Endpoint::Memory => {
            bail!("{flag}: memory:// holds nothing once its server stops; there is nothing to read")
        }
        Endpoint::Nats(config) => {
            return nats(flag, *config, cli).await.map_err(|e| crate::datastore::explain_foreign(flag, endpoint, e));
        }
    };
    Ok(ReadOnly::new(backend))
}

/// The NATS server to read `config`'s bucket through, for a read that writes nothing: the
/// servers the URL names, or, without `noEmbed`, an embedded server started on the store of a
/// stopped node (on loopback, on a random port, with a token only this process knows); the
/// config to connect with, and the TLS flags. Errors name `flag`.
pub async fn reach_nats(
    flag: &str,
    mut config: kine_backend_nats::config::NatsConfig,
    cli: &Cli,
) -> Result<(crate::datastore::Embedded, kine_backend_nats::config::NatsConfig, kine_backend_nats::connect::ClientTls)>
{
    if cli.skip_verify {
        bail!("--skip-verify is not supported with nats:// (give the server's CA with --ca-file)");
    }
    let embedded = endpoint::wants_embedded(&config);
    if embedded {
        if let Some(file) = &config.server_config {
            bail!(
                "{flag}: serverConfig {}: kine-rs starts an embedded NATS server to read a stopped node's store only \
                 without a config file (a cluster's or a leaf node's store is read through one of its servers: \
                 nats://HOST:PORT?noEmbed)",
                file.display()
            );
        }
        let dir = config.data_dir.clone().unwrap_or_else(|| crate::endpoint::DEFAULT_NATS_DATA_DIR.into());
        if !dir.join("jetstream").is_dir() {
            bail!("{flag}: no NATS store in {} (dataDir): nothing to read", dir.display());
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
    // Its errors name --endpoint, which is `flag` here.
    let (embedded, config) = crate::datastore::start_embedded(config, max_request_bytes, &stop)
        .await
        .map_err(|e| anyhow::anyhow!("{}", format!("{e:#}").replacen("--endpoint: ", &format!("{flag}: "), 1)))?;
    Ok((embedded, config, tls))
}

async fn nats(flag: &str, config: kine_backend_nats::config::NatsConfig, cli: &Cli) -> Result<ReadOnly> {
    match nats_source(flag, config, cli).await? {
        NatsSource::KineRs(source) => Ok(source),
        NatsSource::GoKine { embedded, refusal, .. } => {
            crate::datastore::shutdown_embedded(embedded).await;
            Err(refusal)
        }
    }
}

/// A NATS bucket opened for reading: kine-rs's, or Go kine's (which kine-rs's backend refused,
/// `refusal`), with the server reached to read it (`kine-rs migrate` converts it).
pub enum NatsSource {
    KineRs(ReadOnly),
    GoKine {
        embedded: crate::datastore::Embedded,
        config: Box<kine_backend_nats::config::NatsConfig>,
        tls: kine_backend_nats::connect::ClientTls,
        refusal: anyhow::Error,
    },
}

/// The bucket `config` names, through its servers or an embedded server on a stopped node's
/// store (`reach_nats`).
pub async fn nats_source(flag: &str, config: kine_backend_nats::config::NatsConfig, cli: &Cli) -> Result<NatsSource> {
    let (embedded, config, tls) = reach_nats(flag, config, cli).await?;
    let max_request_bytes = cli.max_request_bytes as usize;
    let local = crate::datastore::local_server(&embedded);
    let values_dir = Some(kine_backend_nats::values_dir::values_dir());
    let options = kine_backend_nats::NatsOptions {
        config: config.clone(),
        tls: tls.clone(),
        max_request_bytes,
        local,
        read_only: true,
        values_dir,
    };
    match kine_backend_nats::NatsBackend::open(options).await {
        Ok(backend) => Ok(NatsSource::KineRs(ReadOnly { backend: Box::new(backend), embedded })),
        Err(e) => match kine_core::foreign::Foreign::find(&e).map(|f| f.kind) {
            Some(kine_core::foreign::ForeignKind::GoKine) => {
                Ok(NatsSource::GoKine { embedded, config: Box::new(config), tls, refusal: e })
            }
            found => {
                crate::datastore::shutdown_embedded(embedded).await;
                Err(if found.is_some() { e } else { e.context(format!("{flag}: cannot read the NATS bucket")) })
            }
        },
    }
}
