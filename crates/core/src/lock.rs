//! The Lock service's recipe (etcd's v3lock), run on the server for clients that call it.
//!
//! It writes and reads exactly what etcd's client-side mutex does, so clients of either kind
//! (the Lock service, `etcdctl lock`, a Go program's `concurrency.Mutex`) exclude each other:
//! a waiter is the key `NAME/LEASE` (the lease id in lower-case hex) with an empty value and the
//! caller's lease, created by one Txn that also reads the oldest waiter; the waiter whose key
//! has the smallest create revision holds the lock. A waiter that is not first waits until every
//! older waiter's key is gone (unlocked, or its lease expired), then checks that its own key
//! still exists.

use crate::error::{Error, Result};
use crate::request::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseOp,
    SortOrder, SortTarget, TxnRequest,
};
use crate::store::Store;
use crate::types::{EventKind, KeyRange, LeaseId, Revision};
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;

/// The lease etcd's server-side session takes when a Lock request names none: a new one of
/// this TTL, never kept alive, so such a lock lasts at most this long.
pub const SESSION_TTL: i64 = 60;

/// A lock acquired: the holder's key and the revision to report.
#[derive(Debug)]
pub struct Held {
    pub key: Vec<u8>,
    pub revision: Revision,
}

/// Every key that starts with `prefix`.
pub fn prefix_range(prefix: Vec<u8>) -> KeyRange {
    let mut end = prefix.clone();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return KeyRange::from_etcd(prefix, end);
        }
    }
    KeyRange::from_etcd(prefix, vec![0])
}

/// The waiter with the smallest (or, `Descend`, the largest) create revision under `waiters`.
pub(crate) fn by_create(waiters: &KeyRange, order: SortOrder, max_create_revision: Revision) -> RangeRequest {
    RangeRequest {
        limit: 1,
        sort_order: order,
        sort_target: SortTarget::Create,
        max_create_revision,
        ..RangeRequest::new(waiters.clone())
    }
}

/// Deletes a waiter's key if the request that made it ends before it holds the lock (the
/// client went away, or the server is stopping), as etcd does; with `created`, only if the key
/// still has that create revision (an election candidate resigning).
pub(crate) struct Withdraw {
    pub(crate) store: Arc<Store>,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) created: Option<Revision>,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        // No runtime (the process is ending): nothing to withdraw from.
        if let (Some(key), Ok(runtime)) = (self.key.take(), tokio::runtime::Handle::try_current()) {
            let store = self.store.clone();
            let created = self.created;
            runtime.spawn(async move {
                let _ = match created {
                    Some(rev) => store.txn(delete_if_created_at(key, rev)).await.map(|_| ()),
                    None => store
                        .delete_range(DeleteRangeRequest { range: KeyRange::single(key), prev_kv: false })
                        .await
                        .map(|_| ()),
                };
            });
        }
    }
}

/// A Txn deleting `key` if its create revision is `rev` (etcd's Resign).
pub(crate) fn delete_if_created_at(key: Vec<u8>, rev: Revision) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            range: KeyRange::single(key.clone()),
            result: CompareResult::Equal,
            target: CompareTarget::Create(rev),
        }],
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest { range: KeyRange::single(key), prev_kv: false })],
        failure: vec![],
    }
}

/// The lease of a request: its own, or for 0 a new one of [`SESSION_TTL`] (etcd's session).
pub(crate) async fn session_lease(store: &Store, lease: LeaseId) -> Result<LeaseId> {
    if lease == 0 { Ok(store.lease_grant(0, SESSION_TTL).await?.0) } else { Ok(lease) }
}

/// `NAME/LEASE_HEX`, the key of a waiter or a candidate.
pub(crate) fn waiter_key(prefix: &[u8], lease: LeaseId) -> Vec<u8> {
    [prefix, format!("{lease:x}").as_bytes()].concat()
}

/// Acquires the lock `name` for `lease` (0: a new lease of [`SESSION_TTL`]), waiting as long as
/// it takes. Dropping the future before it completes withdraws the waiter.
pub async fn lock(store: &Arc<Store>, name: &[u8], lease: LeaseId) -> Result<Held> {
    let lease = session_lease(store, lease).await?;
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    let key = waiter_key(&prefix, lease);
    let waiters = prefix_range(prefix);
    let mine = KeyRange::single(key.clone());
    let oldest = || RequestOp::Range(by_create(&waiters, SortOrder::Ascend, 0));
    let txn = TxnRequest {
        compare: vec![Compare { range: mine.clone(), result: CompareResult::Equal, target: CompareTarget::Create(0) }],
        success: vec![RequestOp::Put(PutRequest { key: key.clone(), lease, ..Default::default() }), oldest()],
        failure: vec![RequestOp::Range(RangeRequest::new(mine.clone())), oldest()],
    };
    let answer = store.txn(txn).await?;
    let range_kvs = |op: Option<&ResponseOp>| match op {
        Some(ResponseOp::Range(r)) => r.value.kvs.clone(),
        _ => Vec::new(),
    };
    let my_rev = if answer.value.succeeded {
        answer.revision
    } else {
        range_kvs(answer.value.responses.first()).first().map_or(answer.revision, |kv| kv.create_revision)
    };
    let owner = range_kvs(answer.value.responses.get(1));
    if owner.first().is_none_or(|kv| kv.create_revision == my_rev) {
        return Ok(Held { key, revision: answer.revision });
    }
    let mut withdraw = Withdraw { store: store.clone(), key: Some(key.clone()), created: None };
    wait_deletes(store, &waiters, my_rev - 1).await?;
    let now = store.range(RangeRequest::new(mine)).await?;
    withdraw.key = None;
    if now.value.kvs.is_empty() {
        return Err(Error::SessionExpired);
    }
    Ok(Held { key, revision: now.revision })
}

/// Waits until no key under `waiters` has a create revision at or below `max_create_revision`.
pub(crate) async fn wait_deletes(store: &Store, waiters: &KeyRange, max_create_revision: Revision) -> Result<()> {
    loop {
        // Subscribed before the read: a deletion after the read's revision is on the feed.
        let mut feed = store.backend().subscribe();
        let newest = store.range(by_create(waiters, SortOrder::Descend, max_create_revision)).await?;
        let Some(kv) = newest.value.kvs.first() else {
            return Ok(());
        };
        loop {
            match feed.recv().await {
                Ok(rev) if rev.revision > newest.revision => {
                    if rev.events.iter().any(|e| e.kind == EventKind::Delete && e.kv.key == kv.key) {
                        break;
                    }
                }
                Ok(_) => {}
                // Missed revisions: read again.
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return Err(Error::Unavailable("etcdserver: server stopped".into())),
            }
        }
    }
}

/// Releases a lock: deletes the holder's key (etcd's Unlock is a plain delete of it).
pub async fn unlock(store: &Store, key: Vec<u8>) -> Result<Revision> {
    Ok(store.delete_range(DeleteRangeRequest { range: KeyRange::single(key), prev_kv: false }).await?.revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges_end_after_the_last_key_with_the_prefix() {
        assert_eq!(prefix_range(b"a/".to_vec()).etcd_parts(), (b"a/".to_vec(), b"a0".to_vec()));
        assert_eq!(prefix_range(vec![b'a', 0xff]).etcd_parts(), (vec![b'a', 0xff], b"b".to_vec()));
        assert_eq!(prefix_range(vec![0xff]).etcd_parts(), (vec![0xff], vec![0]));
    }
}
