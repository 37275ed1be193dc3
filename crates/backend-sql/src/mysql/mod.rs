//! `mysql://` (kine's go-sql-driver DSN, or `mysql://user:pass@host:port/db`): MySQL or
//! MariaDB, shared by any number of kine-rs nodes. The design is PostgreSQL's (`pg/`): the
//! same log, writes lock the revision counter row for their transaction (gap-free revisions,
//! committed in order, no fill rows), reads run in one consistent snapshot. What differs:
//! MySQL has no LISTEN/NOTIFY, so each node's feed (`feed.rs`) polls one small row every
//! `POLL` and is woken at once by this node's own commits and by `revisions()`; lease changes
//! are counted in `meta.lease_epoch`, which the feed polls with the revision.

pub(crate) mod dsn;
mod feed;
mod pool;
mod schema;
mod view;
mod writer;

use crate::pg::TlsFiles;
use crate::remote::{PoolOptions, Shared};
use crate::writer::{Job, Writer, stopped};
use anyhow::Context;
use dsn::{Address, Dsn, TlsParam};
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Revisions};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents, range};
use mysql::prelude::Queryable;
use pool::ReadPool;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::broadcast;
use view::MyView;

/// How long a read waits for this node's feed to publish what the database already holds.
const FEED_WAIT: Duration = Duration::from_secs(5);
/// Connection attempts give up after this unless the DSN sets `timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A statement that gets no answer for this long fails (the connection is then dropped).
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long start-up waits for a database that is not reachable yet.
const START_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct MysqlOptions {
    /// The endpoint as given (`mysql://…`).
    pub url: String,
    pub pool: PoolOptions,
    pub tls: TlsFiles,
}

/// Without the password.
impl std::fmt::Debug for MysqlOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlOptions")
            .field("url", &dsn::redact(&self.url))
            .field("pool", &self.pool)
            .field("tls", &self.tls)
            .finish()
    }
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

pub struct MysqlBackend {
    shared: Arc<Shared>,
    writer: Writer,
    /// Wakes this node's feed.
    nudge: feed::Nudge,
    readers: Arc<ReadPool>,
    cluster_id: u64,
    member_id: u64,
}

impl MysqlBackend {
    /// Connects, creates the database if it is missing and the schema if needed, and starts
    /// this node's writer and feed. Blocks (run it off the async threads).
    pub fn open(options: MysqlOptions) -> anyhow::Result<MysqlBackend> {
        let shown = dsn::redact(&options.url);
        let with_tls = options.tls.ca_file.is_some() || options.tls.cert_file.is_some();
        let dsn = dsn::parse(&options.url, with_tls).with_context(|| format!("--endpoint {shown}"))?;
        let tls = tls_options(&options.tls, dsn.tls).with_context(|| format!("--endpoint {shown}"))?;
        let connector = Connector::new(&dsn, tls);
        // A database that is starting (or not reachable yet) gets a while; a refusal (wrong
        // password, no such user) does not.
        let started = std::time::Instant::now();
        let mut warned = false;
        let mut conn = loop {
            match connector.connect(Role::Pool) {
                Ok(c) => break c,
                // 1049: unknown database.
                Err(e) if server_code(&e) == Some(1049) => {
                    create_database(&connector, &dsn.database).with_context(|| format!("--endpoint {shown}"))?;
                }
                Err(e)
                    if server_code(&e).is_none_or(|c| c == 1040)
                        && !tls_refused(&e)
                        && started.elapsed() < START_PATIENCE =>
                {
                    if !warned {
                        tracing::warn!(error = format!("{e:#}"), "MySQL not reachable yet; retrying for 30 s");
                        warned = true;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(e) => return Err(e.context(format!("--endpoint {shown}"))),
            }
        };
        let meta = schema::init(&mut conn)?;
        drop(conn);
        let shared = Arc::new(Shared::new(meta.revision, meta.compact_revision));
        let nudge = feed::spawn(connector.clone(), shared.clone()).context("start the MySQL event feed")?;
        let writer =
            writer::spawn(connector.clone(), shared.clone(), nudge.clone()).context("start the MySQL writer")?;
        tracing::debug!(revision = meta.revision, compacted = meta.compact_revision, "MySQL database open");
        Ok(MysqlBackend {
            shared,
            writer: Writer::new(writer),
            nudge,
            readers: Arc::new(ReadPool::new(connector, options.pool)),
            cluster_id: meta.cluster_id,
            member_id: kine_core::id::random_nonzero(),
        })
    }
}

fn create_database(connector: &Connector, name: &str) -> anyhow::Result<()> {
    let mut conn = connector.without_database().connect(Role::Pool).context("connect to create the database")?;
    conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4"))
        .with_context(|| format!("create database {name}"))?;
    tracing::info!(database = %name, "MySQL database created");
    Ok(())
}

#[async_trait::async_trait]
impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.member_id
    }

    async fn revisions(&self) -> Result<Revisions> {
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        let (current, compacted, _) = self.readers.read(|c| Ok(schema::revisions(c)?)).await?;
        let mut published = self.shared.published.subscribe();
        if *published.borrow() < current {
            self.nudge.wake();
        }
        match tokio::time::timeout(FEED_WAIT, published.wait_for(|p| *p >= current)).await {
            Ok(Ok(_)) => Ok(Revisions { current, compacted }),
            _ => Err(Error::Unavailable(format!(
                "etcdserver: this node's event feed has not caught up with revision {current} within {FEED_WAIT:?}"
            ))),
        }
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        if req.range.end == kine_core::RangeEnd::Single {
            return self.readers.single(move |c| view::get(c, &req)).await;
        }
        self.readers
            .read(move |c| {
                let (current, compacted, _) = schema::revisions(c)?;
                let rev = range::read_revision(req.revision, current, compacted)?;
                let mut view = MyView { conn: c, revision: current, compacted, appended: 0 };
                let value = range::execute(&mut view, &req, rev)?;
                Ok(Revisioned { revision: current, value })
            })
            .await
    }

    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.writer.submit(|reply| Job::Write(op, reply)).await
    }

    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.writer.submit(|reply| Job::Compact(revision, reply)).await
    }

    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        let range = range.clone();
        self.readers
            .read(move |c| {
                let (_, compacted, _) = schema::revisions(c)?;
                if after + 1 < compacted {
                    return Err(Error::Compacted { compact_revision: compacted });
                }
                Ok(view::events(c, &range, after, until)?)
            })
            .await
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.shared.feed.subscribe()
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        let rows: Vec<(i64, i64, i64)> = self
            .readers
            .read(|c| Ok(c.query("SELECT id, ttl, renewals FROM lease ORDER BY id").context("list leases")?))
            .await?;
        let mut seen = self.shared.seen();
        for (id, _, renewals) in &rows {
            seen.insert(*id, *renewals);
        }
        Ok(rows.into_iter().map(|(id, ttl, _)| (id, ttl)).collect())
    }

    /// A keep-alive on this node: counted in the database (and in the lease epoch every node's
    /// feed polls).
    async fn lease_renew(&self, id: LeaseId, _ttl: i64) -> Result<()> {
        let renewals = self
            .readers
            .write(move |c| {
                c.exec_drop("UPDATE lease SET renewals = renewals + 1 WHERE id = ?", (id,)).context("renew lease")?;
                let renewals: Option<i64> =
                    c.exec_first("SELECT renewals FROM lease WHERE id = ?", (id,)).context("read lease renewals")?;
                if renewals.is_some() {
                    writer::bump_lease_epoch(c)?;
                }
                Ok(renewals)
            })
            .await?;
        match renewals {
            Some(n) => {
                self.shared.seen().insert(id, n);
                Ok(())
            }
            None => Err(Error::LeaseNotFound),
        }
    }

    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        Some(self.shared.lease_updates.subscribe())
    }

    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.readers
            .read(move |c| {
                let (current, compacted, _) = schema::revisions(c)?;
                MyView { conn: c, revision: current, compacted, appended: 0 }.keys_with_lease(id, current)
            })
            .await
    }

    /// The database's size as InnoDB reports it (table statistics: O(1), approximate).
    async fn status(&self) -> Result<BackendStatus> {
        self.readers
            .read(|c| {
                let size: Option<i64> = c
                    .query_first(
                        "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED)
                         FROM information_schema.tables WHERE table_schema = DATABASE()",
                    )
                    .context("read the database size")?;
                let size = size.unwrap_or(0);
                Ok(BackendStatus { db_size: size, db_size_in_use: size })
            })
            .await
    }

    async fn defragment(&self) -> Result<()> {
        self.writer.submit(Job::Defragment).await
    }

    async fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.nudge.wake();
        self.writer.close().await;
        self.readers.clear();
    }

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.single(|c| Ok(crate::auth::mysql_record(c)?)).await
    }

    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::auth::mysql_replace(c, expected, &data)?)).await
    }

    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::members::mysql_put(c, id, &record)?)).await
    }

    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.single(|c| Ok(Some(crate::members::mysql_records(c)?))).await
    }

    async fn member_delete(&self, id: u64) -> Result<()> {
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::members::mysql_delete(c, id)?)).await
    }
}
