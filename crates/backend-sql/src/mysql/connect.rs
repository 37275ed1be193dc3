//! Connecting to MySQL: the DSN, TLS from kine's flags, the isolation level per use,
//! patience with a database that is still starting, creating the database if it is missing
//! (not for a read-only open, which reports it), and which errors mean an outage.

use super::MysqlOptions;
use super::dsn::{self, Address, Dsn, TlsParam};
use crate::pg::TlsFiles;
use anyhow::Context;
use kine_core::Error;
use mysql::prelude::Queryable;
use std::time::Duration;

/// Connection attempts give up after this unless the DSN sets `timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A statement that gets no answer for this long fails (the connection is then dropped).
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// The connector for `options` and a first connection (for reads); `create`: create the
/// database if it is missing.
pub fn connect(options: &MysqlOptions, create: bool) -> anyhow::Result<(Connector, mysql::Conn)> {
    let shown = dsn::redact(&options.url);
    let with_tls = options.tls.ca_file.is_some() || options.tls.cert_file.is_some();
    let dsn = dsn::parse(&options.url, with_tls).with_context(|| format!("--endpoint {shown}"))?;
    let tls = tls_options(&options.tls, dsn.tls).with_context(|| format!("--endpoint {shown}"))?;
    let connector = Connector::new(&dsn, tls);
    // A database that is starting (or not reachable yet) gets a while; a refusal (wrong
    // password, no such user) does not.
    let started = std::time::Instant::now();
    let mut warned = false;
    let conn = loop {
        match connector.connect(Role::Pool) {
            Ok(c) => break c,
            // 1049: unknown database.
            Err(e) if create && server_code(&e) == Some(1049) => {
                create_database(&connector, &dsn.database).with_context(|| format!("--endpoint {shown}"))?;
            }
            Err(e)
                if server_code(&e).is_none_or(|c| c == 1040)
                    && !tls_refused(&e)
                    && started.elapsed() < crate::remote::START_PATIENCE =>
            {
                if !warned {
                    tracing::warn!(error = format!("{e:#}"), "MySQL not reachable yet; retrying for 30 s");
                    warned = true;
                }
                crate::remote::pause_before_retry(options.stop.as_ref(), "MySQL")?;
            }
            Err(e) => return Err(e.context(format!("--endpoint {shown}"))),
        }
    };
    Ok((connector, conn))
}

/// What a connection is for: the isolation level it runs at.
#[derive(Clone, Copy)]
pub enum Role {
    /// The writer: each statement sees everything committed (it holds the counter lock).
    Writer,
    /// Reads in snapshots, the feed, bookkeeping writes.
    Pool,
}

/// Opens connections to the configured database.
#[derive(Clone)]
pub struct Connector {
    opts: mysql::OptsBuilder,
}

impl Connector {
    fn new(dsn: &Dsn, tls: Option<mysql::SslOpts>) -> Connector {
        let mut opts = mysql::OptsBuilder::new()
            .user(Some(dsn.user.clone()))
            .pass(dsn.password.clone())
            .db_name(Some(dsn.database.clone()))
            .prefer_socket(false)
            .tcp_connect_timeout(Some(dsn.timeout.unwrap_or(CONNECT_TIMEOUT)))
            .read_timeout(Some(IO_TIMEOUT))
            .write_timeout(Some(IO_TIMEOUT))
            .stmt_cache_size(Some(128))
            .ssl_opts(tls);
        opts = match &dsn.address {
            Address::Tcp { host, port } => opts.ip_or_hostname(Some(host.clone())).tcp_port(*port),
            Address::Unix(path) => opts.socket(Some(path.clone())),
        };
        let mut init = vec!["SET NAMES utf8mb4".to_string()];
        for (name, value) in &dsn.session_vars {
            init.push(format!("SET SESSION {name} = {value}"));
        }
        Connector { opts: opts.init(init) }
    }

    pub fn connect(&self, role: Role) -> anyhow::Result<mysql::Conn> {
        let mut conn = mysql::Conn::new(self.opts.clone()).context("connect to MySQL")?;
        let level = match role {
            Role::Writer => "READ COMMITTED",
            Role::Pool => "REPEATABLE READ",
        };
        conn.query_drop(format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"))
            .context("set the isolation level")?;
        Ok(conn)
    }

    fn without_database(&self) -> Connector {
        Connector { opts: self.opts.clone().db_name(None::<String>) }
    }
}

/// The MySQL error code in `e`'s chain, if the server answered with one.
fn server_code(e: &anyhow::Error) -> Option<u16> {
    e.chain().find_map(|c| match c.downcast_ref::<mysql::Error>() {
        Some(mysql::Error::MySqlError(m)) => Some(m.code),
        _ => None,
    })
}

/// Did `e` come from a connection that no longer works (network, protocol, server shutting
/// down, or a lock wait that gave up)? Such failures are outages: `Unavailable`.
pub fn connection_lost(e: &anyhow::Error) -> bool {
    e.chain().any(|c| match c.downcast_ref::<mysql::Error>() {
        Some(mysql::Error::IoError(_) | mysql::Error::CodecError(_)) => true,
        Some(mysql::Error::DriverError(d)) => {
            !matches!(d, mysql::DriverError::Params(_) | mysql::DriverError::MismatchedStmtParams(..))
        }
        // Server shutdown (1053), connection killed (1927), lock wait timeout (1205), deadlock
        // (1213), read-only server (1290, a failed-over primary), too many connections (1040).
        Some(mysql::Error::MySqlError(m)) => matches!(m.code, 1053 | 1927 | 1205 | 1213 | 1290 | 1040),
        _ => c.downcast_ref::<std::io::Error>().is_some(),
    })
}

/// A failed TLS handshake (unknown CA, wrong name, no TLS on the server) fails the same way
/// again: not worth retrying at start-up.
fn tls_refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(c.downcast_ref::<mysql::Error>(), Some(mysql::Error::TlsError(_)))
            || matches!(
                c.downcast_ref::<mysql::Error>(),
                Some(mysql::Error::DriverError(mysql::DriverError::TlsNotSupported))
            )
            || c.downcast_ref::<rustls::Error>().is_some()
            || c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
    }) || {
        // The client wraps the handshake's error in its codec's I/O error, as text.
        let text = format!("{e:#}");
        text.contains("invalid peer certificate") || text.contains("peer is incompatible")
    }
}

pub fn unavailable(e: &anyhow::Error) -> Error {
    Error::Unavailable(format!("MySQL: {e:#}"))
}

/// TLS from kine's flags and the DSN's `tls` parameter.
fn tls_options(files: &TlsFiles, param: Option<TlsParam>) -> anyhow::Result<Option<mysql::SslOpts>> {
    let flags = files.ca_file.is_some() || files.cert_file.is_some() || files.key_file.is_some() || files.skip_verify;
    let skip = match (param, flags) {
        (Some(TlsParam::Off), true) => {
            anyhow::bail!("--ca-file/--cert-file/--key-file/--skip-verify: the DSN says tls=false")
        }
        (Some(TlsParam::Off) | None, false) => return Ok(None),
        (Some(TlsParam::Preferred), false) => {
            tracing::warn!(
                "tls=preferred: kine-rs connects without TLS unless --ca-file/--cert-file/--key-file are given"
            );
            return Ok(None);
        }
        (Some(TlsParam::SkipVerify), _) => true,
        _ => files.skip_verify,
    };
    let mut ssl =
        mysql::SslOpts::default().with_danger_accept_invalid_certs(skip).with_danger_skip_domain_validation(skip);
    if let Some(ca) = &files.ca_file {
        anyhow::ensure!(ca.is_file(), "--ca-file {}: no such file", ca.display());
        ssl = ssl.with_root_cert_path(Some(ca.clone()));
    }
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            anyhow::ensure!(cert.is_file(), "--cert-file {}: no such file", cert.display());
            anyhow::ensure!(key.is_file(), "--key-file {}: no such file", key.display());
            ssl = ssl.with_client_identity(Some(mysql::ClientIdentity::new(cert.clone(), key.clone())));
        }
        (None, None) => {}
        _ => anyhow::bail!("--cert-file and --key-file go together"),
    }
    Ok(Some(ssl))
}

fn create_database(connector: &Connector, name: &str) -> anyhow::Result<()> {
    let mut conn = connector.without_database().connect(Role::Pool).context("connect to create the database")?;
    conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4"))
        .with_context(|| format!("create database {name}"))?;
    tracing::info!(database = %name, "MySQL database created");
    Ok(())
}
