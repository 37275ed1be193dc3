//! Schema 1 databases (before the `live` index) on every SQL backend are migrated at start-up.

use kine_testkit::migration::schema_1_is_migrated;

const DOWNGRADE: &str = "DROP TABLE live; UPDATE meta SET value = 1 WHERE name = 'schema_version'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_schema_1_is_migrated() {
    let dir = kine_testkit::TempDir::new("migrate");
    let path = dir.path().to_path_buf();
    schema_1_is_migrated(
        || kine_testkit::sqlite(&path),
        || {
            let conn = rusqlite::Connection::open(path.join("state.db")).unwrap();
            conn.execute_batch(DOWNGRADE).unwrap();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schema_1_is_migrated() {
    let server = kine_testkit::postgres::PgServer::start();
    schema_1_is_migrated(
        || kine_testkit::postgres(&server, "migrate"),
        || {
            server.sql("migrate", DOWNGRADE);
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_schema_1_is_migrated() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    schema_1_is_migrated(
        || kine_testkit::mysql(&server, "migrate"),
        || {
            server.root_sql(&format!("USE migrate; {DOWNGRADE}"));
        },
    )
    .await;
}
