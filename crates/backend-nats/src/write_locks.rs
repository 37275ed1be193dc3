//! Which writes from one process may be in flight at the same time.
//!
//! Correctness never depends on these locks: every write is published with a JetStream
//! expectation. They only keep this process's own writes from invalidating each other's
//! expectations: writes on different keys run concurrently, writes on the same key one after
//! the other, and a write conditional on the whole stream runs alone.

use kine_core::RangeEnd;
use kine_core::request::{RequestOp, TxnRequest};
use kine_core::txn::WriteOp;
use std::collections::BTreeSet;
use tokio::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

const STRIPES: usize = 256;

pub struct WriteLocks {
    all: RwLock<()>,
    stripes: Vec<Mutex<()>>,
}

/// Held while a write is evaluated and published.
pub enum WriteGuard<'a> {
    Keys(#[allow(dead_code)] RwLockReadGuard<'a, ()>, #[allow(dead_code)] Vec<MutexGuard<'a, ()>>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

impl Default for WriteLocks {
    fn default() -> Self {
        WriteLocks { all: RwLock::new(()), stripes: (0..STRIPES).map(|_| Mutex::new(())).collect() }
    }
}

fn stripe(key: &[u8]) -> usize {
    (crate::codec::fnv1a(key) % STRIPES as u64) as usize
}

impl WriteLocks {
    /// For a write that touches only `keys`: shared with writes on other keys.
    pub async fn keys(&self, keys: &BTreeSet<Vec<u8>>) -> WriteGuard<'_> {
        let shared = self.all.read().await;
        // Ascending stripe order: two writes never wait for each other crosswise.
        let stripes: BTreeSet<usize> = keys.iter().map(|k| stripe(k)).collect();
        let mut guards = Vec::with_capacity(stripes.len());
        for i in stripes {
            guards.push(self.stripes[i].lock().await);
        }
        WriteGuard::Keys(shared, guards)
    }

    /// For a write conditional on the whole stream: nothing else from this
    /// process in flight.
    pub async fn alone(&self) -> WriteGuard<'_> {
        WriteGuard::Alone(self.all.write().await)
    }
}

/// The single keys a write reads or writes, or `None` if it touches a range (then it runs
/// alone). Whether the write is then published conditional on those keys alone is decided once
/// it is evaluated (`write.rs`): a write that ran a Range is conditional on the whole stream,
/// and evaluated again with nothing else of this process in flight.
pub fn request_keys(op: &WriteOp) -> Option<BTreeSet<Vec<u8>>> {
    fn txn(req: &TxnRequest, keys: &mut BTreeSet<Vec<u8>>) -> bool {
        for c in &req.compare {
            if c.range.end != RangeEnd::Single {
                return false;
            }
            keys.insert(c.range.start.clone());
        }
        for op in req.success.iter().chain(&req.failure) {
            match op {
                // A read of one key (kube-apiserver's update: `If mod_revision(k) == r Then
                // Put(k) Else Get(k)`) needs only that key's lock; a read of a range runs alone.
                RequestOp::Range(r) => {
                    if r.range.end != RangeEnd::Single {
                        return false;
                    }
                    keys.insert(r.range.start.clone());
                }
                RequestOp::Put(p) => {
                    keys.insert(p.key.clone());
                }
                RequestOp::DeleteRange(d) => {
                    if d.range.end != RangeEnd::Single {
                        return false;
                    }
                    keys.insert(d.range.start.clone());
                }
                RequestOp::Txn(inner) => {
                    if !txn(inner, keys) {
                        return false;
                    }
                }
            }
        }
        true
    }
    let WriteOp::Txn(req) = op else { return None };
    let mut keys = BTreeSet::new();
    txn(req, &mut keys).then_some(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kine_core::KeyRange;
    use kine_core::request::{DeleteRangeRequest, PutRequest, RangeRequest};

    fn put(k: &str) -> RequestOp {
        RequestOp::Put(PutRequest { key: k.into(), ..Default::default() })
    }

    #[test]
    fn keys_of_a_request() {
        let t = |success: Vec<RequestOp>| {
            request_keys(&WriteOp::Txn(TxnRequest { compare: vec![], success, failure: vec![] }))
        };
        let keys = t(vec![put("a"), put("b")]).unwrap();
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), vec![b"a".to_vec(), b"b".to_vec()]);
        let range = KeyRange::from_etcd(b"a".to_vec(), b"b".to_vec());
        assert!(t(vec![RequestOp::DeleteRange(DeleteRangeRequest { range: range.clone(), prev_kv: false })]).is_none());
        assert!(t(vec![RequestOp::Range(RangeRequest::new(range))]).is_none());
        // kube-apiserver's update: one key, whichever branch runs.
        let create = request_keys(&WriteOp::Txn(TxnRequest {
            compare: vec![],
            success: vec![put("a")],
            failure: vec![RequestOp::Range(RangeRequest::new(KeyRange::single("a")))],
        }));
        assert_eq!(create.unwrap().into_iter().collect::<Vec<_>>(), vec![b"a".to_vec()]);
        assert!(request_keys(&WriteOp::LeaseRevoke { id: 1, expired: false }).is_none());
    }

    #[tokio::test]
    async fn same_key_waits_other_keys_do_not() {
        let locks = WriteLocks::default();
        let a: BTreeSet<Vec<u8>> = [b"a".to_vec()].into();
        let other: BTreeSet<Vec<u8>> =
            (0..1000).map(|i| format!("k{i}").into_bytes()).find(|k| stripe(k) != stripe(b"a")).into_iter().collect();
        let held = locks.keys(&a).await;
        let quick = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(quick, locks.keys(&other)).await.is_ok());
        assert!(tokio::time::timeout(quick, locks.keys(&a)).await.is_err());
        assert!(tokio::time::timeout(quick, locks.alone()).await.is_err());
        drop(held);
        assert!(tokio::time::timeout(quick, locks.alone()).await.is_ok());
    }
}
