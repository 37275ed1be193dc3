//! The writer lock against a real S3-compatible server (versitygw): one writer among nodes
//! ticking together; a writer that stops renewing is replaced after its lease with the next
//! term, and once back it finds itself fenced.

use kine_durable::lock::{Contender, Status};
mod common;
use kine_objstore::ObjectStore;
use kine_testkit::s3::S3Server;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(2);

async fn store(server: &S3Server) -> Arc<dyn ObjectStore> {
    common::store(server, "lock-test").await
}

fn writer(s: &Status) -> Option<u64> {
    match s {
        Status::Writer { term, until } if Instant::now() < *until => Some(*term),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_then_a_takeover_with_the_next_term() {
    let server = S3Server::start(&["kine"]);
    let store = store(&server).await;
    let mut nodes: Vec<Contender> = (0..3)
        .map(|i| Contender::new(store.clone(), &format!("node-{i}"), &format!("10.0.0.{i}:2379"), LEASE))
        .collect();

    // Ticking together for three leases: always exactly one writer, always the same one.
    let mut first = None;
    // Until when the writer may write, as it last learnt.
    let mut old_until = Instant::now();
    let started = Instant::now();
    while started.elapsed() < LEASE * 3 {
        let mut writers = Vec::new();
        for (i, n) in nodes.iter_mut().enumerate() {
            let status = n.tick().await.unwrap();
            if let Some(term) = writer(&status) {
                writers.push((i, term));
                if let Status::Writer { until, .. } = status {
                    old_until = until;
                }
            }
        }
        assert_eq!(writers.len(), 1, "{writers:?}");
        assert!(first.is_none_or(|f| f == writers[0]), "the writer changed: {first:?} → {writers:?}");
        first = Some(writers[0]);
        tokio::time::sleep(LEASE / 4).await;
    }
    let (old, term) = first.unwrap();
    assert_eq!(term, 1);

    // The writer stops renewing (a crash, a pause): another takes over with term 2, never while
    // the old writer may still write.
    let stopped = Instant::now();
    let (new, new_term) = loop {
        let mut writers = Vec::new();
        for (i, n) in nodes.iter_mut().enumerate().filter(|(i, _)| *i != old) {
            if let Some(term) = writer(&n.tick().await.unwrap()) {
                writers.push((i, term));
            }
        }
        assert!(writers.len() <= 1, "{writers:?}");
        if let Some(w) = writers.pop() {
            break w;
        }
        assert!(stopped.elapsed() < LEASE * 3, "nobody took over");
        tokio::time::sleep(LEASE / 4).await;
    };
    assert!(Instant::now() >= old_until, "taken over while the old writer's lease ran");
    assert_eq!(new_term, 2);
    assert_ne!(new, old);

    // The old writer comes back: its renewal is refused, it follows the new one.
    match nodes[old].tick().await.unwrap() {
        Status::Follower { holder: Some(h) } => assert_eq!((h.node, h.term), (format!("node-{new}"), 2)),
        other => panic!("the old writer is not fenced: {other:?}"),
    }
}
