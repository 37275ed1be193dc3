//! The auth record on one SQL database shared by two nodes (`kine_testkit::auth`); SQLite takes
//! one node.

use kine_testkit::auth::two_nodes_share_the_auth_record;

/// An SQLite file takes one node at a time (`sqlite_lock.rs`): a second one is refused, so there
/// is no auth record to share; the networked databases below share theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sqlite_node_on_one_file_is_refused() {
    let dir = kine_testkit::TempDir::new("auth");
    let _first = kine_testkit::sqlite(dir.path());
    let path = dir.path().join("state.db");
    let second = kine_backend_sql::SqliteBackend::open(kine_backend_sql::SqliteOptions { path });
    let err = format!("{:#}", second.err().expect("a second node on one SQLite file was opened"));
    assert!(err.contains("one SQLite database is served by one kine-rs at a time"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nodes_share_the_auth_record() {
    let server = kine_testkit::postgres::PgServer::start();
    let a = kine_testkit::postgres(&server, "auth");
    two_nodes_share_the_auth_record(a, kine_testkit::postgres(&server, "auth")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_nodes_share_the_auth_record() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let a = kine_testkit::mysql(&server, "auth");
    two_nodes_share_the_auth_record(a, kine_testkit::mysql(&server, "auth")).await;
}
