//! A PostgreSQL connection with its prepared statements, and `Sql`: the four ways kine-rs
//! sends a statement, on a `Conn` (prepared once per connection) or on any client or
//! transaction of the `postgres` crate (sent unnamed: parsed and planned every time).
//!
//! Like Go kine (pgx's default `cache_statement` mode), a `Conn` prepares each distinct
//! statement on first use and keeps it for the connection's life; PostgreSQL then skips the
//! parse, and keeps a generic plan where that is as good as a fresh one. Poolers that cannot
//! hold named statements (PgBouncer in transaction mode before 1.21) get unnamed statements
//! with pgx's own URL parameters, which kine users already set: `default_query_exec_mode=exec`
//! (or `simple_protocol`, `describe_exec`, `cache_describe`) or `statement_cache_capacity=0`.

use postgres::types::{ToSql, Type};
use postgres::{GenericClient, Row, Statement};
use std::collections::HashMap;

/// Statement parameters with their types.
pub type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

/// Statements kept per connection unless the URL says otherwise (pgx's default).
pub const DEFAULT_CAPACITY: usize = 512;

/// Sends statements with typed parameters.
pub trait Sql {
    fn query_rows(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, postgres::Error>;
    fn query_row(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, postgres::Error>;
    fn query_maybe(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, postgres::Error>;
    fn execute_sql(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, postgres::Error>;
}

/// Unnamed statements (one round trip each: parse, bind and execute together).
impl<C: GenericClient> Sql for C {
    fn query_rows(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, postgres::Error> {
        self.query_typed(sql, params)
    }
    fn query_row(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, postgres::Error> {
        self.query_typed_one(sql, params)
    }
    fn query_maybe(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, postgres::Error> {
        self.query_typed_opt(sql, params)
    }
    fn execute_sql(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, postgres::Error> {
        self.execute_typed(sql, params)
    }
}

/// One connection and the statements prepared on it (which die with it).
pub struct Conn {
    // Dropped first: statements dropped after their connection send nothing.
    client: postgres::Client,
    statements: HashMap<String, Statement>,
    /// 0: every statement unnamed.
    capacity: usize,
}

impl Conn {
    pub fn new(client: postgres::Client, capacity: usize) -> Conn {
        Conn { client, statements: HashMap::new(), capacity }
    }

    /// The connection itself, for statements that are not worth keeping (transaction control,
    /// maintenance).
    pub fn client(&mut self) -> &mut postgres::Client {
        &mut self.client
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The prepared statement for `sql`, prepared now if new; `None` when statements are sent
    /// unnamed.
    fn prepared(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Statement>, postgres::Error> {
        if self.capacity == 0 {
            return Ok(None);
        }
        if let Some(statement) = self.statements.get(sql) {
            return Ok(Some(statement.clone()));
        }
        let types: Vec<Type> = params.iter().map(|(_, ty)| ty.clone()).collect();
        let statement = self.client.prepare_typed(sql, &types)?;
        if self.statements.len() >= self.capacity {
            // Simpler than LRU and as good for kine-rs's few dozen distinct statements: only a
            // URL with a tiny capacity ever gets here.
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), statement.clone());
        Ok(Some(statement))
    }
}

fn values<'a>(params: &'a Params<'a>) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|(value, _)| *value).collect()
}

impl Sql for Conn {
    fn query_rows(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, postgres::Error> {
        match self.prepared(sql, params)? {
            Some(statement) => self.client.query(&statement, &values(params)),
            None => self.client.query_typed(sql, params),
        }
    }
    fn query_row(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, postgres::Error> {
        match self.prepared(sql, params)? {
            Some(statement) => self.client.query_one(&statement, &values(params)),
            None => self.client.query_typed_one(sql, params),
        }
    }
    fn query_maybe(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, postgres::Error> {
        match self.prepared(sql, params)? {
            Some(statement) => self.client.query_opt(&statement, &values(params)),
            None => self.client.query_typed_opt(sql, params),
        }
    }
    fn execute_sql(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, postgres::Error> {
        match self.prepared(sql, params)? {
            Some(statement) => self.client.execute(&statement, &values(params)),
            None => self.client.execute_typed(sql, params),
        }
    }
}

/// The statement cache capacity the URL's pgx parameters ask for, and the URL without them
/// (the `postgres` crate knows neither). Unknown values are errors naming the parameter.
pub fn split_cache_params(url: &str) -> anyhow::Result<(usize, String)> {
    let Some((base, query)) = url.split_once('?') else { return Ok((DEFAULT_CAPACITY, url.to_string())) };
    let mut capacity = None;
    let mut mode_caches = true;
    let mut rest = Vec::new();
    for param in query.split('&') {
        match param.split_once('=') {
            Some(("default_query_exec_mode", mode)) => {
                mode_caches = match mode {
                    "cache_statement" => true,
                    "cache_describe" | "describe_exec" | "exec" | "simple_protocol" => false,
                    other => anyhow::bail!(
                        "URL parameter default_query_exec_mode={other}: expected cache_statement, cache_describe, \
                         describe_exec, exec or simple_protocol"
                    ),
                }
            }
            Some(("statement_cache_capacity", n)) => {
                capacity = Some(n.parse::<usize>().map_err(|_| {
                    anyhow::anyhow!("URL parameter statement_cache_capacity={n}: expected a number of statements")
                })?)
            }
            _ => rest.push(param),
        }
    }
    let capacity = if mode_caches { capacity.unwrap_or(DEFAULT_CAPACITY) } else { 0 };
    let url = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
    Ok((capacity, url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgx_cache_parameters_are_understood_and_removed() {
        let base = "postgres://kine@127.0.0.1/kine";
        assert_eq!(split_cache_params(base).unwrap(), (DEFAULT_CAPACITY, base.to_string()));
        assert_eq!(
            split_cache_params(&format!("{base}?sslmode=disable&default_query_exec_mode=exec")).unwrap(),
            (0, format!("{base}?sslmode=disable"))
        );
        assert_eq!(split_cache_params(&format!("{base}?statement_cache_capacity=0")).unwrap(), (0, base.to_string()));
        assert_eq!(
            split_cache_params(&format!("{base}?statement_cache_capacity=16&default_query_exec_mode=cache_statement"))
                .unwrap(),
            (16, base.to_string())
        );
        assert_eq!(
            split_cache_params(&format!("{base}?default_query_exec_mode=simple_protocol&statement_cache_capacity=9"))
                .unwrap()
                .0,
            0
        );
        let err = split_cache_params(&format!("{base}?default_query_exec_mode=fast")).unwrap_err().to_string();
        assert!(err.contains("default_query_exec_mode=fast"), "{err}");
        let err = split_cache_params(&format!("{base}?statement_cache_capacity=-1")).unwrap_err().to_string();
        assert!(err.contains("statement_cache_capacity=-1"), "{err}");
    }
}
