//! The SQLite schema and its bookkeeping rows.
//!
//! `kv` holds one row per change of a key: a put (`deleted = 0`) or a deletion (`deleted = 1`).
//! A revision may hold several rows (one Txn touching several keys); `sub` orders them. One key
//! can even change twice in one revision (etcd allows a nested txn to put a key that a later
//! nested txn deletes), so a key's latest version is the one with the greatest
//! `(mod_revision, sub)`, never just the greatest `mod_revision`.
//! `live` indexes each live key's newest version (`key → (mod_revision, sub)`; a deleted key
//! has no row): reads at the newest revision — nearly all of them — list and count through it
//! instead of searching each key's history. It changes in the same transaction as `kv`.
//! `meta` holds the current and compact revisions and the store's ids; `lease` the leases;
//! `kine_rs_auth` the auth record (`auth.rs`; added without a schema version: every start
//! creates it if missing). None of this bookkeeping consumes a revision.

use anyhow::{Context, Result};
use rusqlite::{Connection, OptionalExtension, params};

/// 2: the `live` table (version 1 databases get it at start-up).
/// 3: `kv` is a rowid table with a unique `(mod_revision, sub)` index instead of a table
/// clustered on that key (`WITHOUT ROWID`): a Kubernetes object (1–4 KiB) does not fit in a
/// b-tree cell, and SQLite compares a clustered key by reading the whole overflowing record, so
/// every seek into the old table copied whole values (a page of 500 objects: 3.5 ms → 0.7 ms
/// of SQL; the file is 24 % smaller). Version 1 and 2 databases are rebuilt at start-up.
pub const SCHEMA_VERSION: i64 = 3;

/// The `kv` table of schema 3 (created when missing), for a new database and for the rebuild.
macro_rules! kv_table {
    () => {
        "
CREATE TABLE IF NOT EXISTS kv (
    mod_revision    INTEGER NOT NULL,
    sub             INTEGER NOT NULL,
    key             BLOB    NOT NULL,
    create_revision INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    lease           INTEGER NOT NULL,
    deleted         INTEGER NOT NULL,
    value           BLOB    NOT NULL
);
"
    };
}

/// Every table, created when missing (a new database gets schema 3 at once).
const TABLES: &str = concat!(
    kv_table!(),
    "
CREATE TABLE IF NOT EXISTS live (
    key          BLOB    PRIMARY KEY,
    mod_revision INTEGER NOT NULL,
    sub          INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kine_rs_auth (name TEXT PRIMARY KEY, version INTEGER NOT NULL, data BLOB NOT NULL);
"
);

/// The indexes of `kv`, created after the table is filled when it is rebuilt.
const INDEXES: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS kv_revision ON kv (mod_revision, sub);
CREATE UNIQUE INDEX IF NOT EXISTS kv_key_revision ON kv (key, mod_revision, sub);
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease) WHERE lease != 0;
";

/// Schema 1 or 2 → 3: `kv`, a `WITHOUT ROWID` table there, copied into a rowid table (in
/// revision order); its indexes are created again by `INDEXES`.
const REBUILD_KV: &str = concat!(
    "
DROP INDEX IF EXISTS kv_key_revision;
DROP INDEX IF EXISTS kv_lease;
ALTER TABLE kv RENAME TO kv_schema_2;
",
    kv_table!(),
    "
INSERT INTO kv (mod_revision, sub, key, create_revision, version, lease, deleted, value)
SELECT mod_revision, sub, key, create_revision, version, lease, deleted, value FROM kv_schema_2
ORDER BY mod_revision, sub;
DROP TABLE kv_schema_2;
"
);

/// Fills `live` from the log (schema 1 → 2).
pub const FILL_LIVE: &str = "
INSERT INTO live (key, mod_revision, sub)
SELECT k.key, k.mod_revision, k.sub FROM kv k
WHERE k.deleted = 0
  AND NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND (n.mod_revision, n.sub) > (k.mod_revision, k.sub));
";

/// How much of the database file a connection maps (SQLite caps it at its compile-time
/// maximum, 2 GiB in the bundled build; the rest is read as usual).
const MMAP_BYTES: i64 = 1 << 31;

/// Settings every connection gets. WAL lets readers run beside the writer; `synchronous=FULL`
/// makes every commit durable (the writer batches commits, so this costs one fsync per batch).
pub fn configure(conn: &Connection) -> Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(30)).context("set busy timeout")?;
    conn.pragma_update(None, "journal_mode", "WAL").context("enable WAL")?;
    conn.pragma_update(None, "synchronous", "FULL").context("set synchronous=FULL")?;
    conn.pragma_update(None, "foreign_keys", "OFF").context("set foreign_keys")?;
    tune(conn)
}

/// Settings of every connection, the read pool's too.
///
/// Reads map the database file instead of copying each page through pread (a page of 500
/// objects spent most of its time in the kernel copying pages). Address space only: pages are
/// resident while the OS keeps them cached.
///
/// Plans never depend on bound values (SQLite's query planner stability guarantee). Without
/// it, planning any query on `kv` asks whether its parameters make the partial index
/// `kv_lease` usable, which marks the statement as value-dependent, and SQLite then compiles
/// it again every time it is reused: a single-key read spent 12.6 µs instead of 2.2 µs, most
/// of it in the parser and planner. Queries meant for `kv_lease` state `lease != 0` themselves.
pub fn tune(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "mmap_size", MMAP_BYTES).context("set mmap_size")?;
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .context("enable the query planner stability guarantee")?;
    Ok(())
}

#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub revision: i64,
    pub compact_revision: i64,
    pub cluster_id: u64,
    pub member_id: u64,
}

/// Creates the schema if needed and returns the stored bookkeeping.
pub fn init(conn: &mut Connection) -> Result<Meta> {
    let tx =
        conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).context("begin schema transaction")?;
    tx.execute_batch(TABLES).context("create schema")?;
    let version = get(&tx, "schema_version")?;
    let mut rebuilt = false;
    match version {
        None => {
            set(&tx, "schema_version", SCHEMA_VERSION)?;
            set(&tx, "revision", 1)?;
            // -1: never compacted (etcd's first revision before any compaction).
            set(&tx, "compact_revision", -1)?;
            set(&tx, "cluster_id", kine_core::id::random_nonzero() as i64)?;
            set(&tx, "member_id", kine_core::id::random_nonzero() as i64)?;
        }
        Some(SCHEMA_VERSION) => {}
        Some(old @ (1 | 2)) => {
            if old == 1 {
                tx.execute_batch(FILL_LIVE).context("migrate to schema 2: fill the live table")?;
            }
            let started = std::time::Instant::now();
            tx.execute_batch(REBUILD_KV).context("migrate to schema 3: rebuild the kv table")?;
            set(&tx, "schema_version", SCHEMA_VERSION)?;
            rebuilt = true;
            tracing::info!(
                from = old,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "SQLite schema migrated to version 3 (live-key index, kv as a rowid table)"
            );
        }
        Some(other) => {
            anyhow::bail!("database schema version {other} is not supported (this kine-rs knows {SCHEMA_VERSION})")
        }
    }
    tx.execute_batch(INDEXES).context("create the kv indexes")?;
    let meta = read_meta(&tx)?;
    tx.commit().context("commit schema")?;
    if rebuilt {
        // The old table's pages are free now: give them back (the file would otherwise keep
        // twice the data's size), and empty the WAL that the copy filled.
        let started = std::time::Instant::now();
        conn.execute_batch("VACUUM").context("VACUUM after the migration")?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).context("checkpoint after the migration")?;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "SQLite database compacted after the migration"
        );
    }
    Ok(meta)
}

/// The bookkeeping of an existing database, changing nothing (a read-only open): fails if the
/// file is not a kine-rs database of this schema version.
pub fn existing(conn: &Connection) -> Result<Meta> {
    let has_meta: bool = conn
        .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |r| r.get(0))
        .context("read the schema (is this an SQLite database?)")?;
    if !has_meta {
        anyhow::bail!("not a kine-rs database (it has no meta table)");
    }
    match get(conn, "schema_version")? {
        Some(SCHEMA_VERSION) => read_meta(conn),
        Some(old @ (1 | 2)) => anyhow::bail!(
            "the database has schema version {old}: serve it once with this kine-rs (which migrates it to version \
             {SCHEMA_VERSION}) before reading it read-only"
        ),
        Some(other) => {
            anyhow::bail!("database schema version {other} is not supported (this kine-rs knows {SCHEMA_VERSION})")
        }
        None => anyhow::bail!("not a kine-rs database (no schema version in its meta table)"),
    }
}

pub fn read_meta(conn: &Connection) -> Result<Meta> {
    let need = |name: &str| -> Result<i64> { get(conn, name)?.with_context(|| format!("meta row {name} is missing")) };
    Ok(Meta {
        revision: need("revision")?,
        compact_revision: need("compact_revision")?,
        cluster_id: need("cluster_id")? as u64,
        member_id: need("member_id")? as u64,
    })
}

/// Current and compact revision, as this connection's transaction sees them.
pub fn revisions(conn: &Connection) -> Result<(i64, i64)> {
    let mut stmt =
        conn.prepare_cached("SELECT name, value FROM meta WHERE name IN ('revision', 'compact_revision')")?;
    let mut rows = stmt.query([])?;
    let (mut rev, mut compact) = (None, None);
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let value: i64 = row.get(1)?;
        if name == "revision" {
            rev = Some(value);
        } else {
            compact = Some(value);
        }
    }
    Ok((rev.context("meta row revision is missing")?, compact.context("meta row compact_revision is missing")?))
}

pub fn get(conn: &Connection, name: &str) -> Result<Option<i64>> {
    conn.prepare_cached("SELECT value FROM meta WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()
        .with_context(|| format!("read meta {name}"))
}

pub fn set(conn: &Connection, name: &str, value: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![name, value])
    .with_context(|| format!("write meta {name}"))?;
    Ok(())
}
