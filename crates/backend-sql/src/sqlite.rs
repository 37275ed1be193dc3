//! `sqlite://PATH`: the embedded default datastore.

use crate::pool::ReadPool;
use crate::schema;
use crate::view::{self, SqlView};
use crate::writer::{self, Job, Shared, Writer, stopped};
use anyhow::Context;
use kine_core::backend::{AuthRecord, Backend, BackendStatus, FEED_CAPACITY, Revisions};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, KeyRange, LeaseId, Result, Revision, RevisionEvents, range};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::sync::broadcast;

#[derive(Clone, Debug)]
pub struct SqliteOptions {
    pub path: PathBuf,
}

/// Idle read connections kept. More readers than this at once open connections that are closed
/// afterwards — an open parses the schema and maps the file again, so keep enough for the
/// concurrency the server sees (they cost little: SQLite's cache grows only as used).
const READERS_KEPT: usize = 64;

pub struct SqliteBackend {
    /// The counts of the next pages of paginated lists (`kine_core::page_counts`).
    page_counts: Arc<kine_core::page_counts::PageCounts>,
    path: PathBuf,
    shared: Arc<Shared>,
    /// `None` once closed.
    writer: Writer,
    readers: Arc<ReadPool>,
    cluster_id: u64,
    member_id: u64,
    /// Opened with [`SqliteBackend::open_read_only`]: no writer; revisions read from the file.
    read_only: bool,
    /// A writer's hold on the database (`sqlite_lock.rs`); `None` when read-only.
    lock: Option<crate::sqlite_lock::ServeLock>,
}

impl SqliteBackend {
    /// Opens (or creates) the database. A missing parent directory is created with mode 0700.
    /// Data kine-rs does not own (Go kine's table, etcd's files, no database at all) is refused
    /// before anything is created or written (`foreign.rs`).
    pub fn open(options: SqliteOptions) -> anyhow::Result<SqliteBackend> {
        let path = options.path;
        crate::foreign::check_sqlite(&path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir)?;
        }
        let lock = crate::sqlite_lock::take(&path).map_err(|e| with_directory_hint(&path, e))?;
        let mut conn = Connection::open(&path).map_err(|e| {
            with_directory_hint(
                &path,
                anyhow::Error::new(e).context(format!("open SQLite database {}", path.display())),
            )
        })?;
        schema::configure(&conn).with_context(|| format!("configure SQLite database {}", path.display()))?;
        let meta = schema::init(&mut conn).with_context(|| format!("initialise SQLite database {}", path.display()))?;
        let shared = Arc::new(Shared {
            current: AtomicI64::new(meta.revision),
            compacted: AtomicI64::new(meta.compact_revision),
            feed: broadcast::channel(FEED_CAPACITY).0,
        });
        let writer = writer::spawn(conn, shared.clone()).context("start the SQLite writer thread")?;
        tracing::debug!(path = %path.display(), revision = meta.revision, compacted = meta.compact_revision, "SQLite database open");
        Ok(SqliteBackend {
            page_counts: Default::default(),
            readers: Arc::new(ReadPool::new(path.clone(), READERS_KEPT)),
            path,
            shared,
            writer: Writer::new(writer),
            cluster_id: meta.cluster_id,
            member_id: meta.member_id,
            read_only: false,
            lock: Some(lock),
        })
    }

    /// Opens an existing database read-only (`kine-rs inspect`): nothing is created, migrated
    /// or written, and a kine-rs may be serving it meanwhile (each read sees the newest
    /// committed state). Writes are refused.
    pub fn open_read_only(path: &Path) -> anyhow::Result<SqliteBackend> {
        std::fs::metadata(path).with_context(|| format!("SQLite database {}", path.display()))?;
        crate::foreign::check_sqlite(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .with_context(|| format!("open SQLite database {} read-only", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30)).context("set busy timeout")?;
        let meta = schema::existing(&conn).with_context(|| format!("SQLite database {}", path.display()))?;
        Ok(SqliteBackend {
            page_counts: Default::default(),
            readers: Arc::new(ReadPool::new(path.to_path_buf(), 4)),
            path: path.to_path_buf(),
            shared: Arc::new(Shared {
                current: AtomicI64::new(meta.revision),
                compacted: AtomicI64::new(meta.compact_revision),
                feed: broadcast::channel(1).0,
            }),
            writer: Writer::none(),
            cluster_id: meta.cluster_id,
            member_id: meta.member_id,
            read_only: true,
            lock: None,
        })
    }

    /// The refusal of a write to a read-only open.
    fn refuse_write(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly(format!("{} is open read-only", self.path.display())));
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why the database cannot be opened: `err`, and when the directory it goes in takes no new
/// file (a read-only mount, another owner: a container's volume, say), that and the fix.
fn with_directory_hint(path: &Path, err: anyhow::Error) -> anyhow::Error {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let probe = dir.join(format!(".kine-rs-write-check-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            err
        }
        Err(w) => {
            let who = std::fs::metadata("/proc/self")
                .map_or_else(|_| "?".to_string(), |m| std::os::unix::fs::MetadataExt::uid(&m).to_string());
            err.context(format!(
                "the directory {} takes no new file ({w}): make it writable for this process (uid {who}), or mount it \
                 read-write",
                dir.display()
            ))
        }
    }
}

pub(crate) fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).with_context(|| format!("create directory {}", dir.display()))
}

#[async_trait::async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.member_id
    }

    async fn revisions(&self) -> Result<Revisions> {
        if self.read_only {
            let (current, compacted) = self.readers.read(|conn| Ok(schema::revisions(conn)?)).await?;
            return Ok(Revisions { current, compacted });
        }
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        Ok(Revisions {
            current: self.shared.current.load(Ordering::SeqCst),
            compacted: self.shared.compacted.load(Ordering::SeqCst),
        })
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        let single = req.range.end == kine_core::RangeEnd::Single;
        let counts = self.page_counts.clone();
        let read = move |conn: &rusqlite::Connection| {
            // Revisions from the same snapshot as the data.
            let (current, compacted) = schema::revisions(conn)?;
            let rev = range::read_revision(req.revision, current, compacted)?;
            let mut view = SqlView { conn, revision: current, compacted, appended: 0 };
            let value = range::execute_with(&mut view, &req, rev, Some(&counts))?;
            Ok(Revisioned { revision: current, value })
        };
        if single {
            // One key: an index seek in a mapped file, cheaper than a thread hop.
            return self.readers.read_here(read);
        }
        self.readers.read(read).await
    }

    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.refuse_write()?;
        self.writer.submit(|reply| Job::Write(op, reply)).await
    }

    async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.refuse_write()?;
        self.writer.submit(|reply| Job::Compact { revision, physical: true, reply }).await
    }

    async fn compact_logically(&self, revision: Revision) -> Result<Revision> {
        self.refuse_write()?;
        self.writer.submit(|reply| Job::Compact { revision, physical: false, reply }).await
    }

    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        let range = range.clone();
        self.readers
            .read(move |conn| {
                let (_, compacted) = schema::revisions(conn)?;
                if after + 1 < compacted {
                    return Err(Error::Compacted { compact_revision: compacted });
                }
                Ok(view::events(conn, &range, after, until)?)
            })
            .await
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.shared.feed.subscribe()
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        self.readers
            .read(|conn| {
                let mut stmt =
                    conn.prepare_cached("SELECT id, ttl FROM lease ORDER BY id").context("prepare lease list")?;
                let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).context("list leases")?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>().context("read leases")?)
            })
            .await
    }

    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.readers
            .read(move |conn| {
                let (current, compacted) = schema::revisions(conn)?;
                SqlView { conn, revision: current, compacted, appended: 0 }.keys_with_lease(id, current)
            })
            .await
    }

    async fn status(&self) -> Result<BackendStatus> {
        self.readers
            .read(|conn| {
                let pragma = |name: &str| -> anyhow::Result<i64> {
                    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                        .with_context(|| format!("read PRAGMA {name}"))
                };
                let page_size = pragma("page_size")?;
                let pages = pragma("page_count")?;
                let free = pragma("freelist_count")?;
                Ok(BackendStatus { db_size: pages * page_size, db_size_in_use: (pages - free) * page_size })
            })
            .await
    }

    async fn defragment(&self) -> Result<()> {
        self.refuse_write()?;
        // Idle readers would keep the old file pages alive in their snapshots.
        self.readers.clear();
        self.writer.submit(Job::Defragment).await
    }

    async fn close(&self) {
        self.writer.close().await;
        self.readers.clear();
        if let Some(lock) = &self.lock {
            lock.release();
        }
    }

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        if self.writer.is_stopped() && !self.read_only {
            return Err(stopped());
        }
        self.readers.read(|conn| Ok(crate::auth::sqlite_record(conn)?)).await
    }

    /// On a connection of its own beside the writer thread (one statement, committed at once;
    /// SQLite's file lock orders it with every other writer, of this process or another).
    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.refuse_write()?;
        if self.writer.is_stopped() {
            return Err(stopped());
        }
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> Result<bool> {
            let conn = Connection::open(&path).with_context(|| format!("open {}", path.display()))?;
            conn.busy_timeout(std::time::Duration::from_secs(30)).context("set busy timeout")?;
            conn.pragma_update(None, "synchronous", "FULL").context("set synchronous=FULL")?;
            Ok(crate::auth::sqlite_replace(&conn, expected, &data)?)
        })
        .await
        .map_err(|e| Error::Backend(anyhow::anyhow!("auth write task failed: {e}")))?
    }
}
