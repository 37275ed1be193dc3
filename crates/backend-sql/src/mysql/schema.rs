//! The MySQL/MariaDB schema: the same log as SQLite's and PostgreSQL's (`kv`, one row per
//! change; `live`, the index of each live key's newest version; `meta`; `lease`), InnoDB. `meta.revision` is the revision counter every node's
//! writer locks (`FOR UPDATE`) for the length of its transaction; `meta.lease_epoch` counts
//! lease changes (grants, revocations, keep-alives), so each node's feed notices them with one
//! cheap read (MySQL has no LISTEN/NOTIFY). `kine_rs_auth` holds the auth record (`auth.rs`)
//! and `kine_rs_members` the member registry (`members.rs`), both created at start-up if missing.

use anyhow::{Context, Result};
use mysql::prelude::Queryable;

/// 2: the `live` table (version 1 databases get it at start-up).
pub const SCHEMA_VERSION: i64 = 2;

/// The longest key this schema stores: InnoDB limits an index entry to 3072 bytes, and the
/// unique index `(key, mod_revision, sub)` spends 12 of them on the revision.
pub const MAX_KEY_LEN: usize = 3000;

const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS kv (
        mod_revision    BIGINT          NOT NULL,
        sub             INT             NOT NULL,
        `key`           VARBINARY(3000) NOT NULL,
        create_revision BIGINT          NOT NULL,
        version         BIGINT          NOT NULL,
        lease           BIGINT          NOT NULL,
        deleted         BOOLEAN         NOT NULL,
        value           LONGBLOB        NOT NULL,
        PRIMARY KEY (mod_revision, sub),
        UNIQUE KEY kv_key_revision (`key`, mod_revision, sub),
        KEY kv_lease (lease)
    ) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
    "CREATE TABLE IF NOT EXISTS live (
        `key`        VARBINARY(3000) NOT NULL PRIMARY KEY,
        mod_revision BIGINT          NOT NULL,
        sub          INT             NOT NULL
    ) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
    "CREATE TABLE IF NOT EXISTS meta (
        name  VARCHAR(64) NOT NULL PRIMARY KEY,
        value BIGINT      NOT NULL
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS lease (
        id       BIGINT NOT NULL PRIMARY KEY,
        ttl      BIGINT NOT NULL,
        renewals BIGINT NOT NULL DEFAULT 0
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS kine_rs_auth (
        name    VARCHAR(64) NOT NULL PRIMARY KEY,
        version BIGINT      NOT NULL,
        data    LONGBLOB    NOT NULL
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS kine_rs_members (
        id   BIGINT   NOT NULL PRIMARY KEY,
        data LONGBLOB NOT NULL
    ) ENGINE=InnoDB",
];

/// Fills `live` (each live key's newest version, see the SQLite schema) from the log.
const FILL_LIVE: &str = "
INSERT INTO live (`key`, mod_revision, sub)
SELECT k.key, k.mod_revision, k.sub FROM kv k
WHERE NOT k.deleted
  AND NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key
                  AND (n.mod_revision > k.mod_revision OR (n.mod_revision = k.mod_revision AND n.sub > k.sub)))";

#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub revision: i64,
    pub compact_revision: i64,
    pub cluster_id: u64,
}

/// Creates the schema if needed (several nodes may start at once: the first wins, under a
/// named lock) and returns the stored bookkeeping.
pub fn init(conn: &mut mysql::Conn) -> Result<Meta> {
    let locked: Option<i64> =
        conn.query_first("SELECT GET_LOCK('kine_rs_schema', 60)").context("lock schema creation")?;
    if locked != Some(1) {
        anyhow::bail!("another node held the schema lock for 60 s");
    }
    let result = (|| {
        for ddl in DDL {
            conn.query_drop(*ddl).context("create schema")?;
        }
        conn.query_drop("START TRANSACTION").context("begin schema transaction")?;
        match get(conn, "schema_version")? {
            None => {
                set(conn, "schema_version", SCHEMA_VERSION)?;
                set(conn, "revision", 1)?;
                // -1: never compacted (etcd's first revision before any compaction).
                set(conn, "compact_revision", -1)?;
                set(conn, "lease_epoch", 0)?;
                set(conn, "cluster_id", kine_core::id::random_nonzero() as i64)?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(1) => {
                conn.query_drop(FILL_LIVE).context("migrate to schema 2: fill the live table")?;
                set(conn, "schema_version", SCHEMA_VERSION)?;
                tracing::info!("MySQL schema migrated to version 2 (live-key index)");
            }
            Some(other) => {
                anyhow::bail!("database schema version {other} is not supported (this kine-rs knows {SCHEMA_VERSION})")
            }
        }
        let (revision, compact_revision, _) = revisions(conn)?;
        let cluster_id = get(conn, "cluster_id")?.context("meta row cluster_id is missing")? as u64;
        conn.query_drop("COMMIT").context("commit schema")?;
        Ok(Meta { revision, compact_revision, cluster_id })
    })();
    if result.is_err() {
        let _ = conn.query_drop("ROLLBACK");
    }
    let _ = conn.query_drop("DO RELEASE_LOCK('kine_rs_schema')");
    result
}

/// The bookkeeping of an existing database, changing nothing (a read-only open): fails if it
/// holds no kine-rs store of this schema version.
pub fn existing(conn: &mut mysql::Conn) -> Result<Meta> {
    let has_meta: Option<i64> = conn
        .query_first(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'meta'",
        )
        .context("read the schema")?;
    if has_meta != Some(1) {
        anyhow::bail!("no kine-rs store in this database (it has no meta table)");
    }
    conn.query_drop("START TRANSACTION READ ONLY").context("begin a read-only transaction")?;
    let result = (|| {
        match get(conn, "schema_version")? {
            Some(SCHEMA_VERSION) => {}
            Some(1) => anyhow::bail!(
                "the database has schema version 1: serve it once with this kine-rs (which migrates it to version \
                 {SCHEMA_VERSION}) before reading it read-only"
            ),
            Some(other) => {
                anyhow::bail!("database schema version {other} is not supported (this kine-rs knows {SCHEMA_VERSION})")
            }
            None => anyhow::bail!("no kine-rs store in this database (no schema version in its meta table)"),
        }
        let (revision, compact_revision, _) = revisions(conn)?;
        let cluster_id = get(conn, "cluster_id")?.context("meta row cluster_id is missing")? as u64;
        Ok(Meta { revision, compact_revision, cluster_id })
    })();
    let _ = conn.query_drop("COMMIT");
    result
}

/// Current revision, compact revision and lease epoch, as this transaction sees them.
pub fn revisions(c: &mut impl Queryable) -> Result<(i64, i64, i64)> {
    let rows: Vec<(String, i64)> = c
        .query("SELECT name, value FROM meta WHERE name IN ('revision', 'compact_revision', 'lease_epoch')")
        .context("read revisions")?;
    let find = |name: &str| rows.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    Ok((
        find("revision").context("meta row revision is missing")?,
        find("compact_revision").context("meta row compact_revision is missing")?,
        find("lease_epoch").unwrap_or(0),
    ))
}

pub fn get(c: &mut impl Queryable, name: &str) -> Result<Option<i64>> {
    c.exec_first("SELECT value FROM meta WHERE name = ?", (name,)).with_context(|| format!("read meta {name}"))
}

pub fn set(c: &mut impl Queryable, name: &str, value: i64) -> Result<()> {
    c.exec_drop(
        "INSERT INTO meta (name, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)",
        (name, value),
    )
    .with_context(|| format!("write meta {name}"))
}
