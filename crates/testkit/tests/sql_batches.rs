//! The PostgreSQL and MySQL writers commit the requests queued together in one transaction,
//! without savepoints. A request that fails in the database (which aborts a PostgreSQL
//! transaction, and may leave part of a MySQL request written) makes the batch run again, each
//! request in a savepoint, and only the failing request fails. Here the database itself
//! refuses one key (a trigger), the way a constraint or a storage limit would.

use kine_core::backend::Backend;
use kine_testkit::contract::{prefix, put_req, store};
use std::sync::Arc;

const POISON: &str = "poison/key";
const ROUNDS: usize = 10;

/// Rounds of 48 concurrent puts, one of them refused by the database: the other 47 are
/// acknowledged at gap-free revisions and stored; the refused one fails with the database's
/// reason.
async fn only_the_refused_request_fails(backend: Arc<dyn Backend>) {
    let s = store(backend.clone()).await;
    for round in 0..ROUNDS {
        let before = backend.revisions().await.expect("revisions").current;
        let mut tasks = Vec::new();
        for i in 0..48 {
            let s = s.clone();
            let key = if i == 24 { POISON.to_string() } else { format!("k/{round}/{i}") };
            tasks.push(tokio::spawn(async move { (key.clone(), s.put(put_req(&key, "v")).await) }));
        }
        let mut revisions = Vec::new();
        for task in tasks {
            let (key, result) = task.await.expect("put task");
            match result {
                Ok(r) => {
                    assert_ne!(key, POISON, "the refused key was acknowledged");
                    revisions.push(r.revision);
                }
                Err(e) => {
                    assert_eq!(key, POISON, "{key} failed with the refused key: {e}");
                    assert!(format!("{e:?}").contains("refuse_poison"), "{e:?}");
                }
            }
        }
        revisions.sort_unstable();
        let expected: Vec<i64> = (before + 1..=before + 47).collect();
        assert_eq!(revisions, expected, "round {round}: 47 puts at gap-free revisions");
        let listed = s.range(kine_core::request::RangeRequest::new(prefix(&format!("k/{round}/")))).await.unwrap();
        assert_eq!(listed.value.count, 47, "round {round}: every acknowledged put is stored");
    }
    backend.close().await;
}

/// Savepoints are used only when a batch runs again: one per request then. More than one per
/// round means the refused request shared its transaction with others (48 concurrent requests
/// on one writer thread batch together), which these tests are about.
fn assert_batched(savepoints: usize) {
    assert!(savepoints > ROUNDS, "batches with the refused request held {savepoints} requests in {ROUNDS} rounds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_request_failing_in_the_database_fails_alone_in_its_batch() {
    let server = kine_testkit::postgres::PgServer::start();
    let backend = kine_testkit::postgres(&server, "batches");
    server.sql("postgres", "ALTER SYSTEM SET log_statement = 'all'");
    server.sql("postgres", "SELECT pg_reload_conf()");
    server.sql(
        "batches",
        &format!("ALTER TABLE kv ADD CONSTRAINT refuse_poison CHECK (key <> convert_to('{POISON}', 'UTF8'))"),
    );
    only_the_refused_request_fails(backend).await;
    assert_batched(server.log().matches("statement: SAVEPOINT op").count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_request_failing_in_the_database_fails_alone_in_its_batch() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let backend = kine_testkit::mysql(&server, "batches");
    server.root_sql("SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = 1");
    server.root_sql(&format!("ALTER TABLE batches.kv ADD CONSTRAINT refuse_poison CHECK (`key` <> '{POISON}')"));
    only_the_refused_request_fails(backend).await;
    let savepoints = server.root_sql("SELECT COUNT(*) FROM mysql.general_log WHERE argument = 'SAVEPOINT op'");
    assert_batched(savepoints.trim().parse().expect("a count"));
}
