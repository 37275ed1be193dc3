//! A writer cut off from S3 mid-upload, replaced by another node, whose upload S3 completes
//! afterwards (a "zombie" segment of the old term, landing after the new term began): the old
//! writer acknowledges nothing that is not in the store's history, and a restore from the
//! prefix skips the late segment and holds exactly the new writer's store.
//!
//! The cut is a gate in front of the old writer's object store (requests held until the gate
//! opens, then sent to the real server even if the caller gave up: S3 completes a request it
//! has received whether or not the client is still there).

mod common;
use bytes::Bytes;
use common::store;
use kine_core::backend::Backend;
use kine_core::request::{PutRequest, RangeRequest, RequestOp, TxnRequest};
use kine_core::txn::WriteOp;
use kine_core::{KeyRange, KeyValue};
use kine_durable::backend::Durable;
use kine_durable::node::{self, Options};
use kine_durable::restore::restore;
use kine_durable::segment;
use kine_objstore::{Object, ObjectStore};
use kine_testkit::s3::S3Server;
use kine_testkit::{TempDir, sqlite};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

type Call<T> = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<T>> + Send>>;

/// An object store whose requests wait while its gate is shut.
struct Gated {
    real: Arc<dyn ObjectStore>,
    open: watch::Sender<bool>,
}

impl Gated {
    /// Runs `call` on the real store once the gate is open, to the end even if the caller goes.
    async fn pass<T: Send + 'static>(
        &self,
        call: impl FnOnce(Arc<dyn ObjectStore>) -> Call<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let (real, mut open) = (self.real.clone(), self.open.subscribe());
        tokio::spawn(async move {
            let _ = open.wait_for(|o| *o).await;
            call(real).await
        })
        .await?
    }
}

#[async_trait::async_trait]
impl ObjectStore for Gated {
    async fn get(&self, key: &str) -> anyhow::Result<Option<Object>> {
        let key = key.to_string();
        self.pass(move |s| Box::pin(async move { s.get(&key).await })).await
    }
    async fn put(&self, key: &str, body: Bytes) -> anyhow::Result<String> {
        let key = key.to_string();
        self.pass(move |s| Box::pin(async move { s.put(&key, body).await })).await
    }
    async fn put_if_absent(&self, key: &str, body: Bytes) -> anyhow::Result<Option<String>> {
        let key = key.to_string();
        self.pass(move |s| Box::pin(async move { s.put_if_absent(&key, body).await })).await
    }
    async fn put_if_match(&self, key: &str, body: Bytes, etag: &str) -> anyhow::Result<Option<String>> {
        let (key, etag) = (key.to_string(), etag.to_string());
        self.pass(move |s| Box::pin(async move { s.put_if_match(&key, body, &etag).await })).await
    }
    async fn list(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let prefix = prefix.to_string();
        self.pass(move |s| Box::pin(async move { s.list(&prefix).await })).await
    }
    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        let key = key.to_string();
        self.pass(move |s| Box::pin(async move { s.delete(&key).await })).await
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

fn options(node: &str) -> Options {
    Options {
        ship_interval: Duration::from_millis(50),
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_segments: 10_000,
        lease: Duration::from_secs(2),
        node: node.into(),
        address: format!("http://{node}:2379"),
        read_wait: Duration::from_secs(7),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_lands_after_a_takeover_is_neither_acknowledged_nor_restored() {
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "zombie").await;
    let dir = TempDir::new("fencing");

    // The first writer, through the gate, acknowledges writes once they are in S3.
    let gated = Arc::new(Gated { real: s3.clone(), open: watch::channel(true).0 });
    let started = node::start(gated.clone(), common::local(&dir.path().join("old")), &options("old")).await.unwrap();
    let local = started.backend.clone();
    let old = Arc::new(Durable::new(local.clone(), started.handle.clone(), true, Duration::from_secs(7)));
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(started.runner.run(async move { stopped.await.unwrap_or_default() }));
    for i in 0..5 {
        old.write(put(&format!("/acked/{i}"), "in S3")).await.unwrap();
    }
    let acked = keys(local.as_ref()).await;

    // S3 stops answering the old writer; one more write is committed locally, its upload held.
    gated.open.send_replace(false);
    let pending = tokio::spawn({
        let old = old.clone();
        async move { old.write(put("/pending", "never acknowledged")).await }
    });

    // Another node waits out the lease, takes over with the next term from what S3 holds, and
    // writes.
    let taken = Instant::now();
    let started = node::start(s3.clone(), common::local(&dir.path().join("new")), &options("new")).await.unwrap();
    let next = started.backend.clone();
    eprintln!("took over in {:?}", taken.elapsed());
    assert_eq!(keys(next.as_ref()).await, acked, "the new writer starts from what was acknowledged");
    let new = Durable::new(next.clone(), started.handle.clone(), true, Duration::from_secs(7));
    let (_stop_new, stopped) = tokio::sync::oneshot::channel::<()>();
    let _runner_new = tokio::spawn(started.runner.run(async move { stopped.await.unwrap_or_default() }));
    new.write(put("/after-takeover", "by the new writer")).await.unwrap();

    // The old writer's held requests reach S3 now: its segment of the old term lands after the
    // new term's first one.
    let terms = |names: &[String]| names.iter().filter_map(|n| segment::parse_name(n)).map(|n| n.0).max();
    let before = s3.list("wal/").await.unwrap();
    gated.open.send_replace(true);
    let answer = tokio::time::timeout(Duration::from_secs(30), pending).await.expect("the old writer answers").unwrap();
    let err = answer.expect_err("the old writer acknowledged a write that is not in the store's history");
    eprintln!("the old writer answered: {err}");
    let landed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let now = s3.list("wal/").await.unwrap();
            let zombie = now.iter().filter(|n| !before.contains(n)).find(|n| segment::parse_name(n).unwrap().0 == 1);
            if let Some(zombie) = zombie {
                return zombie.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the old writer's held upload reaches S3");
    eprintln!("late segment of term 1: {landed}, newest term {:?}", terms(&s3.list("wal/").await.unwrap()));
    let result = tokio::time::timeout(Duration::from_secs(30), runner).await.expect("the old writer stops").unwrap();
    assert!(result.is_err(), "the old writer must stop once another node holds the lock");

    // A restore from the prefix is the new writer's store, without the late segment.
    new.write(put("/last", "by the new writer")).await.unwrap();
    let restored = sqlite(&dir.path().join("restored"));
    let r = restore(s3.as_ref(), restored.as_ref(), None).await.unwrap();
    assert_eq!(r.zombies, 1, "{r:?}");
    assert_eq!(keys(restored.as_ref()).await, keys(next.as_ref()).await);
    let (_, kvs) = keys(restored.as_ref()).await;
    assert!(kvs.iter().all(|kv| kv.key != b"/pending"), "an unacknowledged write of the old term was restored");
}
