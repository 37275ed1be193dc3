//! MySQL's compaction SQL: the logical step (`schedule`, on the writer's connection) locks the
//! compact revision row, which other nodes' writers read without locking; a removal batch
//! (`compact_worker.rs`, on a READ COMMITTED connection of its own) lists the next log rows, then their keys' superseded versions
//! (MySQL cannot delete from a table that a subquery of the same statement reads), and deletes
//! those by primary key. The writers never touch old versions, and READ COMMITTED takes no gap
//! locks, so they never wait for a batch.

use super::{Connector, Role, connection_lost, schema, unavailable};
use crate::compact_worker::Compaction;
use crate::removal::{BATCH_ROWS, REMOVED, Removal};
use anyhow::Context;
use kine_core::{Error, Result, Revision, txn};
use mysql::prelude::Queryable;

/// Superseded versions deleted per statement.
const DELETE_CHUNK: usize = 500;

pub struct MyCompaction(pub Connector);

/// A compaction's logical step, on the writer's connection: one short transaction under a
/// lock on the compact revision (so two nodes never compact at once) checks `revision` against
/// the database's revisions and records it. Returns the current revision and the removal now
/// owed; a lost connection is `Unavailable`.
pub fn schedule(c: &mut mysql::Conn, revision: Revision) -> Result<(Revision, Removal)> {
    c.query_drop("START TRANSACTION").context("begin compaction").map_err(error)?;
    let result = (|| -> Result<(Revision, Removal)> {
        let previous: i64 = c
            .query_first("SELECT value FROM meta WHERE name = 'compact_revision' FOR UPDATE")
            .context("lock the compact revision")
            .map_err(error)?
            .ok_or_else(|| Error::Backend(anyhow::anyhow!("meta row compact_revision is missing")))?;
        let current = schema::get(c, "revision").map_err(error)?.unwrap_or(1);
        txn::check_compact(revision, current, previous)?;
        let removed = schema::get(c, REMOVED).map_err(error)?.unwrap_or(previous);
        schema::set(c, "compact_revision", revision).map_err(error)?;
        // Recorded for databases compacted before the row existed; never lowered.
        c.exec_drop("INSERT IGNORE INTO meta (name, value) VALUES (?, ?)", (REMOVED, removed))
            .context("record the removal owed")
            .map_err(error)?;
        c.query_drop("COMMIT").context("commit compaction").map_err(error)?;
        Ok((current, Removal::new(removed, revision)))
    })();
    if result.is_err() {
        let _ = c.query_drop("ROLLBACK");
    }
    result
}

fn error(e: anyhow::Error) -> Error {
    if connection_lost(&e) { unavailable(&e) } else { Error::Backend(e) }
}

impl Compaction for MyCompaction {
    type Conn = mysql::Conn;
    const LABEL: &'static str = "mysql";

    fn open(&self) -> anyhow::Result<mysql::Conn> {
        let mut conn = self.0.connect(Role::Writer)?;
        // A batch blocked by another session's lock fails and is retried later, so that a
        // shutdown never waits on it for long.
        conn.query_drop("SET SESSION innodb_lock_wait_timeout = 5").context("set the compactor's lock timeout")?;
        Ok(conn)
    }

    fn usable(conn: &mut mysql::Conn) -> bool {
        conn.ping().is_ok()
    }

    fn owed(c: &mut mysql::Conn) -> anyhow::Result<Option<Removal>> {
        let (_, compacted, _) = schema::revisions(c)?;
        Ok(Removal::owed(schema::get(c, REMOVED)?, compacted))
    }

    fn remove_batch(c: &mut mysql::Conn, removal: &mut Removal) -> anyhow::Result<bool> {
        let (after, sub, to) = (removal.cursor.0, removal.cursor.1, removal.to);
        let touched: Vec<(i64, i64, Vec<u8>)> = c
            .exec(
                "SELECT mod_revision, sub, `key` FROM kv
                 WHERE (mod_revision > ? OR (mod_revision = ? AND sub > ?)) AND mod_revision <= ?
                 ORDER BY mod_revision, sub LIMIT ?",
                (after, after, sub, to, BATCH_ROWS),
            )
            .context("list changed keys")?;
        let Some(&(last_revision, last_sub, _)) = touched.last() else { return Ok(false) };
        let mut keys: Vec<Vec<u8>> = touched.into_iter().map(|(_, _, key)| key).collect();
        keys.sort_unstable();
        keys.dedup();
        let marks = vec!["?"; keys.len()].join(", ");
        let mut args: Vec<mysql::Value> = keys.into_iter().map(mysql::Value::Bytes).collect();
        args.extend([to, to, to].map(mysql::Value::Int));
        let doomed: Vec<(i64, i64)> = c
            .exec(
                format!(
                    "SELECT k.mod_revision, k.sub FROM kv k
                     WHERE k.`key` IN ({marks}) AND k.mod_revision <= ?
                       AND ((k.deleted AND k.mod_revision < ?)
                            OR EXISTS (SELECT 1 FROM kv n WHERE n.`key` = k.`key` AND n.mod_revision <= ?
                                       AND (n.mod_revision > k.mod_revision
                                            OR (n.mod_revision = k.mod_revision AND n.sub > k.sub))))"
                ),
                args,
            )
            .context("find superseded versions")?;
        for chunk in doomed.chunks(DELETE_CHUNK) {
            let cond = vec!["(mod_revision = ? AND sub = ?)"; chunk.len()].join(" OR ");
            let args: Vec<mysql::Value> =
                chunk.iter().flat_map(|(r, s)| [mysql::Value::Int(*r), mysql::Value::Int(*s)]).collect();
            c.exec_drop(format!("DELETE FROM kv WHERE {cond}"), args).context("delete superseded versions")?;
        }
        removal.cursor = (last_revision, last_sub);
        Ok(true)
    }

    fn finish(c: &mut mysql::Conn, to: Revision) -> anyhow::Result<()> {
        c.exec_drop("UPDATE meta SET value = ? WHERE name = ? AND value < ?", (to, REMOVED, to))
            .context("record the removal of compacted versions")
    }
}
