//! The member registry on NATS (the keys `member.<id>` of `<bucket>-meta`): shared by the nodes
//! of one bucket, listed on a copy through its mirror of the origin's meta bucket (where puts
//! and deletes do nothing), and never mistaken for a lease.

use kine_backend_nats::{NatsBackend, NatsOptions};
use kine_core::backend::Backend;
use kine_testkit::members::{members_registry_is_shared, wait_for_records};
use kine_testkit::nats::NatsServer;
use std::sync::Arc;

async fn open(server: &NatsServer, params: &str) -> Arc<dyn Backend> {
    let endpoint = format!("{}?{params}", server.url());
    let config = kine_backend_nats::config::parse(&endpoint, |_| Ok(std::time::Duration::from_millis(500))).unwrap();
    Arc::new(NatsBackend::open(NatsOptions::new(config)).await.expect("open nats backend"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_on_one_bucket_share_the_member_registry() {
    let server = NatsServer::start();
    let a = open(&server, "bucket=kine").await;
    members_registry_is_shared(a, open(&server, "bucket=kine").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_lists_its_origins_members_and_stores_none() {
    let server = NatsServer::start();
    let origin = open(&server, "bucket=kine").await;
    origin.member_put(1, b"origin".to_vec()).await.expect("put");
    let records = [(1, b"origin".to_vec())];
    let copy = open(&server, "bucket=copy&mirror=kine").await;
    wait_for_records(&copy, &records).await;
    copy.member_put(2, b"copy".to_vec()).await.expect("a copy's put is Ok");
    copy.member_delete(1).await.expect("a copy's delete is Ok");
    assert_eq!(copy.member_records().await.expect("records"), Some(records.to_vec()), "a copy stores nothing");
    assert_eq!(origin.member_records().await.expect("records"), Some(records.to_vec()));
    // Leases (the same meta bucket) are not confused with member records, on either node, nor
    // by a node started on a bucket that has some.
    assert!(origin.leases().await.expect("leases").is_empty());
    assert!(copy.leases().await.expect("leases").is_empty());
    let again = open(&server, "bucket=kine").await;
    assert!(again.leases().await.expect("leases").is_empty());
    assert_eq!(again.member_records().await.expect("records"), Some(records.to_vec()));
}
