//! The auth record on NATS (the key `auth` of `<bucket>-meta`): shared by the nodes of one
//! bucket, read on a copy through its mirror of the origin's meta bucket, refused there as a
//! write, and never mistaken for a lease.

use kine_backend_nats::{NatsBackend, NatsOptions};
use kine_core::Error;
use kine_core::backend::Backend;
use kine_testkit::auth::{two_nodes_share_the_auth_record, wait_for_record};
use kine_testkit::nats::NatsServer;
use std::sync::Arc;

async fn open(server: &NatsServer, params: &str) -> Arc<dyn Backend> {
    let endpoint = format!("{}?{params}", server.url());
    let config = kine_backend_nats::config::parse(&endpoint, |_| Ok(std::time::Duration::from_millis(500))).unwrap();
    Arc::new(NatsBackend::open(NatsOptions::new(config)).await.expect("open nats backend"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_on_one_bucket_share_the_auth_record() {
    let server = NatsServer::start();
    let a = open(&server, "bucket=kine").await;
    two_nodes_share_the_auth_record(a, open(&server, "bucket=kine").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_reads_its_origins_auth_record_and_refuses_to_replace_it() {
    let server = NatsServer::start();
    let origin = open(&server, "bucket=kine").await;
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    assert!(origin.auth_replace(None, big).await.expect("create"));
    let record = origin.auth_record().await.expect("read").expect("record");
    let copy = open(&server, "bucket=copy&mirror=kine").await;
    wait_for_record(&copy, &record).await;
    let refused = copy.auth_replace(Some(record.version), b"x".to_vec()).await;
    assert!(matches!(refused, Err(Error::ReadOnly(_))), "{refused:?}");
    // Leases (the same meta bucket) are not confused with the record, on either node.
    assert!(origin.leases().await.expect("leases").is_empty());
    assert!(copy.leases().await.expect("leases").is_empty());
    // A node started on a bucket that has a record loads its leases past it.
    let again = open(&server, "bucket=kine").await;
    assert_eq!(again.auth_record().await.expect("read"), Some(record));
}

/// The meta bucket sets no value size limit; the server's max_payload (1 MiB by default) is
/// the limit, and a larger record is refused as too large, not as an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_record_beyond_max_payload_is_too_large() {
    let server = NatsServer::start();
    let b = open(&server, "bucket=kine").await;
    assert!(b.auth_replace(None, vec![1; 1_000_000]).await.expect("1 MB fits"));
    let version = b.auth_record().await.expect("read").expect("record").version;
    let refused = b.auth_replace(Some(version), vec![2; 1 << 20]).await;
    assert!(matches!(refused, Err(Error::RequestTooLarge)), "{refused:?}");
    assert_eq!(b.auth_record().await.expect("read").expect("record").version, version);
}
