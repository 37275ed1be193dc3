//! `postgres://user:pass@host:port/db?params`: PostgreSQL, shared by any number of kine-rs
//! nodes. The log and the rules are SQLite's (`kv`, one row per change); what differs:
//! - writes lock the revision counter row for their transaction (`writer.rs`), so several nodes
//!   commit gap-free revisions in order, without fill rows;
//! - events reach this node's watchers through its feed (`feed.rs`), which publishes every
//!   node's commits in revision order (LISTEN/NOTIFY, polling once a second as a fallback),
//!   and through its writer, which publishes its own commits before answering when they come
//!   next (`Shared::publish_own`);
//! - `revisions()` reads the database's revision and waits until the feed has published it,
//!   so a watch started after an acknowledged write on any node never misses or repeats it.

mod compact;
pub(crate) mod conn;
mod feed;
pub(crate) mod open;
mod pool;
mod schema;
mod tls;
mod view;
mod writer;

use crate::compact_worker::CompactWorker;
pub use crate::remote::{PoolOptions, Shared};
use crate::writer::{Job, Writer, stopped};
use anyhow::Context;
use conn::Sql;
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Revisions};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::rounds::{Failed, Rounds};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents, range};
use pool::ReadPool;
use postgres::types::Type;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
pub use tls::TlsFiles;
use tokio::sync::broadcast;
use view::PgView;

/// How long a read waits for this node's feed to publish what the database already holds.
const FEED_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct PostgresOptions {
    /// The endpoint as given (`postgres://` or `postgresql://`).
    pub url: String,
    pub pool: PoolOptions,
    pub tls: TlsFiles,
    /// The process's shutdown signal: it ends the wait for a database that is not reachable
    /// yet at start-up.
    pub stop: Option<kine_core::shutdown::Shutdown>,
}

/// Without the password.
impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &open::redact(&self.url))
            .field("pool", &self.pool)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Opens connections to the configured database.
#[derive(Clone)]
pub struct Connector {
    config: postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// Statements kept prepared per connection (0: sent unnamed), see `conn.rs`.
    statement_cache: usize,
}

impl Connector {
    pub fn connect(&self) -> anyhow::Result<postgres::Client> {
        match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(postgres::NoTls),
        }
        .context("connect to PostgreSQL")
    }

    /// A connection that keeps its statements prepared (as the URL allows).
    pub fn open(&self) -> anyhow::Result<conn::Conn> {
        Ok(conn::Conn::new(self.connect()?, self.statement_cache))
    }
}

/// The current and compact revisions in one statement, shared by the callers waiting at the
/// same time (watch creation and progress requests ask for them: `kine_core::rounds`).
fn revision_rounds(readers: &Arc<ReadPool>) -> Rounds<(Revision, Revision)> {
    let readers = readers.clone();
    Rounds::new(Failed::AskAlone, move || {
        let readers = readers.clone();
        async move { readers.single(|c| Ok(schema::revisions(c)?)).await }
    })
}

pub struct PostgresBackend {
    /// The counts of the next pages of paginated lists (`kine_core::page_counts`).
    page_counts: Arc<kine_core::page_counts::PageCounts>,
    shared: Arc<Shared>,
    writer: Writer,
    /// `None` when open read-only.
    compactor: Option<CompactWorker>,
    readers: Arc<ReadPool>,
    /// The current and compact revisions: one statement shared by the callers waiting.
    revisions: Rounds<(Revision, Revision)>,
    cluster_id: u64,
    member_id: u64,
    /// Opened with [`PostgresBackend::open_read_only`]: no writer, no feed.
    read_only: bool,
}

impl PostgresBackend {
    /// Connects, creates the database if it is missing and the schema if needed, and starts
    /// this node's writer and feed. Blocks; callable from async code (the synchronous client
    /// runs on a thread of its own).
    pub fn open(options: PostgresOptions) -> anyhow::Result<PostgresBackend> {
        std::thread::spawn(move || Self::open_here(options))
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("opening PostgreSQL panicked")))
    }

    fn open_here(options: PostgresOptions) -> anyhow::Result<PostgresBackend> {
        let (connector, mut client) = open::connect(&options, true)?;
        crate::foreign::check_postgres(&mut client)?;
        let meta = schema::init(&mut client)?;
        drop(client);
        let shared = Arc::new(Shared::new(meta.revision, meta.compact_revision));
        feed::spawn(connector.clone(), shared.clone()).context("start the PostgreSQL event feed")?;
        let compactor = CompactWorker::spawn("pg-compactor", compact::PgCompaction(connector.clone()))
            .context("start the PostgreSQL compactor")?;
        let removals = compactor.removals().context("the PostgreSQL compactor stopped at start")?;
        let writer =
            writer::spawn(connector.clone(), shared.clone(), removals).context("start the PostgreSQL writer")?;
        tracing::debug!(revision = meta.revision, compacted = meta.compact_revision, "PostgreSQL database open");
        let readers = Arc::new(ReadPool::new(connector, options.pool));
        Ok(PostgresBackend {
            page_counts: Default::default(),
            shared,
            writer: Writer::new(writer),
            compactor: Some(compactor),
            revisions: revision_rounds(&readers),
            readers,
            cluster_id: meta.cluster_id,
            member_id: kine_core::id::random_nonzero(),
            read_only: false,
        })
    }

    /// Opens an existing kine-rs database read-only (`kine-rs inspect`): no database, table
    /// or row is created, no writer or feed started; nodes may serve it meanwhile. Blocks.
    pub fn open_read_only(options: PostgresOptions) -> anyhow::Result<PostgresBackend> {
        std::thread::spawn(move || {
            let (connector, mut client) = open::connect(&options, false)?;
            crate::foreign::check_postgres(&mut client)?;
            let meta =
                schema::existing(&mut client).with_context(|| format!("--endpoint {}", open::redact(&options.url)))?;
            let readers = Arc::new(ReadPool::new(connector, options.pool));
            Ok(PostgresBackend {
                page_counts: Default::default(),
                shared: Arc::new(Shared::new(meta.revision, meta.compact_revision)),
                writer: Writer::none(),
                compactor: None,
                revisions: revision_rounds(&readers),
                readers,
                cluster_id: meta.cluster_id,
                member_id: kine_core::id::random_nonzero(),
                read_only: true,
            })
        })
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("opening PostgreSQL panicked")))
    }

    /// The refusal of a write to a read-only open.
    fn refuse_write(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly("the PostgreSQL database is open read-only".into()));
        }
        Ok(())
    }

    async fn compact_with(&self, revision: Revision, physical: bool) -> Result<Revision> {
        self.refuse_write()?;
        self.writer.submit(|reply| Job::Compact { revision, physical, reply }).await
    }

    /// Reads are served: open read-only, or for writes until closed.
    fn serving(&self) -> Result<()> {
        if self.writer.is_stopped() && !self.read_only {
            return Err(stopped());
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.member_id
    }

    async fn revisions(&self) -> Result<Revisions> {
        self.serving()?;
        // One statement, one snapshot: both rows agree without a transaction around them.
        let (current, compacted) = self.revisions.get().await?;
        if self.read_only {
            return Ok(Revisions { current, compacted });
        }
        let mut published = self.shared.published.subscribe();
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
        let counts = self.page_counts.clone();
        self.readers
            .read(move |tx| {
                let (current, compacted) = schema::revisions(tx)?;
                let rev = range::read_revision(req.revision, current, compacted)?;
                let mut view = PgView { client: tx, revision: current, compacted, appended: 0 };
                let value = range::execute_with(&mut view, &req, rev, Some(&counts))?;
                Ok(Revisioned { revision: current, value })
            })
            .await
    }

    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.refuse_write()?;
        self.writer.submit(|reply| Job::Write(op, reply)).await
    }

    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.compact_with(revision, true).await
    }

    async fn compact_logically(&self, revision: Revision) -> Result<Revision> {
        self.compact_with(revision, false).await
    }

    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        let range = range.clone();
        self.readers
            .read(move |tx| {
                let (_, compacted) = schema::revisions(tx)?;
                if after + 1 < compacted {
                    return Err(Error::Compacted { compact_revision: compacted });
                }
                Ok(view::events(tx, &range, after, until)?)
            })
            .await
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.shared.feed.subscribe()
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        let rows = self
            .readers
            .read(|tx| {
                let rows =
                    tx.query_rows("SELECT id, ttl, renewals FROM lease ORDER BY id", &[]).context("list leases")?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)))
                    .collect::<Vec<_>>())
            })
            .await?;
        let mut seen = self.shared.seen();
        for (id, _, renewals) in &rows {
            seen.insert(*id, *renewals);
        }
        Ok(rows.into_iter().map(|(id, ttl, _)| (id, ttl)).collect())
    }

    /// A keep-alive on this node: counted in the database, announced to every node.
    async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.refuse_write()?;
        let renewals = self
            .readers
            .write(move |tx| {
                let row = tx
                    .query_maybe(
                        "UPDATE lease SET renewals = renewals + 1 WHERE id = $1 RETURNING renewals",
                        &[(&id, Type::INT8)],
                    )
                    .context("renew lease")?;
                let Some(row) = row else { return Ok(None) };
                let renewals: i64 = row.get(0);
                let payload = format!("renew {id} {ttl} {renewals}");
                tx.execute_sql("SELECT pg_notify('kine_rs_lease', $1)", &[(&payload, Type::TEXT)])
                    .context("announce lease renewal")?;
                Ok(Some(renewals))
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
            .read(move |tx| {
                let (current, compacted) = schema::revisions(tx)?;
                PgView { client: tx, revision: current, compacted, appended: 0 }.keys_with_lease(id, current)
            })
            .await
    }

    async fn status(&self) -> Result<BackendStatus> {
        self.readers
            .read(|tx| {
                let size: i64 = tx
                    .query_row("SELECT pg_database_size(current_database())", &[])
                    .context("read the database size")?
                    .get(0);
                Ok(BackendStatus { db_size: size, db_size_in_use: size })
            })
            .await
    }

    async fn defragment(&self) -> Result<()> {
        self.refuse_write()?;
        self.writer.submit(Job::Defragment).await
    }

    async fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        if let Some(compactor) = &self.compactor {
            compactor.close().await;
        }
        self.writer.close().await;
        self.readers.clear();
    }

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.serving()?;
        self.readers.single(|c| Ok(crate::auth::pg_record(c.client())?)).await
    }

    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::auth::pg_replace(c.client(), expected, &data)?)).await
    }

    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::members::pg_put(c.client(), id, &record)?)).await
    }

    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        self.serving()?;
        self.readers.single(|c| Ok(Some(crate::members::pg_records(c.client())?))).await
    }

    async fn member_delete(&self, id: u64) -> Result<()> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::members::pg_delete(c.client(), id)?)).await
    }
}
