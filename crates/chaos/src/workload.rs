//! The Kubernetes-shaped workload: clients on every node create, read, update and delete objects
//! the way kube-apiserver does (compare-and-swap transactions on the mod revision, retried from
//! the value a conflict returns), write plain Puts (which must never fail because others write
//! the same key), list the whole prefix, attach some objects to leases and revoke
//! them, and compact behind the watchers. Every operation is recorded with its outcome.

use crate::history::{Acked, History, Listed};
use crate::linearizability::{Call, Outcome, Seen};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// How the workload runs.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Every key lives under this prefix (it must be empty when the workload starts).
    pub prefix: String,
    /// Keys checked for linearizability (`{prefix}k{i}`).
    pub keys: usize,
    pub clients_per_node: usize,
    /// Bound on every request; a request without an answer by then has an unknown outcome.
    pub timeout: Duration,
    /// Size of every value (a Kubernetes object is a few hundred bytes).
    pub value_bytes: usize,
    /// What the clients do.
    pub mix: Mix,
}

/// The share of each operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// kube-apiserver's: reads, compare-and-swap creates, updates and deletes, plain puts, lists
    /// of the prefix and leased objects.
    Kubernetes,
    /// Single keys only: reads, compare-and-swap writes and plain puts, as an etcd client's
    /// key-value workload (every operation is one the per-key linearizability check sees).
    KeyValue,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            prefix: "/registry/chaos/".into(),
            keys: 16,
            clients_per_node: 3,
            timeout: Duration::from_secs(3),
            value_bytes: 200,
            mix: Mix::Kubernetes,
        }
    }
}

/// The bytes of value `id`: its id in hex, then padding.
pub fn encode(id: u64, size: usize) -> Vec<u8> {
    let mut v = format!("{id:016x}").into_bytes();
    v.resize(size.max(16), b'.');
    v
}

/// The id of a value the workload wrote; None for anything else.
pub fn decode(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value.get(..16)?).ok().and_then(|s| u64::from_str_radix(s, 16).ok())
}

/// A small deterministic generator (xorshift), one per client.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One client: its node, a connection, and what it believes each key's mod revision is (as
/// kube-apiserver's watch cache would, possibly stale).
pub struct Worker {
    pub node: usize,
    pub id: u64,
    pub client: Client,
    pub spec: Workload,
    pub history: Arc<History>,
    known: HashMap<String, i64>,
    counter: u64,
    rng: Rng,
}

impl Worker {
    pub fn new(node: usize, id: u64, client: Client, spec: Workload, history: Arc<History>) -> Worker {
        Worker { node, id, client, spec, history, known: HashMap::new(), counter: 0, rng: Rng::new(id + 1) }
    }

    /// Runs operations until `stop` is set.
    pub async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            let key = format!("{}k{}", self.spec.prefix, self.rng.below(self.spec.keys as u64));
            if self.spec.mix == Mix::KeyValue {
                match self.rng.below(100) {
                    0..40 => self.get(&key).await,
                    40..50 => self.write(&key, true).await,
                    50..75 => self.write(&key, false).await,
                    75..95 => self.put(&key).await,
                    _ => self.delete(&key).await,
                }
                continue;
            }
            match self.rng.below(100) {
                0..25 => self.get(&key).await,
                25..38 => self.write(&key, true).await,
                38..63 => self.write(&key, false).await,
                63..71 => self.put(&key).await,
                71..78 => self.delete(&key).await,
                78..90 => self.list().await,
                _ => self.leased().await,
            }
        }
    }

    fn next_value(&mut self, key: &str) -> u64 {
        self.counter += 1;
        let value = (self.id << 40) | self.counter;
        self.history.attempt(value, key);
        value
    }

    /// Runs `request` within the timeout; errors are counted and become `Err`.
    async fn bounded<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Failed> {
        match tokio::time::timeout(self.spec.timeout, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.history.error(error_kind(&e));
                // As a client backs off: a node that is down is not asked thousands of times a
                // second (each a write of unknown outcome for the checker).
                tokio::time::sleep(ERROR_BACKOFF).await;
                Err(if refused_by_learner(&e) || never_sent(&e) { Failed::Refused } else { Failed::Unknown })
            }
            Err(_) => {
                self.history.error("timeout".into());
                Err(Failed::Unknown)
            }
        }
    }

    async fn get(&mut self, key: &str) {
        let invoked = self.history.now();
        let mut client = self.client.clone();
        let Ok(resp) = self.bounded(client.get(key, None)).await else { return };
        let seen = resp.kvs().first().and_then(|kv| Some((decode(kv.value())?, kv.mod_revision())));
        self.remember(key, seen);
        self.history.record(self.node, key, Call::Get, Outcome::Read(seen), invoked);
    }

    /// A create (`If mod == 0`) or an update from the believed mod revision.
    async fn write(&mut self, key: &str, create: bool) {
        let expected = if create { 0 } else { self.known.get(key).copied().unwrap_or(0) };
        if expected == 0 && !create {
            return self.get(key).await;
        }
        let value = self.next_value(key);
        let call = if create { Call::Create { value } } else { Call::Update { expected, value } };
        let put = TxnOp::put(key, encode(value, self.spec.value_bytes), None);
        self.compare_and(key, expected, put, call).await;
    }

    /// A plain Put, as `etcdctl put` or a controller that does not compare.
    async fn put(&mut self, key: &str) {
        let value = self.next_value(key);
        let invoked = self.history.now();
        let mut client = self.client.clone();
        let call = Call::Put { value };
        match self.bounded(client.put(key, encode(value, self.spec.value_bytes), None)).await {
            Ok(resp) => {
                let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                self.known.insert(key.to_string(), revision);
                self.history.record(self.node, key, call, Outcome::Written(revision), invoked);
            }
            Err(Failed::Refused) => {}
            Err(Failed::Unknown) => {
                self.known.remove(key);
                self.history.record(self.node, key, call, Outcome::Unknown, invoked);
            }
        }
    }

    async fn delete(&mut self, key: &str) {
        let Some(&expected) = self.known.get(key).filter(|r| **r > 0) else { return self.get(key).await };
        self.compare_and(key, expected, TxnOp::delete(key, None), Call::Delete { expected }).await;
    }

    async fn compare_and(&mut self, key: &str, expected: i64, then: TxnOp, call: Call) {
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([then])
            .or_else([TxnOp::get(key, None)]);
        let invoked = self.history.now();
        let mut client = self.client.clone();
        let resp = match self.bounded(client.txn(txn)).await {
            Ok(resp) => resp,
            // A read-only node (an S3 follower), or one that is down, did nothing.
            Err(Failed::Refused) => return,
            Err(Failed::Unknown) => {
                self.known.remove(key);
                return self.history.record(self.node, key, call, Outcome::Unknown, invoked);
            }
        };
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        if resp.succeeded() {
            self.known.insert(key.to_string(), if matches!(call, Call::Delete { .. }) { 0 } else { revision });
            return self.history.record(self.node, key, call, Outcome::Written(revision), invoked);
        }
        let seen: Seen = match resp.op_responses().first() {
            Some(TxnOpResponse::Get(g)) => {
                g.kvs().first().and_then(|kv| Some((decode(kv.value())?, kv.mod_revision())))
            }
            _ => None,
        };
        self.remember(key, seen);
        self.history.record(self.node, key, call, Outcome::Refused(seen), invoked);
    }

    fn remember(&mut self, key: &str, seen: Seen) {
        self.known.insert(key.to_string(), seen.map(|s| s.1).unwrap_or(0));
    }

    async fn list(&mut self) {
        let mut client = self.client.clone();
        // Paginated as kube-apiserver lists (the prefix never holds this many keys).
        let options = GetOptions::new().with_prefix().with_limit(5000);
        let Ok(resp) = self.bounded(client.get(self.spec.prefix.as_str(), Some(options))).await else { return };
        if resp.more() {
            return self.history.error("list longer than a page".into());
        }
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let items = resp
            .kvs()
            .iter()
            .filter_map(|kv| Some((String::from_utf8_lossy(kv.key()).into_owned(), decode(kv.value())?)))
            .collect();
        self.history.list(Listed { node: self.node, revision, items });
    }

    /// A short-lived object on a lease (an Event or a Lease object): grant, put, and sometimes
    /// revoke at once.
    async fn leased(&mut self) {
        let mut client = self.client.clone();
        let Ok(lease) = self.bounded(client.lease_grant(30, None)).await else { return };
        self.history.served(self.node);
        let key = format!("{}leased/{}-{}", self.spec.prefix, self.id, self.counter);
        let value = self.next_value(&key);
        let options = PutOptions::new().with_lease(lease.id());
        let put = client.put(key.as_str(), encode(value, self.spec.value_bytes), Some(options));
        if let Ok(resp) = self.bounded(put).await {
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            self.history.acked(self.node, Acked { key, revision, value: Some(value) });
        }
        if self.rng.below(2) == 0 && self.bounded(client.lease_revoke(lease.id())).await.is_ok() {
            self.history.served(self.node);
        }
    }
}

/// How a request failed.
enum Failed {
    /// Refused by a read-only node (an etcd learner), or never sent (the node is down): it
    /// changed nothing.
    Refused,
    /// No answer, or an error after which the request may or may not have taken effect.
    Unknown,
}

/// etcd's refusal of a write by a learner (kine-rs: a read-only copy), which is never applied:
/// FailedPrecondition (gRPC code 9) `etcdserver: rpc not supported for learner`.
fn refused_by_learner(e: &etcd_client::Error) -> bool {
    const FAILED_PRECONDITION: i32 = 9;
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if i32::from(s.code()) == FAILED_PRECONDITION && s.message().contains("rpc not supported for learner"))
}

/// The pause after a failed request.
const ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// The request never reached a server: the connection to a node that is down was refused.
fn never_sent(e: &etcd_client::Error) -> bool {
    e.to_string().contains("Connection refused")
}

/// A short name for an error: its gRPC code, or its kind.
pub fn error_kind(e: &etcd_client::Error) -> String {
    if never_sent(e) {
        return "connection refused".into();
    }
    match e {
        // A write given up because others kept writing the same keys: etcd never does that.
        etcd_client::Error::GRpcStatus(s) if s.message().contains("conflicting") => {
            format!("{:?} (write conflicts)", s.code())
        }
        etcd_client::Error::GRpcStatus(s) => format!("{:?}", s.code()),
        etcd_client::Error::TransportError(_) => "transport".into(),
        etcd_client::Error::WatchError(_) => "watch".into(),
        other => format!("{other}").chars().take(40).collect(),
    }
}

/// Compacts every `every` to `margin` revisions behind the slowest watcher, so that resuming
/// watchers never hit a compacted revision.
pub async fn compactor(
    client: Client,
    history: Arc<History>,
    watchers: Vec<Arc<AtomicI64>>,
    every: Duration,
    margin: i64,
    stop: Arc<AtomicBool>,
) {
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        let floor = watchers.iter().map(|w| w.load(Ordering::Relaxed)).min().unwrap_or(0);
        let target = floor - margin;
        if target <= done {
            continue;
        }
        let mut client = client.clone();
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(3), client.compact(target, None)).await {
            done = target;
            history.compacted();
        }
    }
}
