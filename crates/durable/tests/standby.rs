//! A follower's local database kept current with the S3 store (`standby.rs`), against a real
//! S3-compatible server (versitygw) and SQLite: filled from the checkpoint and the segments,
//! then brought up to date with only the segments after what it holds — also after a restart
//! whose marker names an older segment than the database holds; a database that holds another
//! history, or whose fill did not finish, is emptied and filled again; one of another store is
//! refused; a round a read gave up on still applies its segments to the copy and the database;
//! and a writer checkpoints once enough segments were shipped.

mod common;
use common::{local, store};
use kine_core::backend::Backend;
use kine_core::request::{PutRequest, RangeRequest, RequestOp, TxnRequest};
use kine_core::txn::WriteOp;
use kine_core::{KeyRange, KeyValue};
use kine_durable::backend::Durable;
use kine_durable::manifest;
use kine_durable::marker;
use kine_durable::node::{self, Options};
use kine_durable::standby::Holds;
use kine_objstore::ObjectStore;
use kine_testkit::TempDir;
use kine_testkit::s3::S3Server;
use std::sync::Arc;
use std::time::Duration;

fn options(checkpoint_segments: u64) -> Options {
    Options {
        ship_interval: Duration::from_millis(50),
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_segments,
        lease: Duration::from_secs(2),
        node: "writer".into(),
        address: "http://writer:2379".into(),
        read_wait: Duration::from_secs(7),
    }
}

fn put(key: &str, value: &str) -> WriteOp {
    let put = PutRequest { key: key.into(), value: value.into(), ..PutRequest::default() };
    WriteOp::Txn(TxnRequest { compare: vec![], success: vec![RequestOp::Put(put)], failure: vec![] })
}

async fn keys(b: &dyn Backend) -> (i64, Vec<KeyValue>) {
    let r = b.range(RangeRequest::new(KeyRange::all())).await.unwrap();
    (r.revision, r.value.kvs)
}

/// A writer node on `s3` whose every write is acknowledged once shipped (one segment each).
struct Writer {
    durable: Durable,
    backend: Arc<dyn Backend>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Writer {
    async fn start(s3: Arc<dyn ObjectStore>, dir: &std::path::Path, checkpoint_segments: u64) -> Writer {
        let started = node::start(s3, local(dir), &options(checkpoint_segments)).await.unwrap();
        let backend = started.backend.clone();
        let durable = Durable::new(backend.clone(), started.handle.clone(), true, Duration::from_secs(7));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(started.runner.run(async move { stopped.await.unwrap_or_default() }));
        Writer { durable, backend, _stop: stop }
    }

    /// `n` writes, one segment each.
    async fn write(&self, from: usize, n: usize) {
        for i in from..from + n {
            self.durable.write(put(&format!("/k/{:03}", i % 40), &format!("v{i}"))).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_goes_on_from_where_its_database_is_even_past_its_marker() {
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "standby").await;
    let dir = TempDir::new("standby");
    let writer = Writer::start(s3.clone(), &dir.path().join("writer"), 10_000).await;
    writer.write(0, 30).await;

    // Filled from nothing: the segments since the first.
    let follower = dir.path().join("follower");
    let (m, _) = manifest::read(s3.as_ref(), None).await.unwrap().unwrap();
    let mut standby = local(&follower);
    standby.examine(s3.as_ref(), Some(&m)).await.unwrap();
    assert_eq!(standby.holds(), &Holds::Nothing);
    let caught = standby.catch_up(s3.as_ref()).await.unwrap();
    assert!(caught.from_checkpoint && caught.segments >= 30, "{caught:?}");
    assert_eq!(keys(standby.backend().as_ref()).await, keys(writer.backend.as_ref()).await);
    let marker_path = marker::path_for(&follower.join("state.db"));
    let early = std::fs::read(&marker_path).unwrap();

    // More segments: only those are applied.
    writer.write(30, 20).await;
    let caught = standby.catch_up(s3.as_ref()).await.unwrap();
    assert!(!caught.from_checkpoint && (20..=21).contains(&caught.segments), "{caught:?}");
    assert_eq!(keys(standby.backend().as_ref()).await, keys(writer.backend.as_ref()).await);
    standby.close().await;

    // Restarted with the marker of 20 segments ago (it is moved on at most once a second): the
    // segments the database holds already are checked, not applied again; the new ones are.
    std::fs::write(&marker_path, &early).unwrap();
    writer.write(50, 10).await;
    let mut standby = local(&follower);
    standby.examine(s3.as_ref(), Some(&m)).await.unwrap();
    let Holds::Prefix(at) = standby.holds().clone() else { panic!("{:?}", standby.holds()) };
    let caught = standby.catch_up(s3.as_ref()).await.unwrap();
    assert!(!caught.from_checkpoint, "{caught:?}");
    assert!(caught.restored.revision > at.revision + 25, "{at:?} → {caught:?}");
    assert_eq!(keys(standby.backend().as_ref()).await, keys(writer.backend.as_ref()).await);
    let events = |b: Arc<dyn Backend>| async move { b.events(&KeyRange::all(), at.revision, i64::MAX).await.unwrap() };
    assert_eq!(events(standby.backend()).await, events(writer.backend.clone()).await, "the history since the marker");
    standby.close().await;

    // A database that holds another history than the store's (here: a write of its own after
    // the marker) is emptied and filled again from the checkpoint.
    let mut standby = local(&follower);
    standby.examine(s3.as_ref(), Some(&m)).await.unwrap();
    standby.backend().write(put("/k/000", "not the store's")).await.unwrap();
    standby.close().await;
    writer.write(60, 5).await;
    let mut standby = local(&follower);
    standby.examine(s3.as_ref(), Some(&m)).await.unwrap();
    let caught = standby.catch_up(s3.as_ref()).await.unwrap();
    assert!(caught.from_checkpoint, "{caught:?}");
    assert_eq!(keys(standby.backend().as_ref()).await, keys(writer.backend.as_ref()).await);
    standby.close().await;

    // A fill that did not finish (its marker names no segment yet) is started afresh.
    let mut half = marker::read(&marker_path).unwrap().unwrap();
    half.segment = None;
    marker::write(&marker_path, &half).await.unwrap();
    let mut standby = local(&follower);
    standby.examine(s3.as_ref(), Some(&m)).await.unwrap();
    assert_eq!(standby.holds(), &Holds::Nothing, "emptied");
    assert_eq!(standby.backend().revisions().await.unwrap().current, 1);
    standby.close().await;

    // The writer's own database is its store (opened again once the writer closed it: one
    // SQLite database takes one writer at a time); without a marker another node's is refused.
    writer.backend.close().await;
    let mut own = local(&dir.path().join("writer"));
    own.examine(s3.as_ref(), Some(&m)).await.unwrap();
    assert_eq!(own.holds(), &Holds::Own);
    let other = TempDir::new("standby-other");
    let foreign = local(other.path());
    foreign.backend().write(put("/x", "y")).await.unwrap();
    let mut foreign = foreign;
    let err = foreign.examine(s3.as_ref(), Some(&m)).await.unwrap_err().to_string();
    assert!(err.contains("holds another store"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_checkpoints_once_enough_segments_were_shipped() {
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "by-count").await;
    let dir = TempDir::new("by-count");
    let writer = Writer::start(s3.clone(), dir.path(), 20).await;
    writer.write(0, 15).await;
    let (m, _) = manifest::read(s3.as_ref(), None).await.unwrap().unwrap();
    assert_eq!(m.checkpoint, None, "15 segments, and the interval is an hour");
    writer.write(15, 50).await;
    // The runner checkpoints after the segment that reached the count.
    let mut waited = 0;
    let m = loop {
        let (m, _) = manifest::read(s3.as_ref(), None).await.unwrap().unwrap();
        if m.previous.is_some() || waited > 200 {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    };
    let (newest, previous) = (m.checkpoint.expect("a checkpoint"), m.previous.expect("two checkpoints"));
    assert!(newest.revision > previous.revision, "{previous:?} then {newest:?}");
    // Only the segments the previous checkpoint's restore needs are kept.
    let names = s3.list("wal/").await.unwrap();
    assert!(names.len() <= 45, "{} segments kept: {names:?}", names.len());

    // A node restored from the prefix reads the checkpoint and at most about 20 segments.
    let restored = local(&dir.path().join("restored"));
    let r = kine_durable::restore::restore(s3.as_ref(), restored.backend().as_ref(), None).await.unwrap();
    assert!(r.checkpoint.is_some() && r.segments <= 25, "{r:?}");
    assert_eq!(keys(restored.backend().as_ref()).await, keys(writer.backend.as_ref()).await);
}

/// A linearizable read on a follower waits for a catch-up round; one that gives up (its deadline
/// passed) leaves the round to finish, so that neither the copy nor the local database is left
/// with a segment applied halfway through the round's count of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_a_read_gave_up_on_still_applies_its_segments() {
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "gave-up").await;
    let dir = TempDir::new("gave-up");
    let writer = Writer::start(s3.clone(), &dir.path().join("writer"), 10_000).await;
    writer.write(0, 10).await;
    let leases = tokio::sync::broadcast::channel(16).0;
    let copy = Arc::new(kine_durable::copy::Copy::open(s3.clone(), leases).await.unwrap().expect("a store"));
    let (m, _) = manifest::read(s3.as_ref(), None).await.unwrap().unwrap();
    let mut standby = local(&dir.path().join("follower"));
    standby.examine(s3.as_ref(), Some(&m)).await.unwrap();
    standby.catch_up(s3.as_ref()).await.unwrap();
    copy.attach(standby);

    writer.write(10, 30).await;
    let (target, _) = keys(writer.backend.as_ref()).await;
    // The read gives up at once; no other round runs.
    assert!(tokio::time::timeout(Duration::ZERO, copy.barrier()).await.is_err());
    let mut waited = 0;
    while copy.position().await.0 < target {
        assert!(waited < 400, "the round the read gave up on stopped at {:?}", copy.position().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    let standby = copy.detach().await.expect("the standby");
    assert_eq!(standby.position().map(|at| at.revision), Some(target));
    assert_eq!(keys(standby.backend().as_ref()).await, keys(writer.backend.as_ref()).await);
}
