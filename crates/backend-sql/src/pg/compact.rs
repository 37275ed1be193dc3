//! PostgreSQL's compaction SQL: the logical step (`schedule`, on the writer's connection) locks
//! the compact revision row, which other nodes' writers only read (MVCC: they never wait for
//! it); each removal batch (`compact_worker.rs`, on a connection of its own) is one statement,
//! deleting old versions the writers never touch.

use super::conn::{Conn, Sql};
use super::{Connector, schema};
use crate::compact_worker::Compaction;
use crate::removal::{BATCH_ROWS, REMOVED, Removal};
use anyhow::Context;
use kine_core::{Error, Result, Revision, txn};
use postgres::types::Type;

pub struct PgCompaction(pub Connector);

/// A failure on a connection that is now closed is an outage (`Unavailable`), not a bug.
fn error(conn: &Conn, e: anyhow::Error) -> Error {
    if conn.is_closed() { Error::Unavailable(format!("PostgreSQL: {e:#}")) } else { Error::Backend(e) }
}

impl Compaction for PgCompaction {
    type Conn = Conn;
    const LABEL: &'static str = "postgres";

    fn open(&self) -> anyhow::Result<Conn> {
        let mut conn = self.0.open()?;
        // A batch blocked by another session's lock fails and is retried later, so that a
        // shutdown never waits on it for long.
        conn.client().batch_execute("SET lock_timeout = '5s'").context("set the compactor's lock timeout")?;
        Ok(conn)
    }

    fn usable(conn: &mut Conn) -> bool {
        !conn.is_closed()
    }

    fn owed(conn: &mut Conn) -> anyhow::Result<Option<Removal>> {
        let (_, compacted) = schema::revisions(conn)?;
        Ok(Removal::owed(schema::get(conn, REMOVED)?, compacted))
    }

    fn remove_batch(conn: &mut Conn, removal: &mut Removal) -> anyhow::Result<bool> {
        let (after, sub) = (removal.cursor.0, removal.cursor.1 as i32);
        let row = conn
            .query_row(
                "WITH touched AS (
                     SELECT mod_revision, sub, key FROM kv
                     WHERE (mod_revision, sub) > ($1, $2) AND mod_revision <= $3
                     ORDER BY mod_revision, sub LIMIT $4),
                 gone AS (
                     DELETE FROM kv WHERE key IN (SELECT key FROM touched) AND mod_revision <= $3
                       AND ((deleted AND mod_revision < $3)
                            OR EXISTS (SELECT 1 FROM kv n WHERE n.key = kv.key AND n.mod_revision <= $3
                                       AND (n.mod_revision, n.sub) > (kv.mod_revision, kv.sub)))
                     RETURNING 1),
                 last AS (SELECT mod_revision, sub FROM touched ORDER BY mod_revision DESC, sub DESC LIMIT 1)
                 SELECT (SELECT mod_revision FROM last), (SELECT sub FROM last), (SELECT count(*) FROM gone)",
                &[(&after, Type::INT8), (&sub, Type::INT4), (&removal.to, Type::INT8), (&BATCH_ROWS, Type::INT8)],
            )
            .context("delete superseded versions")?;
        match (row.get::<_, Option<i64>>(0), row.get::<_, Option<i32>>(1)) {
            (Some(revision), Some(sub)) => {
                removal.cursor = (revision, sub.into());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn finish(conn: &mut Conn, to: Revision) -> anyhow::Result<()> {
        conn.execute_sql(
            "UPDATE meta SET value = $1 WHERE name = 'compact_removed' AND value < $1",
            &[(&to, Type::INT8)],
        )
        .context("record the removal of compacted versions")?;
        Ok(())
    }
}

/// A compaction's logical step, on the writer's connection: one short transaction under a
/// lock on the compact revision (so two nodes never compact at once) checks `revision` against
/// the database's revisions and records it. Returns the current revision and the removal now
/// owed; a failure of the connection is `Unavailable`.
pub fn schedule(conn: &mut Conn, revision: Revision) -> Result<(Revision, Removal)> {
    schedule_in(conn.client(), revision).map_err(|e| match e {
        Error::Backend(inner) => error(conn, inner),
        other => other,
    })
}

/// The logical step in one transaction (rolled back when dropped uncommitted).
fn schedule_in(client: &mut postgres::Client, revision: Revision) -> Result<(Revision, Removal)> {
    let backend = |e: anyhow::Error| Error::Backend(e);
    let mut tx = client.transaction().context("begin compaction").map_err(backend)?;
    let previous: i64 = tx
        .query_typed_one("SELECT value FROM meta WHERE name = 'compact_revision' FOR UPDATE", &[])
        .context("lock the compact revision")
        .map_err(backend)?
        .get(0);
    let current = schema::get(&mut tx, "revision").map_err(backend)?.unwrap_or(1);
    txn::check_compact(revision, current, previous)?;
    let removed = schema::get(&mut tx, REMOVED).map_err(backend)?.unwrap_or(previous);
    schema::set(&mut tx, "compact_revision", revision).map_err(backend)?;
    // Recorded for databases compacted before the row existed; never lowered.
    tx.execute_typed(
        "INSERT INTO meta (name, value) VALUES ('compact_removed', $1) ON CONFLICT (name) DO NOTHING",
        &[(&removed, Type::INT8)],
    )
    .context("record the removal owed")
    .map_err(backend)?;
    tx.commit().context("commit compaction").map_err(backend)?;
    Ok((current, Removal::new(removed, revision)))
}
