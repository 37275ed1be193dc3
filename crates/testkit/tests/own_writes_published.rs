//! On the network databases a node's own writes reach its watchers before the writes are
//! answered, as in etcd (the writer publishes them; other nodes' writes come through the feed):
//! when a put returns, its event, with the previous version, is already in the node's feed.
//! Another node's writes interleaved with them still reach each node once, in revision order.

use kine_core::backend::Backend;
use kine_core::{EventKind, RevisionEvents};
use kine_testkit::contract::{put, store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

async fn own_writes_are_published_before_the_answer(backend: Arc<dyn Backend>) {
    let mut feed = backend.subscribe();
    let s = store(backend).await;
    for i in 0..50 {
        let rev = put(&s, "own/key", &format!("v{i}")).await;
        let ev = feed
            .try_recv()
            .unwrap_or_else(|e| panic!("put {i} (revision {rev}) answered, its event not published: {e:?}"));
        assert_eq!(ev.revision, rev);
        let [event] = &ev.events[..] else { panic!("one event at {rev}: {ev:?}") };
        assert_eq!((event.kind, event.kv.value.as_slice()), (EventKind::Put, format!("v{i}").as_bytes()));
        let prev = event.prev_kv.as_ref().map(|p| p.value.clone());
        assert_eq!(prev, (i > 0).then(|| format!("v{}", i - 1).into_bytes()), "prev_kv at {rev}");
    }
}

/// Two nodes write in turn and at once: each node's feed holds every revision once, in order.
async fn two_nodes_publish_every_revision_once(a: Arc<dyn Backend>, b: Arc<dyn Backend>) {
    let (mut fa, mut fb) = (a.subscribe(), b.subscribe());
    let (sa, sb) = (store(a).await, store(b).await);
    let writes = |s: Arc<kine_core::store::Store>, node: &'static str| async move {
        let mut last = 0;
        for i in 0..100 {
            last = put(&s, &format!("{node}/{}", i % 7), "x").await;
        }
        last
    };
    // The stores stay open until both feeds are read (a closed node publishes nothing more).
    let (la, lb) = tokio::join!(writes(sa.clone(), "a"), writes(sb.clone(), "b"));
    let last = la.max(lb);
    for feed in [&mut fa, &mut fb] {
        let mut expected = 2;
        while expected <= last {
            let ev: Arc<RevisionEvents> = match tokio::time::timeout(Duration::from_secs(30), feed.recv()).await {
                Ok(Ok(ev)) => ev,
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => panic!("feed lagged by {n}"),
                other => panic!("revision {expected} never published: {other:?}"),
            };
            assert_eq!(ev.revision, expected, "revisions out of order or repeated");
            expected += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_own_writes_are_published_before_the_answer() {
    let server = kine_testkit::postgres::PgServer::start();
    own_writes_are_published_before_the_answer(kine_testkit::postgres(&server, "own")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_own_writes_are_published_before_the_answer() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    own_writes_are_published_before_the_answer(kine_testkit::mysql(&server, "own")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_publish_every_revision_once() {
    let server = kine_testkit::postgres::PgServer::start();
    let a = kine_testkit::postgres(&server, "two");
    let b = kine_testkit::postgres(&server, "two");
    two_nodes_publish_every_revision_once(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_two_nodes_publish_every_revision_once() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let a = kine_testkit::mysql(&server, "two");
    let b = kine_testkit::mysql(&server, "two");
    two_nodes_publish_every_revision_once(a, b).await;
}
