//! What the workload saw, recorded as it ran: every operation with its invocation and answer
//! times, every list, every watch event, and when each node last answered.

use crate::linearizability::{Call, Operation, Outcome};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One change as a watch reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    pub revision: i64,
    pub key: String,
    /// The value id written, None for a deletion.
    pub value: Option<u64>,
}

/// A list (a Range of the whole prefix) and the revision it was read at.
#[derive(Debug, Clone)]
pub struct Listed {
    pub node: usize,
    pub revision: i64,
    /// key → value id.
    pub items: BTreeMap<String, u64>,
}

/// A write whose answer said it took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub key: String,
    pub revision: i64,
    pub value: Option<u64>,
}

#[derive(Default)]
struct Inner {
    /// Per key, the operations checked for linearizability.
    ops: BTreeMap<String, Vec<Operation>>,
    acked: Vec<Acked>,
    /// Every value id any write tried to write (acknowledged or not).
    attempted: HashMap<u64, String>,
    lists: Vec<Listed>,
    /// Per node, the times (since start) of its successful answers, coarse (10 ms buckets).
    answered: Vec<Vec<u64>>,
    errors: BTreeMap<String, u64>,
    compactions: u64,
}

/// The shared record.
pub struct History {
    start: Instant,
    inner: Mutex<Inner>,
}

impl History {
    pub fn new(nodes: usize) -> History {
        let inner = Inner { answered: vec![Vec::new(); nodes], ..Inner::default() };
        History { start: Instant::now(), inner: Mutex::new(inner) }
    }

    /// Microseconds since the history began.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a value id before the write that carries it is sent.
    pub fn attempt(&self, value: u64, key: &str) {
        self.lock().attempted.insert(value, key.to_string());
    }

    /// Records an operation on `key` answered (or not) by `node`.
    pub fn record(&self, node: usize, key: &str, call: Call, outcome: Outcome, invoked: u64) {
        let answered = if outcome == Outcome::Unknown { u64::MAX } else { self.now() };
        let mut inner = self.lock();
        if let Outcome::Written(revision) = outcome {
            let value = match call {
                Call::Create { value } | Call::Update { value, .. } | Call::Put { value } => Some(value),
                _ => None,
            };
            inner.acked.push(Acked { key: key.to_string(), revision, value });
        }
        if outcome != Outcome::Unknown {
            inner.answered[node].push(answered / 10_000);
        }
        inner.ops.entry(key.to_string()).or_default().push(Operation { call, outcome, invoked, answered });
    }

    /// Records an acknowledged write that is not part of the linearizability check (leased keys).
    pub fn acked(&self, node: usize, acked: Acked) {
        let mut inner = self.lock();
        let at = self.now() / 10_000;
        inner.answered[node].push(at);
        inner.acked.push(acked);
    }

    /// A successful answer from `node` that records nothing else (lease grants, revokes).
    pub fn served(&self, node: usize) {
        let at = self.now() / 10_000;
        self.lock().answered[node].push(at);
    }

    pub fn list(&self, listed: Listed) {
        let at = self.now() / 10_000;
        let mut inner = self.lock();
        inner.answered[listed.node].push(at);
        inner.lists.push(listed);
    }

    /// Counts an error by kind (its gRPC code or "timeout").
    pub fn error(&self, kind: String) {
        *self.lock().errors.entry(kind).or_default() += 1;
    }

    pub fn compacted(&self) {
        self.lock().compactions += 1;
    }

    pub fn operations(&self) -> BTreeMap<String, Vec<Operation>> {
        self.lock().ops.clone()
    }

    pub fn acknowledged(&self) -> Vec<Acked> {
        self.lock().acked.clone()
    }

    pub fn attempted(&self) -> HashMap<u64, String> {
        self.lock().attempted.clone()
    }

    pub fn lists(&self) -> Vec<Listed> {
        self.lock().lists.clone()
    }

    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.lock().errors.clone()
    }

    pub fn compactions(&self) -> u64 {
        self.lock().compactions
    }

    /// Per node, sorted times (10 ms units) of successful answers.
    pub fn answers(&self) -> Vec<Vec<u64>> {
        let mut answered = self.lock().answered.clone();
        for a in &mut answered {
            a.sort_unstable();
        }
        answered
    }
}
