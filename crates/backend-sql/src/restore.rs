//! Restoring a snapshot (`kine-rs snapshot restore`) into a new SQLite database: the versions
//! of the keys it holds as they were (revision, create revision, version, lease; deletions from
//! an etcd snapshot's history too), the leases, the revision and the compact revision, and the
//! users and roles. A kine-rs snapshot holds each live key's version at its revision, which is
//! then also the compact revision; an etcd snapshot holds the history since its compaction.

use crate::schema;
use anyhow::{Context, Result, bail};
use kine_core::auth::state::AuthState;
use kine_core::snapshot::Snapshot;
use kine_core::types::{KeyValue, LeaseId};
use rusqlite::{Connection, params};
use std::collections::HashMap;
use std::path::Path;

/// One version of a key: its revision and sub revision (the changes of one Txn share the
/// revision), and whether it is a deletion (then only `kv.key` matters).
#[derive(Clone, Debug)]
pub struct Row {
    pub revision: i64,
    pub sub: i64,
    pub deleted: bool,
    pub kv: KeyValue,
}

/// What a restore writes besides the versions.
#[derive(Clone, Debug, Default)]
pub struct Restored {
    /// The store's revision; `None`: the newest version's or the compact revision (at least 1).
    pub revision: Option<i64>,
    /// -1: never compacted.
    pub compact_revision: i64,
    pub leases: Vec<(LeaseId, i64)>,
    pub auth: Option<AuthState>,
}

/// Writes `snap` into a new database at `path`; an existing file is never touched.
pub fn restore_sqlite(path: &Path, snap: &Snapshot) -> Result<(i64, u64)> {
    // Keys written by one Txn share a mod revision; `sub` tells them apart.
    let mut subs: HashMap<i64, i64> = HashMap::new();
    let rows = snap
        .kvs
        .iter()
        .map(|kv| {
            let sub = subs.entry(kv.mod_revision).or_insert(0);
            *sub += 1;
            Row { revision: kv.mod_revision, sub: *sub - 1, deleted: false, kv: kv.clone() }
        })
        .collect::<Vec<_>>();
    let restored = Restored {
        revision: Some(snap.revision),
        compact_revision: snap.revision,
        leases: snap.leases.clone(),
        auth: None,
    };
    let mut rows = Some(rows);
    restore_sqlite_rows(path, &restored, &mut || Ok(rows.take()))
}

/// Writes the versions `next` returns (batch by batch, until `None`) and `restored` into a new
/// database at `path`, in one transaction; an existing file is never touched, and a failed
/// restore leaves no file behind. Returns the revision and the number of live keys.
pub fn restore_sqlite_rows(
    path: &Path,
    restored: &Restored,
    next: &mut dyn FnMut() -> Result<Option<Vec<Row>>>,
) -> Result<(i64, u64)> {
    if path.exists() {
        bail!("{} already exists: restore writes a new database only (move the old one away first)", path.display());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::sqlite::create_private_dir(dir)?;
    }
    let written = write(path, restored, next);
    if written.is_err() {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
    written
}

fn write(path: &Path, restored: &Restored, next: &mut dyn FnMut() -> Result<Option<Vec<Row>>>) -> Result<(i64, u64)> {
    let mut conn = Connection::open(path).with_context(|| format!("create SQLite database {}", path.display()))?;
    schema::configure(&conn)?;
    schema::init(&mut conn)?;
    let tx = conn.transaction().context("begin restore transaction")?;
    let mut newest = 0;
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO kv (mod_revision, sub, key, create_revision, version, lease, deleted, value)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .context("prepare key insert")?;
        while let Some(rows) = next()? {
            for Row { revision, sub, deleted, kv } in rows {
                newest = newest.max(revision);
                if restored.revision.is_some_and(|r| revision > r) || (!deleted && kv.create_revision > revision) {
                    bail!("the snapshot is inconsistent: key {:?} has revisions past the snapshot's", kv.key);
                }
                insert
                    .execute(params![
                        revision,
                        sub,
                        kv.key,
                        kv.create_revision,
                        kv.version,
                        kv.lease,
                        i64::from(deleted),
                        kv.value
                    ])
                    .with_context(|| format!("insert the version of key {:?} at revision {revision}", kv.key))?;
            }
        }
        let mut lease = tx.prepare("INSERT INTO lease (id, ttl) VALUES (?1, ?2)").context("prepare lease insert")?;
        for (id, ttl) in &restored.leases {
            lease.execute(params![id, ttl]).context("insert lease")?;
        }
    }
    if let Some(auth) = &restored.auth {
        crate::auth::sqlite_replace(&tx, None, &auth.encode()).context("write the auth record")?;
    }
    tx.execute_batch(schema::FILL_LIVE).context("index the newest versions")?;
    let revision = restored.revision.unwrap_or(newest.max(restored.compact_revision).max(1));
    schema::set(&tx, "revision", revision)?;
    schema::set(&tx, "compact_revision", restored.compact_revision)?;
    let live: i64 = tx.query_row("SELECT COUNT(*) FROM live", [], |r| r.get(0)).context("count the live keys")?;
    tx.commit().context("commit restore")?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").context("checkpoint")?;
    Ok((revision, live as u64))
}
