//! Go kine's log: the `kine` table Go kine keeps in SQLite, PostgreSQL and MySQL (one row per
//! revision: `id, name, created, deleted, create_revision, prev_revision, lease, value`), read
//! row by row in id order for `kine-rs migrate`. Reading only: nothing is created or written
//! in the database, and SQLite files are opened read-only.
//!
//! Reads of one pass run in one snapshot (a read transaction), so that rows committed meanwhile
//! by a Go kine still running are either all in or all out.

use crate::mysql::MysqlOptions;
use crate::pg::PostgresOptions;
use anyhow::{Context, Result};
use std::path::PathBuf;

/// One row of Go kine's `kine` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoKineRow {
    /// The revision.
    pub id: i64,
    pub name: Vec<u8>,
    pub created: bool,
    pub deleted: bool,
    pub create_revision: i64,
    pub prev_revision: i64,
    /// Go kine's lease: the TTL in seconds (its lease ids are the TTLs).
    pub lease: i64,
    pub value: Vec<u8>,
}

/// Where Go kine's table is.
#[derive(Debug)]
pub enum GoKineDb {
    Sqlite(PathBuf),
    Postgres(PostgresOptions),
    Mysql(MysqlOptions),
}

/// The table at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoKineSummary {
    pub rows: i64,
    /// The newest revision (`MAX(id)`); 0 for an empty table.
    pub max_id: i64,
    /// The compact revision Go kine recorded in its `compact_rev_key` row (0: never compacted).
    pub compact_revision: i64,
}

const COLUMNS: &str = "id, name, created, deleted, create_revision, prev_revision, lease, value";

/// An open read of Go kine's table.
pub enum GoKineLog {
    Sqlite(rusqlite::Connection),
    Postgres(postgres::Client),
    Mysql(mysql::Conn),
}

impl GoKineLog {
    /// Opens `db` for reading; `None` if it holds no `kine` table (a kine-rs datastore, an
    /// empty one, or for SQLite a file that is no database at all). A missing PostgreSQL or
    /// MySQL database is an error: nothing is created.
    pub fn open(db: &GoKineDb) -> Result<Option<GoKineLog>> {
        let mut log = match db {
            GoKineDb::Sqlite(path) => {
                // Not a database (missing, too short, another file): the caller's ordinary
                // open says what it is.
                let mut header = [0u8; 100];
                let read = std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header));
                if read.is_err() || !header.starts_with(b"SQLite format 3\0") {
                    return Ok(None);
                }
                // Nothing written beside the file either (`-shm`, `-wal`).
                let conn = crate::foreign::open_to_look(path, &header)
                    .with_context(|| format!("open {} read-only", path.display()))?;
                // Go kine (k3s) writes with a busy timeout of 30 s; a read waits as long for a
                // checkpoint in progress.
                conn.busy_timeout(std::time::Duration::from_secs(30))?;
                GoKineLog::Sqlite(conn)
            }
            GoKineDb::Postgres(options) => GoKineLog::Postgres(crate::pg::open::connect(options, false)?.1),
            GoKineDb::Mysql(options) => GoKineLog::Mysql(crate::mysql::connect::connect(options, false)?.1),
        };
        Ok(log.has_table("kine")?.then_some(log))
    }

    /// Does the database hold a table `name`?
    pub fn has_table(&mut self, name: &str) -> Result<bool> {
        Ok(match self {
            GoKineLog::Sqlite(c) => {
                c.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1", [name], |r| {
                    r.get::<_, i64>(0)
                })
                .context("read the schema")?
                    > 0
            }
            GoKineLog::Postgres(c) => {
                let row = c
                    .query_one(
                        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() \
                         AND table_name = $1",
                        &[&name],
                    )
                    .context("read the schema")?;
                row.get::<_, i64>(0) > 0
            }
            GoKineLog::Mysql(c) => {
                use mysql::prelude::Queryable;
                let n: Option<i64> = c
                    .exec_first(
                        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
                         AND table_name = ?",
                        (name,),
                    )
                    .context("read the schema")?;
                n.unwrap_or(0) > 0
            }
        })
    }

    /// Starts a snapshot: every read until [`GoKineLog::end`] sees the same rows.
    pub fn begin(&mut self) -> Result<()> {
        match self {
            GoKineLog::Sqlite(c) => c.execute_batch("BEGIN DEFERRED")?,
            GoKineLog::Postgres(c) => c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?,
            GoKineLog::Mysql(c) => {
                use mysql::prelude::Queryable;
                c.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")?;
                c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")?;
            }
        }
        Ok(())
    }

    /// Ends the snapshot.
    pub fn end(&mut self) -> Result<()> {
        match self {
            GoKineLog::Sqlite(c) => c.execute_batch("COMMIT")?,
            GoKineLog::Postgres(c) => c.batch_execute("COMMIT")?,
            GoKineLog::Mysql(c) => {
                use mysql::prelude::Queryable;
                c.query_drop("COMMIT")?
            }
        }
        Ok(())
    }

    pub fn summary(&mut self) -> Result<GoKineSummary> {
        let sql = "SELECT COUNT(*), COALESCE(MAX(id), 0), \
                   (SELECT COALESCE(MAX(prev_revision), 0) FROM kine WHERE name = 'compact_rev_key') FROM kine";
        let (rows, max_id, compact_revision) = match self {
            GoKineLog::Sqlite(c) => c.query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?,
            GoKineLog::Postgres(c) => {
                let sql = "SELECT COUNT(*)::BIGINT, COALESCE(MAX(id), 0)::BIGINT, \
                           (SELECT COALESCE(MAX(prev_revision), 0) FROM kine WHERE name = 'compact_rev_key')::BIGINT \
                           FROM kine";
                let r = c.query_one(sql, &[])?;
                (r.get(0), r.get(1), r.get(2))
            }
            GoKineLog::Mysql(c) => {
                use mysql::prelude::Queryable;
                let sql = "SELECT CAST(COUNT(*) AS SIGNED), CAST(COALESCE(MAX(id), 0) AS SIGNED), \
                           CAST((SELECT COALESCE(MAX(prev_revision), 0) FROM kine WHERE name = 'compact_rev_key') \
                           AS SIGNED) FROM kine";
                c.query_first::<(i64, i64, i64), _>(sql)?.unwrap_or((0, 0, 0))
            }
        };
        Ok(GoKineSummary { rows, max_id, compact_revision })
    }

    /// The newest revision up to `until` below which Go kine's history is known to be
    /// incomplete, whatever its `compact_rev_key` row says (0: none). Go kine's compaction to a
    /// target T deletes a version replaced by a row at or below T, and deletions at or below T:
    /// so a row whose previous version is missing was itself written at or below T (an update
    /// or a deletion: its own revision is a lower bound of T), and a create whose previous row
    /// (the deletion it follows) is missing follows a deletion at or below T (that deletion's
    /// revision is). Bookkeeping rows and rows without a previous row are not looked at.
    pub fn lost_history(&mut self, until: i64) -> Result<i64> {
        let sql = "SELECT COALESCE(MAX(CASE WHEN r.created = 1 THEN r.prev_revision ELSE r.id END), 0) \
                   FROM kine r LEFT JOIN kine p ON p.id = r.prev_revision \
                   WHERE r.prev_revision > 0 AND r.id <= {until} AND r.name != 'compact_rev_key' AND p.id IS NULL";
        let sql = sql.replace("{until}", &until.to_string());
        Ok(match self {
            GoKineLog::Sqlite(c) => c.query_row(&sql, [], |r| r.get(0))?,
            GoKineLog::Postgres(c) => c.query_one(&format!("SELECT ({sql})::BIGINT"), &[])?.get(0),
            GoKineLog::Mysql(c) => {
                use mysql::prelude::Queryable;
                c.query_first::<i64, _>(format!("SELECT CAST(({sql}) AS SIGNED)"))?.unwrap_or(0)
            }
        })
    }

    /// Up to `limit` rows with `after < id <= until`, in id order.
    pub fn rows(&mut self, after: i64, until: i64, limit: usize) -> Result<Vec<GoKineRow>> {
        let limit = limit as i64;
        match self {
            GoKineLog::Sqlite(c) => {
                let sql = format!("SELECT {COLUMNS} FROM kine WHERE id > ?1 AND id <= ?2 ORDER BY id LIMIT ?3");
                let mut stmt = c.prepare_cached(&sql)?;
                let rows = stmt.query_map(rusqlite::params![after, until, limit], |r| {
                    Ok(GoKineRow {
                        id: r.get(0)?,
                        name: bytes(r.get_ref(1)?),
                        created: r.get::<_, Option<i64>>(2)?.unwrap_or(0) != 0,
                        deleted: r.get::<_, Option<i64>>(3)?.unwrap_or(0) != 0,
                        create_revision: r.get::<_, Option<i64>>(4)?.unwrap_or(0),
                        prev_revision: r.get::<_, Option<i64>>(5)?.unwrap_or(0),
                        lease: r.get::<_, Option<i64>>(6)?.unwrap_or(0),
                        value: bytes(r.get_ref(7)?),
                    })
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            }
            GoKineLog::Postgres(c) => {
                // Go kine's older schema has INTEGER revisions (before its first migration).
                let sql = "SELECT id::BIGINT, convert_to(name, 'UTF8'), created, deleted, create_revision::BIGINT, \
                           prev_revision::BIGINT, lease, value FROM kine WHERE id > $1 AND id <= $2 ORDER BY id \
                           LIMIT $3";
                let rows = c.query(sql, &[&after, &until, &limit])?;
                Ok(rows
                    .iter()
                    .map(|r| GoKineRow {
                        id: r.get(0),
                        name: r.get::<_, Option<Vec<u8>>>(1).unwrap_or_default(),
                        created: r.get::<_, Option<i32>>(2).unwrap_or(0) != 0,
                        deleted: r.get::<_, Option<i32>>(3).unwrap_or(0) != 0,
                        create_revision: r.get::<_, Option<i64>>(4).unwrap_or(0),
                        prev_revision: r.get::<_, Option<i64>>(5).unwrap_or(0),
                        lease: r.get::<_, Option<i32>>(6).unwrap_or(0) as i64,
                        value: r.get::<_, Option<Vec<u8>>>(7).unwrap_or_default(),
                    })
                    .collect())
            }
            GoKineLog::Mysql(c) => {
                use mysql::prelude::Queryable;
                let sql = "SELECT CAST(id AS SIGNED), CAST(name AS BINARY), created, deleted, \
                           CAST(create_revision AS SIGNED), CAST(prev_revision AS SIGNED), lease, value FROM kine \
                           WHERE id > ? AND id <= ? ORDER BY id LIMIT ?";
                type Raw =
                    (i64, Vec<u8>, Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<Vec<u8>>);
                let rows: Vec<Raw> = c.exec(sql, (after, until, limit))?;
                Ok(rows
                    .into_iter()
                    .map(|(id, name, created, deleted, create_revision, prev_revision, lease, value)| GoKineRow {
                        id,
                        name,
                        created: created.unwrap_or(0) != 0,
                        deleted: deleted.unwrap_or(0) != 0,
                        create_revision: create_revision.unwrap_or(0),
                        prev_revision: prev_revision.unwrap_or(0),
                        lease: lease.unwrap_or(0),
                        value: value.unwrap_or_default(),
                    })
                    .collect())
            }
        }
    }
}

/// A TEXT or BLOB column as bytes (NULL: empty).
fn bytes(v: rusqlite::types::ValueRef<'_>) -> Vec<u8> {
    match v {
        rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => t.to_vec(),
        _ => Vec::new(),
    }
}
