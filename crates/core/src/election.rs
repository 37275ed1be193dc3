//! The Election service's recipe (etcd's v3election), run on the server for clients that call
//! it. Like the Lock service it writes what etcd's client-side election does, so it
//! interoperates with `etcdctl elect` and Go's `concurrency.Election`: a candidate is the key
//! `NAME/LEASE` holding its value, with its lease; the candidate with the smallest create
//! revision leads; a leader is named by its key and that create revision.

use crate::error::{Error, Result};
use crate::lock::{Withdraw, by_create, delete_if_created_at, prefix_range, session_lease, wait_deletes, waiter_key};
use crate::request::{
    Compare, CompareResult, CompareTarget, PutRequest, RangeRequest, RequestOp, ResponseOp, SortOrder, TxnRequest,
};
use crate::store::Store;
use crate::types::{EventKind, KeyRange, KeyValue, LeaseId, Revision};
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

/// A leader, as the service names it to clients (etcd's `LeaderKey`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderKey {
    pub name: Vec<u8>,
    pub key: Vec<u8>,
    /// The key's create revision.
    pub rev: Revision,
    pub lease: LeaseId,
}

fn candidates(name: &[u8]) -> (Vec<u8>, KeyRange) {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    (prefix.clone(), prefix_range(prefix))
}

fn put_if_created_at(key: &[u8], rev: Revision, value: Vec<u8>, lease: LeaseId) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            range: KeyRange::single(key.to_vec()),
            result: CompareResult::Equal,
            target: CompareTarget::Create(rev),
        }],
        success: vec![RequestOp::Put(PutRequest { key: key.to_vec(), value, lease, ..Default::default() })],
        failure: vec![],
    }
}

/// Campaigns for leadership of `name` with `value`, waiting until elected. Returns the leader
/// key and the revision of the campaign's write. Dropping the future before it completes
/// resigns the candidate.
pub async fn campaign(
    store: &Arc<Store>,
    name: &[u8],
    lease: LeaseId,
    value: Vec<u8>,
) -> Result<(LeaderKey, Revision)> {
    let lease = session_lease(store, lease).await?;
    let (prefix, candidates) = candidates(name);
    let key = waiter_key(&prefix, lease);
    let txn = TxnRequest {
        compare: vec![Compare {
            range: KeyRange::single(key.clone()),
            result: CompareResult::Equal,
            target: CompareTarget::Create(0),
        }],
        success: vec![RequestOp::Put(PutRequest {
            key: key.clone(),
            value: value.clone(),
            lease,
            ..Default::default()
        })],
        failure: vec![RequestOp::Range(RangeRequest::new(KeyRange::single(key.clone())))],
    };
    let answer = store.txn(txn).await?;
    let mut rev = answer.revision;
    if !answer.value.succeeded {
        // Campaigning again with the same lease: the candidate exists; its value is updated.
        if let Some(ResponseOp::Range(r)) = answer.value.responses.first()
            && let Some(kv) = r.value.kvs.first()
        {
            rev = kv.create_revision;
            if kv.value != value && !store.txn(put_if_created_at(&key, rev, value, lease)).await?.value.succeeded {
                let _ = store.txn(delete_if_created_at(key, rev)).await;
                return Err(Error::NotLeader);
            }
        }
    }
    let mut resign = Withdraw { store: store.clone(), key: Some(key.clone()), created: Some(rev) };
    wait_deletes(store, &candidates, rev - 1).await?;
    resign.key = None;
    Ok((LeaderKey { name: name.to_vec(), key, rev, lease }, answer.revision))
}

/// A new value for the leader `leader`: refused with "election: not leader" unless its key
/// still has its create revision. A lease of 0 takes a new one (etcd's session).
pub async fn proclaim(store: &Store, leader: &LeaderKey, value: Vec<u8>) -> Result<Revision> {
    let lease = session_lease(store, leader.lease).await?;
    let answer = store.txn(put_if_created_at(&leader.key, leader.rev, value, lease)).await?;
    if !answer.value.succeeded {
        return Err(Error::NotLeader);
    }
    Ok(answer.revision)
}

/// Gives up leadership (or candidacy): deletes the key if it still has its create revision.
pub async fn resign(store: &Store, leader: &LeaderKey) -> Result<Revision> {
    Ok(store.txn(delete_if_created_at(leader.key.clone(), leader.rev)).await?.revision)
}

/// The current leader's key-value, or "election: no leader".
pub async fn leader(store: &Store, name: &[u8]) -> Result<(KeyValue, Revision)> {
    let (_, candidates) = candidates(name);
    let first = store.range(by_create(&candidates, SortOrder::Ascend, 0)).await?;
    let kv = first.value.kvs.into_iter().next().ok_or(Error::NoLeader)?;
    Ok((kv, first.revision))
}

/// Sends the leader of `name` and every change of it to `out` (a new leader, or a new value
/// proclaimed) until `out` closes; an error is sent before it ends. As etcd's: not every
/// historical change is guaranteed, the latest always is.
pub async fn observe(store: &Store, name: &[u8], out: mpsc::Sender<Result<(KeyValue, Revision)>>) {
    if let Err(e) = follow(store, name, &out).await {
        let _ = out.send(Err(e)).await;
    }
}

async fn follow(store: &Store, name: &[u8], out: &mpsc::Sender<Result<(KeyValue, Revision)>>) -> Result<()> {
    let (_, candidates) = candidates(name);
    let closed = || Error::Unavailable("etcdserver: server stopped".into());
    'elections: loop {
        // Subscribed before the read: every change after the read's revision is on the feed.
        let mut feed = store.backend().subscribe();
        let first = store.range(by_create(&candidates, SortOrder::Ascend, 0)).await?;
        let mut after = first.revision;
        let mut current = first.value.kvs.into_iter().next();
        loop {
            if let Some(kv) = current.take() {
                let key = kv.key.clone();
                if out.send(Ok((kv, after))).await.is_err() {
                    return Ok(());
                }
                // Follow the leader's key: new values, until it is deleted.
                loop {
                    let revision = match feed.recv().await {
                        Ok(r) => r,
                        Err(RecvError::Lagged(_)) => continue 'elections,
                        Err(RecvError::Closed) => return Err(closed()),
                    };
                    if revision.revision <= after {
                        continue;
                    }
                    after = revision.revision;
                    for e in revision.events.iter().filter(|e| e.kv.key == key) {
                        if e.kind == EventKind::Delete {
                            continue 'elections;
                        }
                        if out.send(Ok((e.kv.clone(), revision.revision))).await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
            // No leader yet: the first candidate written under the name.
            let revision = match feed.recv().await {
                Ok(r) => r,
                Err(RecvError::Lagged(_)) => continue 'elections,
                Err(RecvError::Closed) => return Err(closed()),
            };
            if revision.revision > after {
                after = revision.revision;
                current = revision
                    .events
                    .iter()
                    .find(|e| e.kind == EventKind::Put && candidates.contains(&e.kv.key))
                    .map(|e| e.kv.clone());
            }
        }
    }
}
