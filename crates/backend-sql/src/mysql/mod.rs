//! `mysql://` (kine's go-sql-driver DSN, or `mysql://user:pass@host:port/db`): MySQL or
//! MariaDB, shared by any number of kine-rs nodes. The design is PostgreSQL's (`pg/`): the
//! same log, writes lock the revision counter row for their transaction (gap-free revisions,
//! committed in order, no fill rows), reads run in one consistent snapshot. What differs:
//! MySQL has no LISTEN/NOTIFY, so each node's feed (`feed.rs`) polls one small row every
//! `POLL` and is woken at once by this node's own commits and by `revisions()`; lease changes
//! are counted in `meta.lease_epoch`, which the feed polls with the revision.

mod compact;
pub(crate) mod connect;
pub(crate) mod dsn;
mod feed;
mod pool;
mod prev_cache;
mod schema;
mod view;
mod writer;

use crate::compact_worker::CompactWorker;
use crate::pg::TlsFiles;
use crate::remote::{PoolOptions, Shared};
use crate::writer::{Job, Writer, stopped};
use anyhow::Context;
pub use connect::{Connector, Role, connection_lost, unavailable};
use kine_core::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Revisions};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::rounds::{Failed, Rounds};
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

#[derive(Clone)]
pub struct MysqlOptions {
    /// The endpoint as given (`mysql://…`).
    pub url: String,
    pub pool: PoolOptions,
    pub tls: TlsFiles,
    /// The process's shutdown signal: it ends the wait for a database that is not reachable
    /// yet at start-up.
    pub stop: Option<kine_core::shutdown::Shutdown>,
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

/// The current and compact revisions in one statement, shared by the callers waiting at the
/// same time (watch creation and progress requests ask for them: `kine_core::rounds`).
fn revision_rounds(readers: &Arc<ReadPool>) -> Rounds<(Revision, Revision)> {
    let readers = readers.clone();
    Rounds::new(Failed::AskAlone, move || {
        let readers = readers.clone();
        async move {
            readers.single(|c| Ok(schema::revisions(c).map(|(current, compacted, _)| (current, compacted))?)).await
        }
    })
}

pub struct MysqlBackend {
    /// The counts of the next pages of paginated lists (`kine_core::page_counts`).
    page_counts: Arc<kine_core::page_counts::PageCounts>,
    /// What each catch-up in progress knows of previous versions (`prev_cache.rs`).
    prev_cache: Arc<prev_cache::PrevCache>,
    shared: Arc<Shared>,
    writer: Writer,
    /// `None` when open read-only.
    compactor: Option<CompactWorker>,
    /// Wakes this node's feed.
    nudge: feed::Nudge,
    readers: Arc<ReadPool>,
    /// The current and compact revisions: one statement shared by the callers waiting.
    revisions: Rounds<(Revision, Revision)>,
    cluster_id: u64,
    member_id: u64,
    /// Opened with [`MysqlBackend::open_read_only`]: no writer, no feed.
    read_only: bool,
}

impl MysqlBackend {
    /// Connects, creates the database if it is missing and the schema if needed, and starts
    /// this node's writer and feed. Blocks (run it off the async threads).
    pub fn open(options: MysqlOptions) -> anyhow::Result<MysqlBackend> {
        let (connector, mut conn) = connect::connect(&options, true)?;
        crate::foreign::check_mysql(&mut conn)?;
        let meta = schema::init(&mut conn)?;
        drop(conn);
        let shared = Arc::new(Shared::new(meta.revision, meta.compact_revision));
        let nudge = feed::spawn(connector.clone(), shared.clone()).context("start the MySQL event feed")?;
        let compactor = CompactWorker::spawn("mysql-compactor", compact::MyCompaction(connector.clone()))
            .context("start the MySQL compactor")?;
        let removals = compactor.removals().context("the MySQL compactor stopped at start")?;
        let writer = writer::spawn(connector.clone(), shared.clone(), nudge.clone(), removals)
            .context("start the MySQL writer")?;
        tracing::debug!(revision = meta.revision, compacted = meta.compact_revision, "MySQL database open");
        let readers = Arc::new(ReadPool::new(connector, options.pool));
        Ok(MysqlBackend {
            page_counts: Default::default(),
            prev_cache: Default::default(),
            shared,
            writer: Writer::new(writer),
            compactor: Some(compactor),
            nudge,
            revisions: revision_rounds(&readers),
            readers,
            cluster_id: meta.cluster_id,
            member_id: kine_core::id::random_nonzero(),
            read_only: false,
        })
    }

    /// Opens an existing kine-rs database read-only (`kine-rs inspect`): no database, table
    /// or row is created, no writer or feed started; nodes may serve it meanwhile. Blocks.
    pub fn open_read_only(options: MysqlOptions) -> anyhow::Result<MysqlBackend> {
        let (connector, mut conn) = connect::connect(&options, false)?;
        crate::foreign::check_mysql(&mut conn)?;
        let meta = schema::existing(&mut conn).with_context(|| format!("--endpoint {}", dsn::redact(&options.url)))?;
        let readers = Arc::new(ReadPool::new(connector, options.pool));
        Ok(MysqlBackend {
            page_counts: Default::default(),
            prev_cache: Default::default(),
            shared: Arc::new(Shared::new(meta.revision, meta.compact_revision)),
            writer: Writer::none(),
            compactor: None,
            nudge: feed::Nudge::none(),
            revisions: revision_rounds(&readers),
            readers,
            cluster_id: meta.cluster_id,
            member_id: kine_core::id::random_nonzero(),
            read_only: true,
        })
    }

    /// The refusal of a write to a read-only open.
    fn refuse_write(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly("the MySQL database is open read-only".into()));
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
        self.serving()?;
        // One statement, one snapshot: the rows agree without a transaction around them.
        let (current, compacted) = self.revisions.get().await?;
        if self.read_only {
            return Ok(Revisions { current, compacted });
        }
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
        let counts = self.page_counts.clone();
        self.readers
            .read(move |c| {
                let (current, compacted, _) = schema::revisions(c)?;
                let rev = range::read_revision(req.revision, current, compacted)?;
                let mut view = MyView { conn: c, revision: current, compacted, appended: 0 };
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
        let prev_cache = self.prev_cache.clone();
        self.readers
            .read(move |c| {
                let (_, compacted, _) = schema::revisions(c)?;
                if after + 1 < compacted {
                    return Err(Error::Compacted { compact_revision: compacted });
                }
                let mut known = prev_cache.take(&range, after);
                let events = view::events(c, &range, after, until, &mut known)?;
                prev_cache.put(range, until, known);
                Ok(events)
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
        self.refuse_write()?;
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
        self.refuse_write()?;
        self.writer.submit(Job::Defragment).await
    }

    async fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.nudge.wake();
        if let Some(compactor) = &self.compactor {
            compactor.close().await;
        }
        self.writer.close().await;
        self.readers.clear();
    }

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.serving()?;
        self.readers.single(|c| Ok(crate::auth::mysql_record(c)?)).await
    }

    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::auth::mysql_replace(c, expected, &data)?)).await
    }

    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::members::mysql_put(c, id, &record)?)).await
    }

    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        self.serving()?;
        self.readers.single(|c| Ok(Some(crate::members::mysql_records(c)?))).await
    }

    async fn member_delete(&self, id: u64) -> Result<()> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        self.readers.write(move |c| Ok(crate::members::mysql_delete(c, id)?)).await
    }
}
