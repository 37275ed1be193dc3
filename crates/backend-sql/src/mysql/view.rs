//! `ReadView` / `WriteView` over one MySQL transaction, and the events query. The SQL is
//! PostgreSQL's with `?` placeholders; `key` is a reserved word, quoted where unqualified.

use super::prev_cache::Known;
use super::schema::MAX_KEY_LEN;
use anyhow::Context;
use kine_core::view::{ReadView, WriteView};
use kine_core::{Error, Event, EventKind, KeyRange, KeyValue, LeaseId, RangeEnd, Result, Revision, RevisionEvents};
use mysql::prelude::Queryable;
use mysql::{Row, Value};
use std::collections::HashMap;

/// SQL condition for `column` in `range`, its parameters appended to `args`.
fn key_condition(args: &mut Vec<Value>, range: &KeyRange, column: &str) -> String {
    args.push(Value::Bytes(range.start.clone()));
    match &range.end {
        RangeEnd::Single => format!("{column} = ?"),
        RangeEnd::Unbounded => format!("{column} >= ?"),
        RangeEnd::Before(end) => {
            args.push(Value::Bytes(end.clone()));
            format!("{column} >= ? AND {column} < ?")
        }
    }
}

/// SQL condition: row `k` is its key's newest version at or below the revision parameter
/// that follows in `args`.
fn latest(args: &mut Vec<Value>, rev: Revision) -> &'static str {
    args.push(Value::Int(rev));
    "NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND n.mod_revision <= ?
                 AND (n.mod_revision > k.mod_revision OR (n.mod_revision = k.mod_revision AND n.sub > k.sub)))"
}

const KV_COLUMNS: &str = "k.key, k.create_revision, k.mod_revision, k.version, k.lease";

fn column<T: mysql::prelude::FromValue>(row: &Row, i: usize) -> Result<T> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(Error::Backend(anyhow::anyhow!("column {i}: {e}"))),
        None => Err(Error::Backend(anyhow::anyhow!("column {i} is missing"))),
    }
}

fn kv_from_row(row: &Row, offset: usize) -> Result<KeyValue> {
    Ok(KeyValue {
        key: column(row, offset)?,
        create_revision: column(row, offset + 1)?,
        mod_revision: column(row, offset + 2)?,
        version: column(row, offset + 3)?,
        lease: column(row, offset + 4)?,
        value: column(row, offset + 5)?,
    })
}

pub fn backend_err(e: impl Into<anyhow::Error>, what: &'static str) -> Error {
    Error::Backend(e.into().context(what))
}

pub struct MyView<'v, C: Queryable> {
    pub conn: &'v mut C,
    /// The last committed revision this view builds on (advances inside a write batch).
    pub revision: Revision,
    pub compacted: Revision,
    /// The newest revision appended in this transaction so far (0: none).
    pub appended: Revision,
}

impl<C: Queryable> MyView<'_, C> {
    /// Whether a read at `rev` sees the newest state, which `live` indexes. Inside a write
    /// transaction `live` already holds what the transaction appended (at a revision above
    /// `revision` while a request is being applied), so only a read at that revision may use
    /// it; a Txn's Range at an earlier revision reads the log.
    fn newest(&self, rev: Revision) -> bool {
        rev >= self.revision.max(self.appended)
    }
}

impl<C: Queryable> ReadView for MyView<'_, C> {
    fn scan(&mut self, range: &KeyRange, rev: Revision, limit: usize, keys_only: bool) -> Result<Vec<KeyValue>> {
        let value = if keys_only { "''" } else { "k.value" };
        let limit_sql = if limit > 0 { format!("LIMIT {limit}") } else { String::new() };
        let mut args = Vec::new();
        let sql = if range.end == RangeEnd::Single {
            let cond = key_condition(&mut args, range, "k.key");
            args.push(Value::Int(rev));
            format!(
                "SELECT {KV_COLUMNS}, {value}, k.deleted FROM kv k
                 WHERE {cond} AND k.mod_revision <= ? ORDER BY k.mod_revision DESC, k.sub DESC LIMIT 1"
            )
        } else if self.newest(rev) {
            let cond = key_condition(&mut args, range, "c.key");
            format!(
                "SELECT {KV_COLUMNS}, {value}, k.deleted FROM live c
                 JOIN kv k ON k.mod_revision = c.mod_revision AND k.sub = c.sub
                 WHERE {cond} ORDER BY c.key {limit_sql}"
            )
        } else {
            let cond = key_condition(&mut args, range, "k.key");
            args.push(Value::Int(rev));
            let latest = latest(&mut args, rev);
            format!(
                "SELECT {KV_COLUMNS}, {value}, k.deleted FROM kv k
                 WHERE {cond} AND k.mod_revision <= ? AND NOT k.deleted AND {latest}
                 ORDER BY k.key {limit_sql}"
            )
        };
        let rows: Vec<Row> = self.conn.exec(sql, args).map_err(|e| backend_err(e, "run range query"))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            if !column::<bool>(row, 6)? {
                out.push(kv_from_row(row, 0)?);
            }
        }
        Ok(out)
    }

    fn count(&mut self, range: &KeyRange, rev: Revision) -> Result<i64> {
        let mut args = Vec::new();
        let sql = if self.newest(rev) {
            let cond = key_condition(&mut args, range, "c.key");
            format!("SELECT COUNT(*) FROM live c WHERE {cond}")
        } else {
            let cond = key_condition(&mut args, range, "k.key");
            args.push(Value::Int(rev));
            let latest = latest(&mut args, rev);
            format!("SELECT COUNT(*) FROM kv k WHERE {cond} AND k.mod_revision <= ? AND NOT k.deleted AND {latest}")
        };
        let n: Option<i64> = self.conn.exec_first(sql, args).map_err(|e| backend_err(e, "run count query"))?;
        Ok(n.unwrap_or(0))
    }
}

impl<C: Queryable> WriteView for MyView<'_, C> {
    fn revision(&self) -> Revision {
        self.revision
    }

    fn compact_revision(&self) -> Revision {
        self.compacted
    }

    fn keys_with_lease(&mut self, lease: LeaseId, rev: Revision) -> Result<Vec<Vec<u8>>> {
        if self.newest(rev) {
            return self
                .conn
                .exec(
                    "SELECT k.key FROM kv k JOIN live c ON c.key = k.key AND c.mod_revision = k.mod_revision
                       AND c.sub = k.sub
                     WHERE k.lease = ? ORDER BY k.key",
                    (lease,),
                )
                .map_err(|e| backend_err(e, "run lease keys query"));
        }
        self.conn
            .exec(
                "SELECT k.key FROM kv k WHERE k.lease = ? AND k.mod_revision <= ? AND NOT k.deleted AND
                   NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND n.mod_revision <= ?
                               AND (n.mod_revision > k.mod_revision
                                    OR (n.mod_revision = k.mod_revision AND n.sub > k.sub)))
                 ORDER BY k.key",
                (lease, rev, rev),
            )
            .map_err(|e| backend_err(e, "run lease keys query"))
    }

    fn lease(&mut self, id: LeaseId) -> Result<Option<i64>> {
        self.conn.exec_first("SELECT ttl FROM lease WHERE id = ?", (id,)).map_err(|e| backend_err(e, "read lease"))
    }

    fn insert_lease(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        self.conn
            .exec_drop("INSERT INTO lease (id, ttl) VALUES (?, ?)", (id, ttl))
            .map_err(|e| backend_err(e, "insert lease"))
    }

    fn remove_lease(&mut self, id: LeaseId) -> Result<()> {
        self.conn.exec_drop("DELETE FROM lease WHERE id = ?", (id,)).map_err(|e| backend_err(e, "delete lease"))
    }

    fn append(&mut self, rev: Revision, index: usize, event: &Event) -> Result<()> {
        let kv = &event.kv;
        if kv.key.len() > MAX_KEY_LEN {
            return Err(Error::InvalidArgument(format!(
                "etcdserver: key is {} bytes; the MySQL datastore stores keys of at most {MAX_KEY_LEN} bytes",
                kv.key.len()
            )));
        }
        self.appended = self.appended.max(rev);
        let deleted = event.kind == EventKind::Delete;
        self.conn
            .exec_drop(
                "INSERT INTO kv (mod_revision, sub, `key`, create_revision, version, lease, deleted, value)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rev,
                    index as i64,
                    Value::Bytes(kv.key.clone()),
                    kv.create_revision,
                    kv.version,
                    kv.lease,
                    deleted,
                    Value::Bytes(kv.value.clone()),
                ),
            )
            .map_err(|e| backend_err(e, "insert key version"))?;
        if deleted {
            self.conn.exec_drop("DELETE FROM live WHERE `key` = ?", (Value::Bytes(kv.key.clone()),))
        } else {
            self.conn.exec_drop(
                "INSERT INTO live (`key`, mod_revision, sub) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE mod_revision = VALUES(mod_revision), sub = VALUES(sub)",
                (Value::Bytes(kv.key.clone()), rev, index as i64),
            )
        }
        .map_err(|e| backend_err(e, "index the newest version"))
    }
}

/// A single-key Range in one statement (one snapshot, no transaction): the revisions and the
/// key's newest version at the read revision together, then the Range rules over that row.
pub fn get(
    conn: &mut impl Queryable,
    req: &kine_core::request::RangeRequest,
) -> Result<kine_core::request::Revisioned<kine_core::request::RangeResponse>> {
    let value = if req.keys_only { "''" } else { "k.value" };
    let sql = format!(
        "SELECT r.value, c.value, {KV_COLUMNS}, {value}, k.deleted
         FROM meta r JOIN meta c ON c.name = 'compact_revision'
         LEFT JOIN kv k ON k.key = ? AND (k.mod_revision, k.sub) = (
             SELECT n.mod_revision, n.sub FROM kv n
             WHERE n.key = ? AND n.mod_revision <= IF(? > 0, ?, r.value)
             ORDER BY n.mod_revision DESC, n.sub DESC LIMIT 1)
         WHERE r.name = 'revision'"
    );
    let key = Value::Bytes(req.range.start.clone());
    let row: Row = conn
        .exec_first(sql, (key.clone(), key, req.revision, req.revision))
        .map_err(|e| backend_err(e, "run get query"))?
        .ok_or_else(|| Error::Backend(anyhow::anyhow!("meta rows revision and compact_revision are missing")))?;
    let (current, compacted): (i64, i64) = (column(&row, 0)?, column(&row, 1)?);
    let rev = kine_core::range::read_revision(req.revision, current, compacted)?;
    let live = match column::<Option<bool>>(&row, 8)? {
        Some(false) => Some(kv_from_row(&row, 2)?),
        _ => None,
    };
    let value = kine_core::range::execute(&mut kine_core::range::OneKey(live), req, rev)?;
    Ok(kine_core::request::Revisioned { revision: current, value })
}

/// Committed events in `range` with `after < revision <= until`, each with its previous version.
/// The window's changes come in one scan of the revision index; a change's previous version is
/// the window's earlier change of the key, else what `known` (the earlier windows of the same
/// catch-up, `prev_cache.rs`) holds of it, else the key's newest version before the window,
/// looked up (one loose index scan for up to 1,000 keys). MariaDB has no LATERAL join, and its
/// plan for a correlated "previous row" subquery revisits every earlier version of the key for
/// each event (5,000 events of keys with 100 versions each took 15 s). `known` learns the
/// window's changes.
pub fn events(
    conn: &mut impl Queryable,
    range: &KeyRange,
    after: Revision,
    until: Revision,
    known: &mut Known,
) -> anyhow::Result<Vec<RevisionEvents>> {
    let mut args = vec![Value::Int(after), Value::Int(until)];
    let cond = key_condition(&mut args, range, "e.key");
    let sql = format!(
        "SELECT e.key, e.create_revision, e.mod_revision, e.version, e.lease, e.value, e.deleted
         FROM kv e FORCE INDEX (PRIMARY)
         WHERE e.mod_revision > ? AND e.mod_revision <= ? AND {cond}
         ORDER BY e.mod_revision, e.sub"
    );
    let rows: Vec<Row> = conn.exec(sql, args).context("run events query")?;
    let changes = rows.iter().map(change_from_row).collect::<Result<Vec<_>>>()?;
    let mut before = HashMap::new();
    let mut unknown = crate::events::keys_before(&changes);
    unknown.retain(|key| match known.get(key) {
        Some(change) => {
            before.insert(key.clone(), change.clone());
            false
        }
        None => true,
    });
    for keys in unknown.chunks(BEFORE_BATCH) {
        // Each key's newest revision up to the window (a loose scan of the key index, forced:
        // with a long history MariaDB prefers to scan the revisions up to the window, 0.28 s
        // instead of 0.03 s for 1,000 keys at 95 k revisions), then that row; ordered by `sub`
        // so that the last of one revision's rows wins.
        let sql = format!(
            "SELECT e.key, e.create_revision, e.mod_revision, e.version, e.lease, e.value, e.deleted FROM kv e
             JOIN (SELECT m.key, MAX(m.mod_revision) AS r FROM kv m FORCE INDEX (kv_key_revision)
                   WHERE m.key IN ({}) AND m.mod_revision <= ? GROUP BY m.key) n
               ON e.key = n.key AND e.mod_revision = n.r
             ORDER BY e.sub",
            vec!["?"; keys.len()].join(", ")
        );
        let mut args: Vec<Value> = keys.iter().map(|k| Value::Bytes(k.clone())).collect();
        args.push(Value::Int(after));
        let rows: Vec<Row> = conn.exec(sql, args).context("run previous versions query")?;
        for row in &rows {
            let change = change_from_row(row)?;
            before.insert(change.0.key.clone(), change);
        }
    }
    known.record(&changes);
    Ok(crate::events::assemble(changes, &before))
}

/// Keys per previous-versions query.
const BEFORE_BATCH: usize = 1000;

fn change_from_row(row: &Row) -> Result<crate::events::Change> {
    Ok((kv_from_row(row, 0)?, column(row, 6)?))
}
