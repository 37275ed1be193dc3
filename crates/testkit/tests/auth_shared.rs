//! The auth record on one SQL database shared by two nodes (`kine_testkit::auth`).

use kine_testkit::auth::two_nodes_share_the_auth_record;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_nodes_on_one_file_share_the_auth_record() {
    let dir = kine_testkit::TempDir::new("auth");
    two_nodes_share_the_auth_record(kine_testkit::sqlite(dir.path()), kine_testkit::sqlite(dir.path())).await;
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
