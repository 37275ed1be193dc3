//! The member registry of the nodes sharing one database: one row per node in
//! `kine_rs_members` (`id`, the node's member id stored as `i64`; `data`, its opaque record),
//! beside the log and outside the key space (writing it spends no revision and publishes no
//! event). A put replaces the node's row; a delete of a missing row changes nothing.

use anyhow::Context;

const SELECT: &str = "SELECT id, data FROM kine_rs_members ORDER BY id";

/// Back to `u64` ids, in their order (ids beyond `i64::MAX` are stored negative, so come first
/// from `ORDER BY`).
fn records(rows: impl IntoIterator<Item = (i64, Vec<u8>)>) -> Vec<(u64, Vec<u8>)> {
    let mut records: Vec<(u64, Vec<u8>)> = rows.into_iter().map(|(id, data)| (id as u64, data)).collect();
    records.sort_by_key(|(id, _)| *id);
    records
}

pub fn pg_put(c: &mut impl postgres::GenericClient, id: u64, data: &[u8]) -> anyhow::Result<()> {
    use postgres::types::Type;
    c.execute_typed(
        "INSERT INTO kine_rs_members (id, data) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET data = EXCLUDED.data",
        &[(&(id as i64), Type::INT8), (&data, Type::BYTEA)],
    )
    .context("store the member record")?;
    Ok(())
}

pub fn pg_records(c: &mut impl postgres::GenericClient) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    let rows = c.query_typed(SELECT, &[]).context("read the member records")?;
    Ok(records(rows.iter().map(|r| (r.get(0), r.get(1)))))
}

pub fn pg_delete(c: &mut impl postgres::GenericClient, id: u64) -> anyhow::Result<()> {
    use postgres::types::Type;
    c.execute_typed("DELETE FROM kine_rs_members WHERE id = $1", &[(&(id as i64), Type::INT8)])
        .context("delete the member record")?;
    Ok(())
}

pub fn mysql_put(c: &mut mysql::Conn, id: u64, data: &[u8]) -> anyhow::Result<()> {
    use mysql::prelude::Queryable;
    c.exec_drop(
        "INSERT INTO kine_rs_members (id, data) VALUES (?, ?) ON DUPLICATE KEY UPDATE data = VALUES(data)",
        (id as i64, data),
    )
    .context("store the member record")
}

pub fn mysql_records(c: &mut mysql::Conn) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    use mysql::prelude::Queryable;
    let rows: Vec<(i64, Vec<u8>)> = c.query(SELECT).context("read the member records")?;
    Ok(records(rows))
}

pub fn mysql_delete(c: &mut mysql::Conn, id: u64) -> anyhow::Result<()> {
    use mysql::prelude::Queryable;
    c.exec_drop("DELETE FROM kine_rs_members WHERE id = ?", (id as i64,)).context("delete the member record")
}
