//! Several nodes started at the same moment on a database that does not exist yet (a fresh
//! cluster's nodes, all started by one deploy): every one opens it, none fails on the others'
//! CREATE DATABASE or schema creation, and all serve the same data.

use kine_core::backend::Backend;
use kine_testkit::contract;
use std::sync::{Arc, Barrier};

const NODES: usize = 4;

/// Opens `NODES` backends at once with `open`, then checks a write on one is read on every other.
async fn all_open_at_once(open: impl Fn() -> Arc<dyn Backend> + Send + Sync + 'static) {
    let open = Arc::new(open);
    let barrier = Arc::new(Barrier::new(NODES));
    let threads: Vec<_> = (0..NODES)
        .map(|_| {
            let (open, barrier) = (open.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                open()
            })
        })
        .collect();
    let backends: Vec<Arc<dyn Backend>> =
        threads.into_iter().map(|t| t.join().expect("every node opens the new database")).collect();
    let first = contract::store(backends[0].clone()).await;
    let revision = contract::put(&first, "/registry/first", "v").await;
    assert_eq!(revision, 2, "one database, one history");
    for b in &backends {
        let store = contract::store(b.clone()).await;
        assert_eq!(contract::get(&store, "/registry/first").await.map(|kv| kv.mod_revision), Some(revision));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nodes_starting_at_once_share_one_new_database() {
    let server = Arc::new(kine_testkit::postgres::PgServer::start());
    all_open_at_once(move || kine_testkit::postgres(&server, "born_together")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_nodes_starting_at_once_share_one_new_database() {
    let server = Arc::new(kine_testkit::mysql::MariaDbServer::start());
    all_open_at_once(move || kine_testkit::mysql(&server, "born_together")).await;
}
