//! The real Go kine (v0.17.5, built with its embedded NATS server as k3s builds it) for tests of
//! the datastores it leaves behind. The binary comes from `GO_KINE_BIN` or `~/go/bin/kine`
//! (`scripts/install-test-deps` installs it); a missing binary is a test failure, never a skip.

#![allow(dead_code)]

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use kine_testkit::nats::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const INSTALL: &str = "go install -tags nats github.com/k3s-io/kine@v0.17.5";

pub fn go_kine_bin() -> PathBuf {
    if let Ok(p) = std::env::var("GO_KINE_BIN") {
        return PathBuf::from(p);
    }
    let path = PathBuf::from(std::env::var("HOME").unwrap_or_default()).join("go/bin/kine");
    assert!(path.is_file(), "Go kine not found at {}: run `{INSTALL}` (or set GO_KINE_BIN)", path.display());
    path
}

/// A Go kine process serving `endpoint` on a free loopback port; killed on drop.
pub struct GoKine {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl GoKine {
    /// Starts Go kine (in `dir`, where its log goes too) and waits until it answers a read.
    pub async fn start(endpoint: &str, dir: &Path) -> GoKine {
        Self::start_with(endpoint, dir, &[]).await
    }

    /// [`GoKine::start`] with more of Go kine's flags.
    pub async fn start_with(endpoint: &str, dir: &Path, flags: &[&str]) -> GoKine {
        let port = free_port();
        let log = dir.join(format!("go-kine-{port}.log"));
        let child = Command::new(go_kine_bin())
            .args(["--endpoint", endpoint, "--listen-address", &format!("127.0.0.1:{port}")])
            .args(["--metrics-bind-address", "0"])
            .args(flags)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("Go kine's log"))
            .spawn()
            .expect("spawn Go kine");
        let mut kine = GoKine { child, url: format!("http://127.0.0.1:{port}"), log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut c) = etcd_client::Client::connect([kine.url.as_str()], None).await
                && c.get("/registry/health", None).await.is_ok()
            {
                return kine;
            }
            if Instant::now() > deadline || matches!(kine.child.try_wait(), Ok(Some(_))) {
                panic!("Go kine on {endpoint} did not answer within 60 s; its log:\n{}", kine.log());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.url.as_str()], None).await.expect("connect to Go kine")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops Go kine as an operator would (SIGTERM) and waits for it to exit.
    pub async fn stop(mut self) {
        let _ = Command::new("kill").args(["-s", "TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for GoKine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How Go kine compacts: its SQL log keeps `--compact-min-retain` (10 here) revisions below the
/// one asked for; on NATS it records the one asked for.
#[derive(Clone, Copy, PartialEq)]
pub enum Compaction {
    Sql,
    Nats,
}

/// Creates, updates and deletes the way kube-apiserver makes them (compare-and-swap Txns on
/// the mod revision), plain Puts, a key on a lease and, with `compact`, a compaction. Returns
/// the compact revision Go kine recorded.
pub async fn write_like_kubernetes(
    c: &mut etcd_client::Client,
    from: usize,
    to: usize,
    compact: Option<Compaction>,
) -> i64 {
    let mut revisions = std::collections::BTreeMap::new();
    for i in from..to {
        let key = format!("/registry/configmaps/default/cm-{i:04}");
        let create = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), format!("v1 of {i}"), None)]);
        let r = c.txn(create).await.unwrap();
        assert!(r.succeeded());
        revisions.insert(i, r.header().unwrap().revision());
    }
    for i in (from..to).step_by(3) {
        let key = format!("/registry/configmaps/default/cm-{i:04}");
        let update = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revisions[&i])])
            .and_then([TxnOp::put(key.as_str(), vec![0u8, 1, 2, i as u8], None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let r = c.txn(update).await.unwrap();
        assert!(r.succeeded());
        revisions.insert(i, r.header().unwrap().revision());
    }
    for i in (from..to).step_by(7) {
        let key = format!("/registry/configmaps/default/cm-{i:04}");
        let delete = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revisions[&i])])
            .and_then([TxnOp::delete(key.as_str(), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        assert!(c.txn(delete).await.unwrap().succeeded());
    }
    let lease = c.lease_grant(3600, None).await.unwrap().id();
    let event = format!("/registry/events/default/e-{from}");
    c.put(event.as_str(), "an event", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    let mut compacted = 0;
    if let Some(how) = compact {
        let at = c.put("/registry/masterleases/x", "1", None).await.unwrap().header().unwrap().revision();
        c.compact(at, None).await.unwrap();
        compacted = if how == Compaction::Sql { at - 10 } else { at };
    }
    // After the compaction, updates as kube-apiserver makes them (Go kine on NATS refuses a
    // plain Put of a key last written below its compact revision).
    for i in (from..to).step_by(5) {
        let key = format!("/registry/configmaps/default/cm-{i:04}");
        let current = c.get(key.as_str(), None).await.unwrap();
        let rev = current.kvs().first().map_or(0, |kv| kv.mod_revision());
        let update = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
            .and_then([TxnOp::put(key.as_str(), format!("after {i}"), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        assert!(c.txn(update).await.unwrap().succeeded());
    }
    compacted
}

/// A key as a client sees it, without its version (Go kine reports none).
pub type Key = (Vec<u8>, Vec<u8>, i64, i64, i64);

/// What a server answers: the header revision, every key, and every event after `after`
/// (revision, PUT/DELETE, key, and the value of a put).
#[derive(Debug, PartialEq)]
pub struct Served {
    pub revision: i64,
    pub keys: Vec<Key>,
    pub events: Vec<(i64, String, Vec<u8>, Vec<u8>)>,
}

pub async fn served(c: &mut etcd_client::Client, after: i64) -> Served {
    let all = c.get("/registry/", Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    let revision = all.header().unwrap().revision();
    let keys = all
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.lease()))
        .collect();
    let options = WatchOptions::new().with_prefix().with_start_revision(after + 1);
    let mut stream = c.watch("/registry/", Some(options)).await.unwrap();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while events.last().is_none_or(|e: &(i64, String, Vec<u8>, Vec<u8>)| e.0 < revision) {
        let left = deadline.saturating_duration_since(Instant::now());
        let resp = tokio::time::timeout(left, stream.message()).await.expect("the watch caught up").unwrap();
        for e in resp.unwrap().events() {
            let kv = e.kv().unwrap();
            let (kind, value) = match e.event_type() {
                EventType::Put => ("PUT", kv.value().to_vec()),
                EventType::Delete => ("DELETE", Vec::new()),
            };
            events.push((kv.mod_revision(), kind.to_string(), kv.key().to_vec(), value));
        }
        if revision <= after {
            break;
        }
    }
    Served { revision, keys, events }
}
