//! PostgreSQL statements: prepared once per connection by default (as Go kine's pgx does),
//! sent unnamed when the URL carries pgx's `default_query_exec_mode=exec` or
//! `statement_cache_capacity=0` (PgBouncer in transaction mode). Read from the server's own
//! statement log, which names each executed statement (`execute s3: …` or `execute <unnamed>: …`).

use kine_testkit::contract::{get, prefix, put, store};
use kine_testkit::postgres::PgServer;

/// The text of kine-rs's single-key read (`pg/view.rs`).
const GET: &str = "SELECT r.value, c.value, k.key";

/// Runs writes, gets and lists against database `db` at `params`; returns the server's
/// statement log lines of that database.
async fn exercise(server: &PgServer, db: &str, params: &str) -> Vec<String> {
    let backend = kine_testkit::postgres_at(format!("{}{params}", server.url(db)));
    let s = store(backend.clone()).await;
    for i in 0..5 {
        put(&s, &format!("k/{i}"), "v").await;
    }
    for i in 0..5 {
        assert_eq!(get(&s, &format!("k/{i}")).await.expect("written key").value, b"v");
    }
    let listed = s.range(kine_core::request::RangeRequest::new(prefix("k/"))).await.expect("list");
    assert_eq!(listed.value.count, 5);
    backend.close().await;
    let tag = format!("[{db}] ");
    server.log().lines().filter(|l| l.contains(&tag)).map(str::to_string).collect()
}

fn executions<'l>(log: &'l [String], what: &str) -> Vec<&'l String> {
    log.iter().filter(|l| l.contains("execute ") && l.contains(what)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_prepared_once_unless_the_url_asks_for_unnamed_ones() {
    let server = PgServer::start();
    server.sql("postgres", "ALTER SYSTEM SET log_statement = 'all'");
    server.sql("postgres", "ALTER SYSTEM SET log_line_prefix = '[%d] '");
    server.sql("postgres", "SELECT pg_reload_conf()");

    let log = exercise(&server, "prepared", "").await;
    let gets = executions(&log, GET);
    assert_eq!(gets.len(), 5, "five gets logged:\n{}", log.join("\n"));
    assert!(gets.iter().all(|l| !l.contains("<unnamed>")), "gets ran a prepared statement:\n{gets:#?}");
    let inserts = executions(&log, "INSERT INTO kv");
    assert_eq!(inserts.len(), 5, "{}", log.join("\n"));
    assert!(inserts.iter().all(|l| !l.contains("<unnamed>")), "{inserts:#?}");

    for (db, params) in [("exec", "&default_query_exec_mode=exec"), ("nocache", "&statement_cache_capacity=0")] {
        let log = exercise(&server, db, params).await;
        let gets = executions(&log, GET);
        assert_eq!(gets.len(), 5, "{params}: five gets logged:\n{}", log.join("\n"));
        assert!(gets.iter().all(|l| l.contains("execute <unnamed>")), "{params}: {gets:#?}");
        let named: Vec<_> = log.iter().filter(|l| l.contains("execute s")).collect();
        assert!(named.is_empty(), "{params}: no statement prepared by name: {named:#?}");
    }
}
