//! `ReadView` / `WriteView` over one SQLite connection (inside its transaction).

use anyhow::Context;
use kine_core::view::{ReadView, WriteView};
use kine_core::{Event, EventKind, KeyRange, KeyValue, LeaseId, RangeEnd, Result, Revision, RevisionEvents};
use rusqlite::types::Value;
use rusqlite::{Connection, Row, params, params_from_iter};

pub struct SqlView<'c> {
    pub conn: &'c Connection,
    /// The last committed revision this view builds on (advances inside a write batch).
    pub revision: Revision,
    pub compacted: Revision,
    /// The newest revision appended in this transaction so far (0: none).
    pub appended: Revision,
}

/// SQL condition for `key` in `range` (table alias `t`), with its parameters.
fn key_condition(range: &KeyRange, column: &str) -> (String, Vec<Value>) {
    match &range.end {
        RangeEnd::Single => (format!("{column} = ?"), vec![Value::Blob(range.start.clone())]),
        RangeEnd::Unbounded => (format!("{column} >= ?"), vec![Value::Blob(range.start.clone())]),
        RangeEnd::Before(end) => (
            format!("{column} >= ? AND {column} < ?"),
            vec![Value::Blob(range.start.clone()), Value::Blob(end.clone())],
        ),
    }
}

/// SQL condition: row `k` is its key's newest version at or below the revision bound to
/// parameter `?{rev}`.
fn latest(rev: usize) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND n.mod_revision <= ?{rev}
                     AND (n.mod_revision, n.sub) > (k.mod_revision, k.sub))"
    )
}

fn kv_from_row(row: &Row<'_>, offset: usize) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: row.get(offset)?,
        create_revision: row.get(offset + 1)?,
        mod_revision: row.get(offset + 2)?,
        version: row.get(offset + 3)?,
        lease: row.get(offset + 4)?,
        value: row.get(offset + 5)?,
    })
}

fn backend_err(e: impl Into<anyhow::Error>, what: &'static str) -> kine_core::Error {
    kine_core::Error::Backend(e.into().context(what))
}

impl SqlView<'_> {
    /// Whether a read at `rev` sees the newest state, which `live` indexes. Inside a write
    /// transaction `live` already holds what the transaction appended (at a revision above
    /// `revision` while a request is being applied), so only a read at that revision may use
    /// it; a Txn's Range at an earlier revision reads the log.
    fn newest(&self, rev: Revision) -> bool {
        rev >= self.revision.max(self.appended)
    }
}

impl ReadView for SqlView<'_> {
    fn scan(&mut self, range: &KeyRange, rev: Revision, limit: usize, keys_only: bool) -> Result<Vec<KeyValue>> {
        let value = if keys_only { "x''" } else { "k.value" };
        let limit_sql = if limit > 0 { format!("LIMIT {limit}") } else { String::new() };
        let columns = format!("k.key, k.create_revision, k.mod_revision, k.version, k.lease, {value}, k.deleted");
        let (sql, args) = if range.end == RangeEnd::Single {
            let (cond, mut args) = key_condition(range, "k.key");
            args.push(Value::Integer(rev));
            let sql = format!(
                "SELECT {columns} FROM kv k
                 WHERE {cond} AND k.mod_revision <= ? ORDER BY k.mod_revision DESC, k.sub DESC LIMIT 1"
            );
            (sql, args)
        } else if self.newest(rev) {
            let (cond, args) = key_condition(range, "c.key");
            let sql = format!(
                "SELECT {columns} FROM live c JOIN kv k ON k.mod_revision = c.mod_revision AND k.sub = c.sub
                 WHERE {cond} ORDER BY c.key {limit_sql}"
            );
            (sql, args)
        } else {
            let (cond, mut args) = key_condition(range, "k.key");
            args.push(Value::Integer(rev));
            let sql = format!(
                "SELECT {columns} FROM kv k
                 WHERE {cond} AND k.mod_revision <= ?{rev} AND k.deleted = 0 AND {latest}
                 ORDER BY k.key {limit_sql}",
                rev = args.len(),
                latest = latest(args.len()),
            );
            (sql, args)
        };
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| backend_err(e, "prepare range query"))?;
        let rows = stmt
            .query_map(params_from_iter(args), |row| Ok((kv_from_row(row, 0)?, row.get::<_, i64>(6)? != 0)))
            .map_err(|e| backend_err(e, "run range query"))?;
        let mut out = Vec::new();
        for row in rows {
            let (kv, deleted) = row.map_err(|e| backend_err(e, "read range row"))?;
            if !deleted {
                out.push(kv);
            }
        }
        Ok(out)
    }

    fn count(&mut self, range: &KeyRange, rev: Revision) -> Result<i64> {
        let (sql, args) = if self.newest(rev) {
            let (cond, args) = key_condition(range, "c.key");
            (format!("SELECT COUNT(*) FROM live c WHERE {cond}"), args)
        } else {
            let (cond, mut args) = key_condition(range, "k.key");
            args.push(Value::Integer(rev));
            let sql = format!(
                "SELECT COUNT(*) FROM kv k WHERE {cond} AND k.mod_revision <= ?{rev} AND k.deleted = 0 AND {latest}",
                rev = args.len(),
                latest = latest(args.len()),
            );
            (sql, args)
        };
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| backend_err(e, "prepare count query"))?;
        stmt.query_row(params_from_iter(args), |r| r.get(0)).map_err(|e| backend_err(e, "run count query"))
    }
}

impl WriteView for SqlView<'_> {
    fn revision(&self) -> Revision {
        self.revision
    }

    fn compact_revision(&self) -> Revision {
        self.compacted
    }

    fn keys_with_lease(&mut self, lease: LeaseId, rev: Revision) -> Result<Vec<Vec<u8>>> {
        let (sql, args) = if self.newest(rev) {
            (
                "SELECT k.key FROM kv k JOIN live c ON c.key = k.key AND c.mod_revision = k.mod_revision
                   AND c.sub = k.sub
                 WHERE k.lease = ?1 AND k.lease != 0 ORDER BY k.key",
                vec![lease],
            )
        } else {
            (
                "SELECT k.key FROM kv k WHERE k.lease = ?1 AND k.lease != 0 AND k.mod_revision <= ?2
                   AND k.deleted = 0 AND
                   NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND n.mod_revision <= ?2
                               AND (n.mod_revision, n.sub) > (k.mod_revision, k.sub))
                 ORDER BY k.key",
                vec![lease, rev],
            )
        };
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| backend_err(e, "prepare lease keys query"))?;
        let rows =
            stmt.query_map(params_from_iter(args), |r| r.get(0)).map_err(|e| backend_err(e, "run lease keys query"))?;
        rows.collect::<rusqlite::Result<Vec<Vec<u8>>>>().map_err(|e| backend_err(e, "read lease keys"))
    }

    fn lease(&mut self, id: LeaseId) -> Result<Option<i64>> {
        use rusqlite::OptionalExtension;
        self.conn
            .prepare_cached("SELECT ttl FROM lease WHERE id = ?1")
            .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
            .map_err(|e| backend_err(e, "read lease"))
    }

    fn insert_lease(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        self.conn
            .prepare_cached("INSERT INTO lease (id, ttl) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![id, ttl]))
            .map_err(|e| backend_err(e, "insert lease"))?;
        Ok(())
    }

    fn remove_lease(&mut self, id: LeaseId) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM lease WHERE id = ?1")
            .and_then(|mut s| s.execute([id]))
            .map_err(|e| backend_err(e, "delete lease"))?;
        Ok(())
    }

    fn append(&mut self, rev: Revision, index: usize, event: &Event) -> Result<()> {
        self.appended = self.appended.max(rev);
        let kv = &event.kv;
        let deleted = event.kind == EventKind::Delete;
        self.conn
            .prepare_cached(
                "INSERT INTO kv (mod_revision, sub, key, create_revision, version, lease, deleted, value)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    rev,
                    index as i64,
                    kv.key,
                    kv.create_revision,
                    kv.version,
                    kv.lease,
                    deleted as i64,
                    kv.value
                ])
            })
            .map_err(|e| backend_err(e, "insert key version"))?;
        let indexed = if deleted {
            self.conn.prepare_cached("DELETE FROM live WHERE key = ?1").and_then(|mut s| s.execute([&kv.key]))
        } else {
            self.conn
                .prepare_cached(
                    "INSERT INTO live (key, mod_revision, sub) VALUES (?1, ?2, ?3)
                     ON CONFLICT (key) DO UPDATE SET mod_revision = excluded.mod_revision, sub = excluded.sub",
                )
                .and_then(|mut s| s.execute(params![kv.key, rev, index as i64]))
        };
        indexed.map_err(|e| backend_err(e, "index the newest version"))?;
        Ok(())
    }
}

/// Committed events in `range` with `after < revision <= until`, each with its previous version:
/// the key's newest row before the event's revision, one index seek per event (searching all of
/// the key's earlier rows made a replay quadratic in the versions of a key).
pub fn events(
    conn: &Connection,
    range: &KeyRange,
    after: Revision,
    until: Revision,
) -> anyhow::Result<Vec<RevisionEvents>> {
    let (cond, mut args) = key_condition(range, "e.key");
    let mut all = vec![Value::Integer(after), Value::Integer(until)];
    all.append(&mut args);
    let sql = format!(
        "SELECT e.key, e.create_revision, e.mod_revision, e.version, e.lease, e.value, e.deleted,
                p.key, p.create_revision, p.mod_revision, p.version, p.lease, p.value, p.deleted
         FROM kv e
         LEFT JOIN kv p ON p.rowid = (
             SELECT q.rowid FROM kv q WHERE q.key = e.key AND q.mod_revision < e.mod_revision
             ORDER BY q.mod_revision DESC, q.sub DESC LIMIT 1)
         WHERE e.mod_revision > ? AND e.mod_revision <= ? AND {cond}
         ORDER BY e.mod_revision, e.sub"
    );
    let mut stmt = conn.prepare_cached(&sql).context("prepare events query")?;
    let mut rows = stmt.query(params_from_iter(all)).context("run events query")?;
    let mut out: Vec<RevisionEvents> = Vec::new();
    while let Some(row) = rows.next().context("read event row")? {
        let kv = kv_from_row(row, 0)?;
        let deleted = row.get::<_, i64>(6)? != 0;
        let prev_deleted = row.get::<_, Option<i64>>(13)?.map(|d| d != 0);
        let prev =
            if crate::events::wants_prev(&kv, deleted, prev_deleted) { Some(kv_from_row(row, 7)?) } else { None };
        crate::events::push(&mut out, kv, deleted, prev);
    }
    Ok(out)
}
