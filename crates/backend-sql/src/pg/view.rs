//! `ReadView` / `WriteView` over one PostgreSQL transaction, and the events query.

use super::conn::Sql;
use super::schema::MAX_KEY_LEN;
use anyhow::Context;
use kine_core::view::{ReadView, WriteView};
use kine_core::{Event, EventKind, KeyRange, KeyValue, LeaseId, RangeEnd, Result, Revision, RevisionEvents};
use postgres::Row;
use postgres::types::{ToSql, Type};

/// Statement parameters with their types.
#[derive(Default)]
pub struct Args {
    values: Vec<(Box<dyn ToSql + Sync>, Type)>,
}

impl Args {
    fn push(&mut self, value: Box<dyn ToSql + Sync>, ty: Type) -> String {
        self.values.push((value, ty));
        format!("${}", self.values.len())
    }
    pub fn bytes(&mut self, v: &[u8]) -> String {
        self.push(Box::new(v.to_vec()), Type::BYTEA)
    }
    pub fn int(&mut self, v: i64) -> String {
        self.push(Box::new(v), Type::INT8)
    }
    pub fn list(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        self.values.iter().map(|(v, t)| (v.as_ref() as &(dyn ToSql + Sync), t.clone())).collect()
    }
}

/// SQL condition for `column` in `range`.
pub fn key_condition(args: &mut Args, range: &KeyRange, column: &str) -> String {
    let start = args.bytes(&range.start);
    match &range.end {
        RangeEnd::Single => format!("{column} = {start}"),
        RangeEnd::Unbounded => format!("{column} >= {start}"),
        RangeEnd::Before(end) => format!("{column} >= {start} AND {column} < {}", args.bytes(end)),
    }
}

/// SQL condition: row `k` is its key's newest version at or below revision `rev`.
fn latest(rev: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND n.mod_revision <= {rev}
                     AND (n.mod_revision, n.sub) > (k.mod_revision, k.sub))"
    )
}

const KV_COLUMNS: &str = "k.key, k.create_revision, k.mod_revision, k.version, k.lease";

fn kv_from_row(row: &Row, offset: usize) -> KeyValue {
    KeyValue {
        key: row.get(offset),
        create_revision: row.get(offset + 1),
        mod_revision: row.get(offset + 2),
        version: row.get(offset + 3),
        lease: row.get(offset + 4),
        value: row.get(offset + 5),
    }
}

fn backend_err(e: impl Into<anyhow::Error>, what: &'static str) -> kine_core::Error {
    kine_core::Error::Backend(e.into().context(what))
}

pub struct PgView<'v, C: Sql> {
    pub client: &'v mut C,
    /// The last committed revision this view builds on (advances inside a write batch).
    pub revision: Revision,
    pub compacted: Revision,
    /// The newest revision appended in this transaction so far (0: none).
    pub appended: Revision,
}

impl<C: Sql> PgView<'_, C> {
    /// Whether a read at `rev` sees the newest state, which `live` indexes. Inside a write
    /// transaction `live` already holds what the transaction appended (at a revision above
    /// `revision` while a request is being applied), so only a read at that revision may use
    /// it; a Txn's Range at an earlier revision reads the log.
    fn newest(&self, rev: Revision) -> bool {
        rev >= self.revision.max(self.appended)
    }
}

impl<C: Sql> ReadView for PgView<'_, C> {
    fn scan(&mut self, range: &KeyRange, rev: Revision, limit: usize, keys_only: bool) -> Result<Vec<KeyValue>> {
        let value = if keys_only { "''::bytea" } else { "k.value" };
        let limit_sql = if limit > 0 { format!("LIMIT {limit}") } else { String::new() };
        let mut args = Args::default();
        let sql = if range.end == RangeEnd::Single {
            let cond = key_condition(&mut args, range, "k.key");
            let r = args.int(rev);
            format!(
                "SELECT {KV_COLUMNS}, {value}, k.deleted FROM kv k
                 WHERE {cond} AND k.mod_revision <= {r} ORDER BY k.mod_revision DESC, k.sub DESC LIMIT 1"
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
            let r = args.int(rev);
            format!(
                "SELECT {KV_COLUMNS}, {value}, k.deleted FROM kv k
                 WHERE {cond} AND k.mod_revision <= {r} AND NOT k.deleted AND {latest}
                 ORDER BY k.key {limit_sql}",
                latest = latest(&r),
            )
        };
        let rows = self.client.query_rows(&sql, &args.list()).map_err(|e| backend_err(e, "run range query"))?;
        Ok(rows.iter().filter(|row| !row.get::<_, bool>(6)).map(|row| kv_from_row(row, 0)).collect())
    }

    fn count(&mut self, range: &KeyRange, rev: Revision) -> Result<i64> {
        let mut args = Args::default();
        let sql = if self.newest(rev) {
            let cond = key_condition(&mut args, range, "c.key");
            format!("SELECT COUNT(*) FROM live c WHERE {cond}")
        } else {
            let cond = key_condition(&mut args, range, "k.key");
            let r = args.int(rev);
            format!(
                "SELECT COUNT(*) FROM kv k WHERE {cond} AND k.mod_revision <= {r} AND NOT k.deleted AND {latest}",
                latest = latest(&r),
            )
        };
        let row = self.client.query_row(&sql, &args.list()).map_err(|e| backend_err(e, "run count query"))?;
        Ok(row.get(0))
    }
}

impl<C: Sql> WriteView for PgView<'_, C> {
    fn revision(&self) -> Revision {
        self.revision
    }

    fn compact_revision(&self) -> Revision {
        self.compacted
    }

    fn keys_with_lease(&mut self, lease: LeaseId, rev: Revision) -> Result<Vec<Vec<u8>>> {
        let rows = if self.newest(rev) {
            self.client.query_rows(
                "SELECT k.key FROM kv k JOIN live c ON c.key = k.key AND c.mod_revision = k.mod_revision
                   AND c.sub = k.sub
                 WHERE k.lease = $1 ORDER BY k.key",
                &[(&lease, Type::INT8)],
            )
        } else {
            self.client.query_rows(
                "SELECT k.key FROM kv k WHERE k.lease = $1 AND k.mod_revision <= $2 AND NOT k.deleted AND
                   NOT EXISTS (SELECT 1 FROM kv n WHERE n.key = k.key AND n.mod_revision <= $2
                               AND (n.mod_revision, n.sub) > (k.mod_revision, k.sub))
                 ORDER BY k.key",
                &[(&lease, Type::INT8), (&rev, Type::INT8)],
            )
        }
        .map_err(|e| backend_err(e, "run lease keys query"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn lease(&mut self, id: LeaseId) -> Result<Option<i64>> {
        let row = self
            .client
            .query_maybe("SELECT ttl FROM lease WHERE id = $1", &[(&id, Type::INT8)])
            .map_err(|e| backend_err(e, "read lease"))?;
        Ok(row.map(|r| r.get(0)))
    }

    fn insert_lease(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        self.client
            .execute_sql("INSERT INTO lease (id, ttl) VALUES ($1, $2)", &[(&id, Type::INT8), (&ttl, Type::INT8)])
            .map_err(|e| backend_err(e, "insert lease"))?;
        Ok(())
    }

    fn remove_lease(&mut self, id: LeaseId) -> Result<()> {
        self.client
            .execute_sql("DELETE FROM lease WHERE id = $1", &[(&id, Type::INT8)])
            .map_err(|e| backend_err(e, "delete lease"))?;
        Ok(())
    }

    fn append(&mut self, rev: Revision, index: usize, event: &Event) -> Result<()> {
        let kv = &event.kv;
        if kv.key.len() > MAX_KEY_LEN {
            return Err(kine_core::Error::InvalidArgument(format!(
                "etcdserver: key is {} bytes; the PostgreSQL datastore stores keys of at most {MAX_KEY_LEN} bytes",
                kv.key.len()
            )));
        }
        self.appended = self.appended.max(rev);
        let deleted = event.kind == EventKind::Delete;
        let sub = index as i32;
        self.client
            .execute_sql(
                "INSERT INTO kv (mod_revision, sub, key, create_revision, version, lease, deleted, value)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                &[
                    (&rev, Type::INT8),
                    (&sub, Type::INT4),
                    (&kv.key, Type::BYTEA),
                    (&kv.create_revision, Type::INT8),
                    (&kv.version, Type::INT8),
                    (&kv.lease, Type::INT8),
                    (&deleted, Type::BOOL),
                    (&kv.value, Type::BYTEA),
                ],
            )
            .map_err(|e| backend_err(e, "insert key version"))?;
        if deleted {
            self.client.execute_sql("DELETE FROM live WHERE key = $1", &[(&kv.key, Type::BYTEA)])
        } else {
            self.client.execute_sql(
                "INSERT INTO live (key, mod_revision, sub) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET mod_revision = excluded.mod_revision, sub = excluded.sub",
                &[(&kv.key, Type::BYTEA), (&rev, Type::INT8), (&sub, Type::INT4)],
            )
        }
        .map_err(|e| backend_err(e, "index the newest version"))?;
        Ok(())
    }
}

/// A single-key Range in one statement (one snapshot, no transaction): the revisions and the
/// key's newest version at the read revision together, then the Range rules over that row.
pub fn get(
    client: &mut impl Sql,
    req: &kine_core::request::RangeRequest,
) -> Result<kine_core::request::Revisioned<kine_core::request::RangeResponse>> {
    let value = if req.keys_only { "''::bytea" } else { "k.value" };
    let sql = format!(
        "SELECT r.value, c.value, {KV_COLUMNS}, {value}, k.deleted
         FROM meta r CROSS JOIN meta c
         LEFT JOIN LATERAL (
             SELECT * FROM kv k WHERE k.key = $1
               AND k.mod_revision <= CASE WHEN $2 > 0 THEN $2 ELSE r.value END
             ORDER BY k.mod_revision DESC, k.sub DESC LIMIT 1) k ON true
         WHERE r.name = 'revision' AND c.name = 'compact_revision'"
    );
    let row = client
        .query_row(&sql, &[(&req.range.start, Type::BYTEA), (&req.revision, Type::INT8)])
        .map_err(|e| backend_err(e, "run get query"))?;
    let (current, compacted): (i64, i64) = (row.get(0), row.get(1));
    let rev = kine_core::range::read_revision(req.revision, current, compacted)?;
    let live = match row.get::<_, Option<bool>>(8) {
        Some(false) => Some(kv_from_row(&row, 2)),
        _ => None,
    };
    let value = kine_core::range::execute(&mut kine_core::range::OneKey(live), req, rev)?;
    Ok(kine_core::request::Revisioned { revision: current, value })
}

/// Committed events in `range` with `after < revision <= until`, each with its previous version
/// (the key's newest row before the event's revision: one index seek per event).
pub fn events(
    client: &mut impl Sql,
    range: &KeyRange,
    after: Revision,
    until: Revision,
) -> anyhow::Result<Vec<RevisionEvents>> {
    let mut args = Args::default();
    let (a, u) = (args.int(after), args.int(until));
    let cond = key_condition(&mut args, range, "e.key");
    let sql = format!(
        "SELECT e.key, e.create_revision, e.mod_revision, e.version, e.lease, e.value, e.deleted,
                p.key, p.create_revision, p.mod_revision, p.version, p.lease, p.value, p.deleted
         FROM kv e
         LEFT JOIN LATERAL (
             SELECT * FROM kv q WHERE q.key = e.key AND q.mod_revision < e.mod_revision
             ORDER BY q.mod_revision DESC, q.sub DESC LIMIT 1) p ON true
         WHERE e.mod_revision > {a} AND e.mod_revision <= {u} AND {cond}
         ORDER BY e.mod_revision, e.sub"
    );
    let rows = client.query_rows(&sql, &args.list()).context("run events query")?;
    let mut out: Vec<RevisionEvents> = Vec::new();
    for row in &rows {
        let kv = kv_from_row(row, 0);
        let deleted: bool = row.get(6);
        let prev_deleted: Option<bool> = row.get(13);
        let prev = crate::events::wants_prev(&kv, deleted, prev_deleted).then(|| kv_from_row(row, 7));
        crate::events::push(&mut out, kv, deleted, prev);
    }
    Ok(out)
}
