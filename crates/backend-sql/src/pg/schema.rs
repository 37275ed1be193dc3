//! The PostgreSQL schema: the same log as SQLite's (`kv`, one row per change; `meta`; `lease`),
//! in PostgreSQL types, and `live`, the index of each live key's newest version. `meta.revision` is the revision counter every node's writer locks
//! (`FOR UPDATE`) for the length of its transaction, so revisions are gap-free and commit in
//! order whatever the number of nodes. `lease.renewals` counts keep-alives (from any node): an
//! expired lease is revoked only if nobody renewed it since this node last heard of it.
//! `kine_rs_auth` holds the auth record (`auth.rs`) and `kine_rs_members` the member registry
//! (`members.rs`), both created at start-up if missing.

use super::conn::Sql;
use anyhow::{Context, Result};
use postgres::types::Type;

/// 2: the `live` table (version 1 databases get it at start-up).
pub const SCHEMA_VERSION: i64 = 2;

/// The longest key kine-rs stores: a B-tree entry holds at most 2704 bytes with 8 KiB pages,
/// and `kv_key_revision` adds the revision and the row's header to the key (a random
/// 2660-byte key fits, 2680 does not). PostgreSQL would compress some longer keys and refuse
/// others; kine-rs refuses every longer key alike.
pub const MAX_KEY_LEN: usize = 2600;

const DDL: &str = "
CREATE TABLE IF NOT EXISTS kv (
    mod_revision    BIGINT  NOT NULL,
    sub             INTEGER NOT NULL,
    key             BYTEA   NOT NULL,
    create_revision BIGINT  NOT NULL,
    version         BIGINT  NOT NULL,
    lease           BIGINT  NOT NULL,
    deleted         BOOLEAN NOT NULL,
    value           BYTEA   NOT NULL,
    PRIMARY KEY (mod_revision, sub)
);
CREATE UNIQUE INDEX IF NOT EXISTS kv_key_revision ON kv (key, mod_revision, sub);
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease) WHERE lease <> 0;
CREATE TABLE IF NOT EXISTS live (key BYTEA PRIMARY KEY, mod_revision BIGINT NOT NULL, sub INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS lease (id BIGINT PRIMARY KEY, ttl BIGINT NOT NULL, renewals BIGINT NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS kine_rs_auth (name TEXT PRIMARY KEY, version BIGINT NOT NULL, data BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS kine_rs_members (id BIGINT PRIMARY KEY, data BYTEA NOT NULL);
";

/// Fills `live` (each live key's newest version, see the SQLite schema) from the log.
const FILL_LIVE: &str = "
INSERT INTO live (key, mod_revision, sub)
SELECT k.key, k.mod_revision, k.sub FROM kv k
WHERE NOT k.deleted
  AND NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND (n.mod_revision, n.sub) > (k.mod_revision, k.sub));
";

#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub revision: i64,
    pub compact_revision: i64,
    pub cluster_id: u64,
}

/// Creates the schema if needed (several nodes may start at once: the first wins, under an
/// advisory lock) and returns the stored bookkeeping.
pub fn init(client: &mut postgres::Client) -> Result<Meta> {
    let mut tx = client.transaction().context("begin schema transaction")?;
    tx.batch_execute("SELECT pg_advisory_xact_lock(7355608)").context("lock schema creation")?;
    tx.batch_execute(DDL).context("create schema")?;
    match get(&mut tx, "schema_version")? {
        None => {
            set(&mut tx, "schema_version", SCHEMA_VERSION)?;
            set(&mut tx, "revision", 1)?;
            // -1: never compacted (etcd's first revision before any compaction).
            set(&mut tx, "compact_revision", -1)?;
            set(&mut tx, "cluster_id", kine_core::id::random_nonzero() as i64)?;
        }
        Some(SCHEMA_VERSION) => {}
        Some(1) => {
            tx.batch_execute(FILL_LIVE).context("migrate to schema 2: fill the live table")?;
            set(&mut tx, "schema_version", SCHEMA_VERSION)?;
            tracing::info!("PostgreSQL schema migrated to version 2 (live-key index)");
        }
        Some(other) => {
            anyhow::bail!("database schema version {other} is not supported (this kine-rs knows {SCHEMA_VERSION})")
        }
    }
    let (revision, compact_revision) = revisions(&mut tx)?;
    let cluster_id = get(&mut tx, "cluster_id")?.context("meta row cluster_id is missing")? as u64;
    tx.commit().context("commit schema")?;
    Ok(Meta { revision, compact_revision, cluster_id })
}

/// The bookkeeping of an existing database, changing nothing (a read-only open): fails if it
/// holds no kine-rs store of this schema version.
pub fn existing(client: &mut postgres::Client) -> Result<Meta> {
    let has_meta =
        client.query_row("SELECT to_regclass('meta') IS NOT NULL", &[]).context("read the schema")?.get::<_, bool>(0);
    if !has_meta {
        anyhow::bail!("no kine-rs store in this database (it has no meta table)");
    }
    let mut tx = client.build_transaction().read_only(true).start().context("begin a read-only transaction")?;
    match get(&mut tx, "schema_version")? {
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
    let (revision, compact_revision) = revisions(&mut tx)?;
    let cluster_id = get(&mut tx, "cluster_id")?.context("meta row cluster_id is missing")? as u64;
    Ok(Meta { revision, compact_revision, cluster_id })
}

/// Current and compact revision, as this transaction sees them.
pub fn revisions(c: &mut impl Sql) -> Result<(i64, i64)> {
    let rows = c
        .query_rows("SELECT name, value FROM meta WHERE name IN ('revision', 'compact_revision')", &[])
        .context("read revisions")?;
    let (mut rev, mut compact) = (None, None);
    for row in rows {
        let name: &str = row.get(0);
        if name == "revision" {
            rev = Some(row.get::<_, i64>(1));
        } else {
            compact = Some(row.get::<_, i64>(1));
        }
    }
    Ok((rev.context("meta row revision is missing")?, compact.context("meta row compact_revision is missing")?))
}

pub fn get(c: &mut impl Sql, name: &str) -> Result<Option<i64>> {
    Ok(c.query_maybe("SELECT value FROM meta WHERE name = $1", &[(&name, Type::TEXT)])
        .with_context(|| format!("read meta {name}"))?
        .map(|r| r.get(0)))
}

pub fn set(c: &mut impl Sql, name: &str, value: i64) -> Result<()> {
    c.execute_sql(
        "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        &[(&name, Type::TEXT), (&value, Type::INT8)],
    )
    .with_context(|| format!("write meta {name}"))?;
    Ok(())
}
