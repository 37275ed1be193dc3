//! MemberList lists every kine-rs node serving the datastore (`--name`, client URL), on
//! datastores several nodes share; a node that stops leaves the list.

mod common;

use common::{Server, sqlite_server};
use kine_testkit::nats::NatsServer;
use std::time::{Duration, Instant};

async fn names(server: &Server) -> Vec<(u64, String, Vec<String>)> {
    let mut c = server.client().await;
    let list = c.member_list().await.unwrap();
    list.members().iter().map(|m| (m.id(), m.name().to_string(), m.client_urls().to_vec())).collect()
}

async fn until_names(server: &Server, want: &[&str]) -> Vec<(u64, String, Vec<String>)> {
    let start = Instant::now();
    loop {
        let got = names(server).await;
        let mut seen: Vec<&str> = got.iter().map(|m| m.1.as_str()).collect();
        seen.sort();
        if seen == want {
            return got;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "members {seen:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_of_a_shared_datastore_is_a_member() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=members", nats.url());
    let start = |name: &str| Server::start(&["--endpoint", &endpoint, "--name", name]);
    let (a, b, mut c) = (start("node-a"), start("node-b"), start("node-c"));
    let list = until_names(&a, &["node-a", "node-b", "node-c"]).await;
    assert!(list.windows(2).all(|w| w[0].0 < w[1].0), "sorted by id, as etcd: {list:?}");
    let urls: Vec<&String> = list.iter().flat_map(|m| &m.2).collect();
    for server in [&a, &b, &c] {
        assert!(urls.contains(&&server.url), "{} is listed with its URL: {list:?}", server.url);
    }
    until_names(&b, &["node-a", "node-b", "node-c"]).await;
    // Status names a leader that is a member (clients check it).
    let status = a.client().await.status().await.unwrap();
    assert!(list.iter().any(|m| m.0 == status.leader()));
    // A node that stops removes itself.
    c.stop("TERM").await;
    until_names(&a, &["node-a", "node-b"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_datastore_lists_its_node_by_name() {
    let (server, _dir) = sqlite_server(&["--name", "solo"]);
    let list = names(&server).await;
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].1.as_str(), list[0].2.clone()), ("solo", vec![server.url.clone()]));
}
