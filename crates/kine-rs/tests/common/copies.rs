//! For tests of read-only copies: a Kubernetes-shaped write load, and checks that a copy serves
//! exactly what its origin serves (every revision, watch streams, hashes).

use etcd_client::*;
use std::time::{Duration, Instant};

/// One acknowledged write: the key, the revision it got, and the value it left (`None`: deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    pub key: String,
    pub revision: i64,
    pub value: Option<String>,
}

/// A write load shaped like kube-apiserver's: creates (`mod_revision == 0`), updates and
/// deletes conditional on the revision read, objects attached to a lease (events), and a
/// request that changes two keys at once. `prefix` separates concurrent loads.
pub struct K8sLoad {
    prefix: String,
    lease: i64,
    step: u64,
    /// Live objects: key → mod revision.
    live: Vec<(String, i64)>,
    pub acked: Vec<Acked>,
}

impl K8sLoad {
    pub async fn new(client: &mut Client, prefix: &str) -> K8sLoad {
        let lease = client.lease_grant(600, None).await.expect("grant the load's lease").id();
        K8sLoad { prefix: prefix.to_string(), lease, step: 0, live: Vec::new(), acked: Vec::new() }
    }

    /// One request. Errors (the node went away) are returned, not retried: what was not
    /// acknowledged is not recorded.
    pub async fn step(&mut self, client: &mut Client) -> Result<(), Error> {
        let i = self.step;
        self.step += 1;
        let kind = if self.live.len() < 4 { 0 } else { i % 10 };
        match kind {
            0..=3 | 8 => {
                let (key, lease) = if kind == 8 {
                    (format!("{}/events/ev-{i}", self.prefix), Some(PutOptions::new().with_lease(self.lease)))
                } else {
                    (format!("{}/pods/pod-{i}", self.prefix), None)
                };
                let value = format!("{{\"create\":{i}}}");
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), value.as_str(), lease)])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                let r = client.txn(txn).await?;
                if r.succeeded() {
                    let rev = r.header().expect("header").revision();
                    self.live.push((key.clone(), rev));
                    self.acked.push(Acked { key, revision: rev, value: Some(value) });
                }
            }
            4..=6 => {
                let n = (i as usize * 7919) % self.live.len();
                let (key, rev) = self.live[n].clone();
                let value = format!("{{\"update\":{i}}}");
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(key.as_str(), value.as_str(), None)])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                let r = client.txn(txn).await?;
                if r.succeeded() {
                    let rev = r.header().expect("header").revision();
                    self.live[n].1 = rev;
                    self.acked.push(Acked { key, revision: rev, value: Some(value) });
                }
            }
            7 => {
                let n = (i as usize * 104_729) % self.live.len();
                let (key, rev) = self.live[n].clone();
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::delete(key.as_str(), None)])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                let r = client.txn(txn).await?;
                if r.succeeded() {
                    self.live.swap_remove(n);
                    self.acked.push(Acked { key, revision: r.header().expect("header").revision(), value: None });
                }
            }
            _ => {
                // Two objects in one request (one revision; an atomic batch on NATS).
                let (a, b) = (format!("{}/pair/a-{i}", self.prefix), format!("{}/pair/b-{i}", self.prefix));
                let txn = Txn::new().and_then([TxnOp::put(a.as_str(), "a", None), TxnOp::put(b.as_str(), "b", None)]);
                let r = client.txn(txn).await?;
                let rev = r.header().expect("header").revision();
                for (key, v) in [(a, "a"), (b, "b")] {
                    self.live.push((key.clone(), rev));
                    self.acked.push(Acked { key, revision: rev, value: Some(v.into()) });
                }
            }
        }
        Ok(())
    }
}

/// Waits until `client` reports at least `revision`.
pub async fn wait_for_revision(client: &mut Client, revision: i64, limit: Duration) {
    let started = Instant::now();
    loop {
        let now = client.get("health", None).await.map(|r| r.header().expect("header").revision()).unwrap_or(0);
        if now >= revision {
            return;
        }
        assert!(started.elapsed() < limit, "still at revision {now} after {limit:?}, waiting for {revision}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

fn kvs(r: &GetResponse) -> Vec<Kv> {
    r.kvs()
        .iter()
        .map(|kv| {
            (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease())
        })
        .collect()
}

/// Every key under `prefix` at every revision in `from..=to`, and the count, are the same on
/// both (a revision compacted on one must be compacted on the other too).
pub async fn same_at_every_revision(a: &mut Client, b: &mut Client, prefix: &str, from: i64, to: i64) {
    for rev in from..=to {
        let opts = || Some(GetOptions::new().with_prefix().with_revision(rev));
        match (a.get(prefix, opts()).await, b.get(prefix, opts()).await) {
            (Ok(x), Ok(y)) => {
                assert_eq!(kvs(&x), kvs(&y), "keys under {prefix} at revision {rev}");
                assert_eq!(x.count(), y.count(), "count at revision {rev}");
            }
            (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "errors at revision {rev}"),
            (x, y) => panic!("at revision {rev}: {x:?} vs {y:?}"),
        }
    }
}

/// One watch event, everything a client sees of it.
pub type Seen = (i32, Vec<u8>, Vec<u8>, i64, i64, i64, Option<(Vec<u8>, i64)>);

/// Starts a watch on `prefix` from `from` with `prev_kv`.
pub async fn watch_from(client: &mut Client, prefix: &str, from: i64) -> WatchStream {
    let opts = WatchOptions::new().with_prefix().with_start_revision(from).with_prev_key();
    let mut w = client.watch(prefix, Some(opts)).await.expect("watch");
    let created = w.message().await.expect("watch response").expect("watch created");
    assert!(created.created(), "watch not created: {created:?}");
    w
}

/// Collects events until one at `until` or later arrived.
pub async fn collect(w: &mut WatchStream, until: i64) -> Vec<Seen> {
    let mut out: Vec<Seen> = Vec::new();
    while out.last().is_none_or(|e| e.3 < until) {
        let r = tokio::time::timeout(Duration::from_secs(30), w.message())
            .await
            .unwrap_or_else(|_| panic!("no event up to {until} within 30 s; got {} so far", out.len()))
            .expect("watch")
            .expect("watch stream open");
        assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
        out.extend(r.events().iter().map(seen));
    }
    out
}

fn seen(e: &Event) -> Seen {
    let kv = e.kv().expect("event kv");
    let prev = e.prev_kv().map(|p| (p.value().to_vec(), p.mod_revision()));
    (
        e.event_type() as i32,
        kv.key().to_vec(),
        kv.value().to_vec(),
        kv.mod_revision(),
        kv.create_revision(),
        kv.version(),
        prev,
    )
}

/// Reads a watch stream as it arrives (a watch that is not read falls behind, and one behind a
/// compaction is cancelled, as in etcd).
pub struct Collector {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub fn start(mut w: WatchStream) -> Collector {
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = events.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(r)) = w.message().await {
                assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
                sink.lock().unwrap().extend(r.events().iter().map(seen));
            }
        });
        Collector { seen: events, task }
    }

    /// Every event up to `until`, once they have arrived.
    pub async fn until(&self, until: i64) -> Vec<Seen> {
        let started = Instant::now();
        loop {
            {
                let seen = self.seen.lock().unwrap();
                if seen.last().is_some_and(|e| e.3 >= until) {
                    return seen.iter().filter(|e| e.3 <= until).cloned().collect();
                }
            }
            assert!(!self.task.is_finished(), "the watch ended (cancelled?) before revision {until}");
            assert!(started.elapsed() < Duration::from_secs(30), "no event up to {until} within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gRPC error's code and message.
pub fn status_of(e: Error) -> (tonic::Code, String) {
    match e {
        Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// This node's own entry in MemberList (a copy lists its origin's nodes as well).
pub async fn own_member(client: &mut Client) -> Member {
    let id = client.status().await.expect("status").header().expect("a header").member_id();
    let list = client.member_list().await.expect("member list");
    list.members().iter().find(|m| m.id() == id).cloned().unwrap_or_else(|| panic!("{id:x} is not in {list:?}"))
}
