//! The member registry on one SQL database shared by two nodes (`kine_testkit::members`);
//! single-node datastores (memory, SQLite) have none.

use kine_testkit::members::{members_registry_is_shared, no_registry};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_sqlite_have_no_registry() {
    no_registry(kine_testkit::memory()).await;
    let dir = kine_testkit::TempDir::new("members");
    no_registry(kine_testkit::sqlite(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nodes_share_the_member_registry() {
    let server = kine_testkit::postgres::PgServer::start();
    let a = kine_testkit::postgres(&server, "members");
    members_registry_is_shared(a, kine_testkit::postgres(&server, "members")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_nodes_share_the_member_registry() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let a = kine_testkit::mysql(&server, "members");
    members_registry_is_shared(a, kine_testkit::mysql(&server, "members")).await;
}
