//! Model-based random testing: the same random operation sequence runs against a backend
//! under test and the memory backend (the oracle); every response must be identical.
//! A failure names the seed and step; `KINE_MODEL_SEED=<seed>` replays it.

use crate::Rng;
use crate::contract::store;
use kine_core::backend::Backend;
use kine_core::request::*;
use kine_core::store::Store;
use kine_core::{KeyRange, Revision};
use std::sync::Arc;

const KEYS: u64 = 8;

fn key(rng: &mut Rng) -> Vec<u8> {
    format!("k/{}", rng.below(KEYS)).into_bytes()
}

fn range(rng: &mut Rng) -> KeyRange {
    match rng.below(4) {
        0 => KeyRange::single(key(rng)),
        1 => KeyRange::from_etcd(b"k/".to_vec(), b"k0".to_vec()),
        2 => KeyRange::from_etcd(key(rng), vec![0]),
        _ => {
            let (a, b) = (key(rng), key(rng));
            KeyRange::from_etcd(a.min(b.clone()), b)
        }
    }
}

fn put(rng: &mut Rng, leases: &[i64]) -> PutRequest {
    let lease = if !leases.is_empty() && rng.chance(30) { leases[rng.below(leases.len() as u64) as usize] } else { 0 };
    let ignore_value = rng.chance(5);
    PutRequest {
        key: key(rng),
        value: if ignore_value { Vec::new() } else { format!("v{}", rng.below(1000)).into_bytes() },
        lease,
        prev_kv: rng.chance(50),
        ignore_value,
        ignore_lease: lease == 0 && rng.chance(5),
    }
}

fn range_req(rng: &mut Rng, current: Revision) -> RangeRequest {
    RangeRequest {
        limit: rng.below(4) as i64,
        revision: if rng.chance(30) { rng.below(current as u64 + 2) as i64 } else { 0 },
        sort_order: [SortOrder::None, SortOrder::Ascend, SortOrder::Descend][rng.below(3) as usize],
        sort_target: [SortTarget::Key, SortTarget::Version, SortTarget::Mod, SortTarget::Value][rng.below(4) as usize],
        keys_only: rng.chance(20),
        count_only: rng.chance(10),
        min_mod_revision: if rng.chance(10) { rng.below(current as u64 + 1) as i64 } else { 0 },
        ..RangeRequest::new(range(rng))
    }
}

fn op(rng: &mut Rng, leases: &[i64], current: Revision, depth: u32) -> RequestOp {
    match rng.below(if depth > 0 { 3 } else { 4 }) {
        0 => RequestOp::Put(put(rng, leases)),
        1 => RequestOp::DeleteRange(DeleteRangeRequest { range: range(rng), prev_kv: rng.chance(50) }),
        2 => RequestOp::Range(range_req(rng, current)),
        _ => RequestOp::Txn(txn(rng, leases, current, depth + 1)),
    }
}

fn txn(rng: &mut Rng, leases: &[i64], current: Revision, depth: u32) -> TxnRequest {
    let compare = (0..rng.below(3))
        .map(|_| Compare {
            range: if rng.chance(80) { KeyRange::single(key(rng)) } else { range(rng) },
            result: [CompareResult::Equal, CompareResult::NotEqual, CompareResult::Greater, CompareResult::Less]
                [rng.below(4) as usize],
            target: match rng.below(5) {
                0 => CompareTarget::Version(rng.below(4) as i64),
                1 => CompareTarget::Create(rng.below(current as u64 + 1) as i64),
                2 => CompareTarget::Mod(rng.below(current as u64 + 1) as i64),
                3 => CompareTarget::Value(format!("v{}", rng.below(1000)).into_bytes()),
                _ => CompareTarget::Lease(0),
            },
        })
        .collect();
    let ops = |rng: &mut Rng| (0..rng.below(3)).map(|_| op(rng, leases, current, depth)).collect();
    TxnRequest { compare, success: ops(rng), failure: ops(rng) }
}

/// A txn whose branches each change at most one key (the Kubernetes shapes and variations).
fn single_key_txn(rng: &mut Rng, current: Revision) -> TxnRequest {
    let mut t = txn(rng, &[], current, 1);
    for branch in [&mut t.success, &mut t.failure] {
        let mut writes = 0;
        branch.retain(|op| match op {
            RequestOp::Put(_) => {
                writes += 1;
                writes == 1
            }
            RequestOp::DeleteRange(d) => {
                writes += 1;
                writes == 1 && d.range.end == kine_core::RangeEnd::Single
            }
            RequestOp::Range(_) => true,
            RequestOp::Txn(_) => false,
        });
    }
    t
}

/// One step's outcome, rendered for comparison (errors by their kind and text).
async fn step(s: &Store, b: &Arc<dyn Backend>, action: &Action) -> String {
    fn show<T: std::fmt::Debug>(r: kine_core::Result<T>) -> String {
        match r {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("error: {e}"),
        }
    }
    match action {
        Action::Range(r) => show(s.range(r.clone()).await),
        Action::Put(p) => show(s.put(p.clone()).await),
        Action::Delete(d) => show(s.delete_range(d.clone()).await),
        Action::Txn(t) => show(s.txn(t.clone()).await),
        Action::Compact(rev) => show(s.compact(*rev).await),
        Action::Grant(id) => show(s.lease_grant(*id, 60).await.map(|(id, ttl, _)| (id, ttl))),
        Action::Revoke(id) => show(s.lease_revoke(*id).await),
        Action::Events(r, after, until) => show(b.events(r, *after, *until).await),
    }
}

#[derive(Debug)]
enum Action {
    Range(RangeRequest),
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(Revision),
    Grant(i64),
    Revoke(i64),
    Events(KeyRange, Revision, Revision),
}

/// Runs `steps` random operations on both backends and panics at the first difference.
pub async fn run(seed: u64, steps: usize, subject: Arc<dyn Backend>, oracle: Arc<dyn Backend>) {
    run_with(seed, steps, subject, oracle, false).await
}

/// Like [`run`]; with `single_key_writes` every generated write changes at most one key (for
/// a backend where a request changing several keys spends one revision per key).
pub async fn run_with(
    seed: u64,
    steps: usize,
    subject: Arc<dyn Backend>,
    oracle: Arc<dyn Backend>,
    single_key_writes: bool,
) {
    let (s, o) = (store(subject.clone()).await, store(oracle.clone()).await);
    let mut rng = Rng::new(seed);
    let mut leases: Vec<i64> = Vec::new();
    for i in 0..steps {
        let current = oracle.revisions().await.expect("oracle revisions").current;
        // With single-key writes no key carries a lease (a revoke would delete several keys).
        let put_leases: &[i64] = if single_key_writes { &[] } else { &leases };
        let action = match rng.below(100) {
            0..=29 => Action::Put(put(&mut rng, put_leases)),
            30..=39 if single_key_writes => {
                Action::Delete(DeleteRangeRequest { range: KeyRange::single(key(&mut rng)), prev_kv: rng.chance(50) })
            }
            30..=39 => Action::Delete(DeleteRangeRequest { range: range(&mut rng), prev_kv: rng.chance(50) }),
            40..=64 if single_key_writes => Action::Txn(single_key_txn(&mut rng, current)),
            40..=64 => Action::Txn(txn(&mut rng, &leases, current, 0)),
            65..=84 => Action::Range(range_req(&mut rng, current)),
            85..=87 => Action::Compact(rng.below(current as u64 + 2) as i64),
            88..=91 => {
                let id = 1 + rng.below(6) as i64;
                leases.push(id);
                Action::Grant(id)
            }
            92..=94 => Action::Revoke(1 + rng.below(6) as i64),
            _ => {
                let after = rng.below(current as u64 + 1) as i64;
                Action::Events(range(&mut rng), after, current)
            }
        };
        let (got, want) = (step(&s, &subject, &action).await, step(&o, &oracle, &action).await);
        assert_eq!(
            got, want,
            "model mismatch: seed {seed} step {i} (replay with KINE_MODEL_SEED={seed})\naction: {action:?}"
        );
        let (rs, ro) = (subject.revisions().await.expect("revisions"), oracle.revisions().await.expect("revisions"));
        assert_eq!(rs, ro, "revisions differ: seed {seed} step {i}\naction: {action:?}");
    }
}

/// The seeds to run: `KINE_MODEL_SEED` alone if set, otherwise `count` seeds from the clock.
pub fn seeds(count: usize) -> Vec<u64> {
    if let Ok(s) = std::env::var("KINE_MODEL_SEED") {
        return vec![s.parse().expect("KINE_MODEL_SEED must be a number")];
    }
    (0..count).map(|_| kine_core::id::random_u64()).collect()
}
