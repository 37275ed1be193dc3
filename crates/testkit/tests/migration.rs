//! Databases of older schemas are migrated at start-up: schema 1 (before the `live` index) on
//! every SQL backend, and on SQLite schema 2 (`kv` clustered on `(mod_revision, sub)`).

use kine_testkit::migration::schema_1_is_migrated;
use std::path::Path;

/// Schema 1 had neither `live` nor the auth record's table nor the member registry's (which
/// SQLite never has: a single node's datastore).
const DOWNGRADE: &str = "DROP TABLE live; DROP TABLE kine_rs_auth; DROP TABLE IF EXISTS kine_rs_members;
UPDATE meta SET value = 1 WHERE name = 'schema_version'";

/// A SQLite database as schema 2 wrote it: `kv` a `WITHOUT ROWID` table clustered on
/// `(mod_revision, sub)`, with its two secondary indexes.
const SQLITE_SCHEMA_2: &str = "
DROP INDEX kv_revision; DROP INDEX kv_key_revision; DROP INDEX kv_lease;
ALTER TABLE kv RENAME TO kv_new;
CREATE TABLE kv (
    mod_revision INTEGER NOT NULL, sub INTEGER NOT NULL, key BLOB NOT NULL,
    create_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL,
    deleted INTEGER NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (mod_revision, sub)
) WITHOUT ROWID;
INSERT INTO kv SELECT * FROM kv_new;
DROP TABLE kv_new;
CREATE UNIQUE INDEX kv_key_revision ON kv (key, mod_revision, sub);
CREATE INDEX kv_lease ON kv (lease) WHERE lease != 0;
UPDATE meta SET value = 2 WHERE name = 'schema_version';
";

fn sqlite_sql(dir: &Path, sql: &str) {
    rusqlite::Connection::open(dir.join("state.db")).unwrap().execute_batch(sql).unwrap();
}

/// After a migration: schema 3's layout, and nothing of the old table left.
fn assert_sqlite_schema_3(dir: &Path) {
    let conn = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    let version: i64 =
        conn.query_row("SELECT value FROM meta WHERE name = 'schema_version'", [], |r| r.get(0)).unwrap();
    let kv: String = conn.query_row("SELECT sql FROM sqlite_master WHERE name = 'kv'", [], |r| r.get(0)).unwrap();
    let mut objects: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE tbl_name = 'kv' OR name LIKE 'kv%' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    objects.sort();
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(version, 3);
    assert!(!kv.contains("WITHOUT ROWID"), "kv is still clustered: {kv}");
    assert_eq!(objects, ["kv", "kv_key_revision", "kv_lease", "kv_revision"]);
    assert_eq!(check, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_schema_1_is_migrated() {
    let dir = kine_testkit::TempDir::new("migrate");
    let path = dir.path().to_path_buf();
    schema_1_is_migrated(
        || kine_testkit::sqlite(&path),
        || sqlite_sql(&path, &format!("{SQLITE_SCHEMA_2} {DOWNGRADE}")),
    )
    .await;
    assert_sqlite_schema_3(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_schema_2_is_migrated() {
    let dir = kine_testkit::TempDir::new("migrate");
    let path = dir.path().to_path_buf();
    schema_1_is_migrated(|| kine_testkit::sqlite(&path), || sqlite_sql(&path, SQLITE_SCHEMA_2)).await;
    assert_sqlite_schema_3(&path);
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
