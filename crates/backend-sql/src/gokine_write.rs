//! Writing Go kine's table (`kine-rs migrate --to-go-kine`): Go kine's schema — the table,
//! column types and index names Go kine v0.17.x creates, so that Go kine started on the
//! database finds its own — in a new SQLite file or a PostgreSQL/MySQL database without a
//! `kine` table, then the rows with their ids (their revisions), all in one transaction: an
//! interrupted conversion leaves nothing a rerun refuses, and running it again starts afresh.
//! A new SQLite file is written beside its path (`<file>.kine-rs-partial`) and renamed to it
//! once committed, so the path never names half a table, even after SIGKILL; MySQL commits DDL
//! at once, so an empty `kine` table (Go kine's start always writes a row) is a table an
//! interrupted conversion left, and is dropped before starting again.

use crate::gokine_log::GoKineDb;
use anyhow::{Context, Result, bail};

/// A row to write: Go kine's columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoKineRowOut {
    pub id: i64,
    pub name: Vec<u8>,
    pub created: bool,
    pub deleted: bool,
    pub create_revision: i64,
    pub prev_revision: i64,
    pub lease: i64,
    /// `None`: NULL (deletions and fill rows).
    pub value: Option<Vec<u8>>,
    pub old_value: Option<Vec<u8>>,
}

/// Go kine's table being written, in one transaction.
pub enum GoKineWriter {
    /// The connection to the partial file, and the path it is renamed to.
    Sqlite(rusqlite::Connection, std::path::PathBuf),
    Postgres(postgres::Client),
    Mysql(mysql::Conn),
}

const INDEXES: [&str; 5] = [
    "CREATE INDEX kine_name_index ON kine (name)",
    "CREATE INDEX kine_name_id_index ON kine (name,id)",
    "CREATE INDEX kine_id_deleted_index ON kine (id,deleted)",
    "CREATE INDEX kine_prev_revision_index ON kine (prev_revision)",
    "CREATE UNIQUE INDEX kine_name_prev_revision_uindex ON kine (name, prev_revision)",
];

impl GoKineWriter {
    /// Creates Go kine's schema in `db` and begins the transaction. The SQLite file must not
    /// exist yet (or be empty); a PostgreSQL or MySQL database is created if missing and must
    /// hold no `kine` table.
    pub fn create(db: &GoKineDb) -> Result<GoKineWriter> {
        let mut writer = match db {
            GoKineDb::Sqlite(path) => {
                if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
                    bail!("{} exists: Go kine's table is written into a new file", path.display());
                }
                let partial = partial(path);
                if partial.exists() {
                    tracing::info!(file = %partial.display(), "removing what an interrupted conversion left");
                }
                remove_sqlite(&partial);
                let conn =
                    rusqlite::Connection::open(&partial).with_context(|| format!("create {}", partial.display()))?;
                // Go kine's own default journal: it opens the file in WAL mode.
                conn.pragma_update(None, "journal_mode", "WAL")?;
                GoKineWriter::Sqlite(conn, path.clone())
            }
            GoKineDb::Postgres(options) => GoKineWriter::Postgres(crate::pg::open::connect(options, true)?.1),
            GoKineDb::Mysql(options) => GoKineWriter::Mysql(crate::mysql::connect::connect(options, true)?.1),
        };
        writer.schema()?;
        Ok(writer)
    }

    fn schema(&mut self) -> Result<()> {
        match self {
            GoKineWriter::Sqlite(c, _) => {
                c.execute_batch("BEGIN IMMEDIATE")?;
                c.execute_batch(
                    "CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, \
                     deleted INTEGER, create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB, \
                     old_value BLOB)",
                )?;
                for index in INDEXES {
                    c.execute_batch(index)?;
                }
                c.execute_batch(
                    "CREATE INDEX kine_id_compact_rev_key_with_prev_revision_index ON kine(id, name, prev_revision) \
                     WHERE name != 'compact_rev_key' AND prev_revision != 0",
                )?;
            }
            GoKineWriter::Postgres(c) => {
                let mut tx = c.transaction()?;
                let exists: i64 = tx
                    .query_one(
                        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() \
                         AND table_name = 'kine'",
                        &[],
                    )?
                    .get(0);
                if exists > 0 {
                    bail!("the database holds a table kine already: Go kine's table is written into a new database");
                }
                tx.commit()?;
                c.batch_execute("BEGIN")?;
                c.batch_execute(
                    "CREATE TABLE kine (id BIGSERIAL PRIMARY KEY, name text COLLATE \"C\", created INTEGER, \
                     deleted INTEGER, create_revision BIGINT, prev_revision BIGINT, lease INTEGER, value bytea, \
                     old_value bytea)",
                )?;
                for index in INDEXES {
                    c.batch_execute(index)?;
                }
                c.batch_execute("CREATE INDEX kine_list_query_index on kine(name, id DESC, deleted)")?;
            }
            GoKineWriter::Mysql(c) => {
                use mysql::prelude::Queryable;
                let exists: Option<i64> = c.query_first(
                    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
                     AND table_name = 'kine'",
                )?;
                if exists.unwrap_or(0) > 0 {
                    let rows: Option<i64> = c.query_first("SELECT COUNT(*) FROM kine")?;
                    if rows.unwrap_or(0) > 0 {
                        bail!(
                            "the database holds a table kine already: Go kine's table is written into a new database"
                        );
                    }
                    tracing::info!("dropping the empty table kine an interrupted conversion left");
                    c.query_drop("DROP TABLE kine")?;
                }
                // MySQL commits DDL at once: the table is created first, then the rows go in
                // one transaction; a failed conversion drops the table again (`abandon`).
                c.query_drop(
                    "CREATE TABLE kine (id BIGINT UNSIGNED AUTO_INCREMENT, name VARCHAR(630) CHARACTER SET ascii, \
                     created INTEGER, deleted INTEGER, create_revision BIGINT UNSIGNED, prev_revision BIGINT \
                     UNSIGNED, lease INTEGER, value MEDIUMBLOB, old_value MEDIUMBLOB, PRIMARY KEY (id))",
                )?;
                for index in INDEXES {
                    c.query_drop(index)?;
                }
                c.query_drop("START TRANSACTION")?;
            }
        }
        Ok(())
    }

    /// Writes `rows` (ids as given).
    pub fn insert(&mut self, rows: &[GoKineRowOut]) -> Result<()> {
        match self {
            GoKineWriter::Sqlite(c, _) => {
                let mut stmt = c.prepare_cached(
                    "INSERT INTO kine (id, name, created, deleted, create_revision, prev_revision, lease, value, \
                     old_value) VALUES (?1, CAST(?2 AS TEXT), ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )?;
                for r in rows {
                    stmt.execute(rusqlite::params![
                        r.id,
                        r.name,
                        r.created as i64,
                        r.deleted as i64,
                        r.create_revision,
                        r.prev_revision,
                        r.lease,
                        r.value,
                        r.old_value
                    ])?;
                }
            }
            GoKineWriter::Postgres(c) => {
                let stmt = c.prepare(
                    "INSERT INTO kine (id, name, created, deleted, create_revision, prev_revision, lease, value, \
                     old_value) VALUES ($1, convert_from($2, 'UTF8'), $3, $4, $5, $6, $7, $8, $9)",
                )?;
                for r in rows {
                    let lease = i32::try_from(r.lease).context("a lease's TTL does not fit Go kine's lease column")?;
                    c.execute(
                        &stmt,
                        &[
                            &r.id,
                            &r.name,
                            &(r.created as i32),
                            &(r.deleted as i32),
                            &r.create_revision,
                            &r.prev_revision,
                            &lease,
                            &r.value,
                            &r.old_value,
                        ],
                    )?;
                }
            }
            GoKineWriter::Mysql(c) => {
                use mysql::prelude::Queryable;
                let params: Vec<mysql::Params> = rows
                    .iter()
                    .map(|r| {
                        (
                            r.id,
                            r.name.clone(),
                            r.created as i64,
                            r.deleted as i64,
                            r.create_revision,
                            r.prev_revision,
                            r.lease,
                            r.value.clone(),
                            r.old_value.clone(),
                        )
                            .into()
                    })
                    .collect();
                c.exec_batch(
                    "INSERT INTO kine (id, name, created, deleted, create_revision, prev_revision, lease, value, \
                     old_value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    params,
                )?;
            }
        }
        Ok(())
    }

    /// Commits; PostgreSQL's id sequence moved past the ids written, so that Go kine's next row
    /// takes the next revision.
    pub fn finish(self) -> Result<()> {
        match self {
            GoKineWriter::Sqlite(c, path) => {
                c.execute_batch("COMMIT")?;
                // Everything into the file itself, then the file renamed to its path.
                c.pragma_update(None, "wal_checkpoint", "TRUNCATE")?;
                c.close().map_err(|(_, e)| e)?;
                let partial = partial(&path);
                std::fs::rename(&partial, &path)
                    .with_context(|| format!("rename {} to {}", partial.display(), path.display()))?;
                remove_sqlite(&partial);
            }
            GoKineWriter::Postgres(mut c) => {
                c.batch_execute("SELECT setval(pg_get_serial_sequence('kine', 'id'), (SELECT MAX(id) FROM kine))")?;
                c.batch_execute("COMMIT")?;
            }
            GoKineWriter::Mysql(mut c) => {
                use mysql::prelude::Queryable;
                c.query_drop("COMMIT")?
            }
        }
        Ok(())
    }

    /// Undoes what was written (SQLite: removes the new file; MySQL: drops the table its DDL
    /// committed).
    pub fn abandon(self) {
        match self {
            GoKineWriter::Sqlite(c, path) => {
                let _ = c.execute_batch("ROLLBACK");
                drop(c);
                remove_sqlite(&partial(&path));
            }
            GoKineWriter::Postgres(mut c) => {
                let _ = c.batch_execute("ROLLBACK");
            }
            GoKineWriter::Mysql(mut c) => {
                use mysql::prelude::Queryable;
                let _ = c.query_drop("ROLLBACK");
                let _ = c.query_drop("DROP TABLE kine");
            }
        }
    }
}

/// Where a new SQLite file is written until it is complete.
fn partial(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".kine-rs-partial");
    name.into()
}

/// Removes an SQLite file and its WAL and shared-memory files, if there.
fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        let _ = std::fs::remove_file(std::path::PathBuf::from(name));
    }
}
