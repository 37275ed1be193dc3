//! Restoring a snapshot (`kine-rs snapshot restore`) into a new SQLite database: each key's
//! version as it was (create/mod revision, version, lease), the leases, and the revision, which
//! is also the compact revision (a snapshot holds no older history), and the users and roles an
//! etcd snapshot holds.

use crate::schema;
use anyhow::{Context, Result, bail};
use kine_core::snapshot::Snapshot;
use rusqlite::{Connection, params};
use std::collections::HashMap;
use std::path::Path;

/// Writes `snap` into a new database at `path`; an existing file is never touched.
pub fn restore_sqlite(path: &Path, snap: &Snapshot) -> Result<()> {
    if path.exists() {
        bail!("{} already exists: restore writes a new database only (move the old one away first)", path.display());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::sqlite::create_private_dir(dir)?;
    }
    let mut conn = Connection::open(path).with_context(|| format!("create SQLite database {}", path.display()))?;
    schema::configure(&conn)?;
    schema::init(&mut conn)?;
    let tx = conn.transaction().context("begin restore transaction")?;
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO kv (mod_revision, sub, key, create_revision, version, lease, deleted, value)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7)",
            )
            .context("prepare key insert")?;
        // Keys written by one Txn share a mod revision; `sub` tells them apart.
        let mut subs: HashMap<i64, i64> = HashMap::new();
        for kv in &snap.kvs {
            if kv.mod_revision > snap.revision || kv.create_revision > kv.mod_revision {
                bail!("the snapshot is inconsistent: key {:?} has revisions past the snapshot's", kv.key);
            }
            let sub = subs.entry(kv.mod_revision).or_insert(0);
            insert
                .execute(params![kv.mod_revision, *sub, kv.key, kv.create_revision, kv.version, kv.lease, kv.value])
                .context("insert key")?;
            *sub += 1;
        }
        let mut lease = tx.prepare("INSERT INTO lease (id, ttl) VALUES (?1, ?2)").context("prepare lease insert")?;
        for (id, ttl) in &snap.leases {
            lease.execute(params![id, ttl]).context("insert lease")?;
        }
    }
    if let Some(auth) = &snap.auth {
        crate::auth::sqlite_replace(&tx, None, &auth.encode()).context("write the auth record")?;
    }
    tx.execute_batch(schema::FILL_LIVE).context("index the newest versions")?;
    schema::set(&tx, "revision", snap.revision)?;
    schema::set(&tx, "compact_revision", snap.revision)?;
    tx.commit().context("commit restore")?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").context("checkpoint")?;
    Ok(())
}
