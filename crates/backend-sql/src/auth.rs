//! The auth record (etcd's users, roles and auth settings; opaque bytes here): the one row
//! `name = 'auth'` of `kine_rs_auth`, beside the log and outside the key space (writing it
//! spends no revision and publishes no event). `version` counts its replacements from 1. A
//! replacement is one statement that compares the version, so every node sharing the database
//! sees one record and of concurrent writers exactly one wins; the others get `false`.

use anyhow::Context;
use kine_core::backend::AuthRecord;

const SELECT: &str = "SELECT version, data FROM kine_rs_auth WHERE name = 'auth'";

/// `expected` as stored; `None` for a version no row has (0, or beyond `i64`).
fn stored(expected: u64) -> Option<i64> {
    i64::try_from(expected).ok().filter(|v| *v > 0)
}

fn record((version, data): (i64, Vec<u8>)) -> AuthRecord {
    AuthRecord { version: version as u64, data }
}

pub fn sqlite_record(conn: &rusqlite::Connection) -> anyhow::Result<Option<AuthRecord>> {
    use rusqlite::OptionalExtension;
    let row = conn.prepare_cached(SELECT)?.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional();
    Ok(row.context("read the auth record")?.map(record))
}

pub fn sqlite_replace(conn: &rusqlite::Connection, expected: Option<u64>, data: &[u8]) -> anyhow::Result<bool> {
    let changed = match expected {
        None => conn.execute(
            "INSERT INTO kine_rs_auth (name, version, data) VALUES ('auth', 1, ?1) ON CONFLICT (name) DO NOTHING",
            rusqlite::params![data],
        ),
        Some(v) => match stored(v) {
            Some(v) => conn.execute(
                "UPDATE kine_rs_auth SET version = version + 1, data = ?2 WHERE name = 'auth' AND version = ?1",
                rusqlite::params![v, data],
            ),
            None => return Ok(false),
        },
    };
    Ok(changed.context("replace the auth record")? == 1)
}

pub fn pg_record(c: &mut impl postgres::GenericClient) -> anyhow::Result<Option<AuthRecord>> {
    let row = c.query_typed_opt(SELECT, &[]).context("read the auth record")?;
    Ok(row.map(|r| record((r.get(0), r.get(1)))))
}

/// In a READ COMMITTED transaction: a concurrent update is waited for and the version compared
/// with what it wrote; a concurrent create makes `ON CONFLICT` do nothing.
pub fn pg_replace(c: &mut impl postgres::GenericClient, expected: Option<u64>, data: &[u8]) -> anyhow::Result<bool> {
    use postgres::types::Type;
    let changed = match expected {
        None => c.execute_typed(
            "INSERT INTO kine_rs_auth (name, version, data) VALUES ('auth', 1, $1) ON CONFLICT (name) DO NOTHING",
            &[(&data, Type::BYTEA)],
        ),
        Some(v) => match stored(v) {
            Some(v) => c.execute_typed(
                "UPDATE kine_rs_auth SET version = version + 1, data = $2 WHERE name = 'auth' AND version = $1",
                &[(&v, Type::INT8), (&data, Type::BYTEA)],
            ),
            None => return Ok(false),
        },
    };
    Ok(changed.context("replace the auth record")? == 1)
}

pub fn mysql_record(c: &mut mysql::Conn) -> anyhow::Result<Option<AuthRecord>> {
    use mysql::prelude::Queryable;
    let row: Option<(i64, Vec<u8>)> = c.query_first(SELECT).context("read the auth record")?;
    Ok(row.map(record))
}

/// InnoDB's UPDATE reads the newest committed row (after waiting for a concurrent writer), and
/// a concurrent create makes the INSERT fail with a duplicate key (1062): `false`.
pub fn mysql_replace(c: &mut mysql::Conn, expected: Option<u64>, data: &[u8]) -> anyhow::Result<bool> {
    use mysql::prelude::Queryable;
    let result = match expected {
        None => c.exec_drop("INSERT INTO kine_rs_auth (name, version, data) VALUES ('auth', 1, ?)", (data,)),
        Some(v) => match stored(v) {
            Some(v) => c.exec_drop(
                "UPDATE kine_rs_auth SET version = version + 1, data = ? WHERE name = 'auth' AND version = ?",
                (data, v),
            ),
            None => return Ok(false),
        },
    };
    match result {
        Ok(()) => Ok(c.affected_rows() == 1),
        Err(mysql::Error::MySqlError(e)) if e.code == 1062 => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context("replace the auth record")),
    }
}
