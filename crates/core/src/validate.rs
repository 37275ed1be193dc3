//! Static request checks, made before a request reaches a backend (etcd's `check*Request`).

use crate::error::{Error, Result};
use crate::request::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};
use std::collections::HashSet;

/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;

pub fn range(r: &RangeRequest) -> Result<()> {
    if r.range.start.is_empty() {
        return Err(Error::EmptyKey);
    }
    Ok(())
}

pub fn put(r: &PutRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

pub fn delete_range(r: &DeleteRangeRequest) -> Result<()> {
    if r.range.start.is_empty() {
        return Err(Error::EmptyKey);
    }
    Ok(())
}

pub fn txn(t: &TxnRequest) -> Result<()> {
    txn_ops(t, MAX_TXN_OPS)?;
    // After the per-operation checks, as etcd (avoids quadratic work on bad requests).
    check_intervals(&t.success)?;
    check_intervals(&t.failure)?;
    Ok(())
}

/// etcd's `checkTxnRequest`: a txn may hold `max_ops` operations in its largest list, and a
/// nested txn only what its parent leaves.
fn txn_ops(t: &TxnRequest, max_ops: usize) -> Result<()> {
    let ops = t.compare.len().max(t.success.len()).max(t.failure.len());
    if ops > max_ops {
        return Err(Error::TooManyOps);
    }
    for c in &t.compare {
        if c.range.start.is_empty() {
            return Err(Error::EmptyKey);
        }
    }
    for op in t.success.iter().chain(&t.failure) {
        match op {
            RequestOp::Range(r) => range(r)?,
            RequestOp::Put(p) => put(p)?,
            RequestOp::DeleteRange(d) => delete_range(d)?,
            RequestOp::Txn(inner) => txn_ops(inner, max_ops - ops)?,
        }
    }
    Ok(())
}

/// A key range as etcd's duplicate-key check sees a delete: `[key, key + "\0")` for one key,
/// else `[key, range_end)` with `range_end` taken literally — so a delete of everything from
/// a key (`range_end` "\0") covers nothing here, as in etcd.
struct Interval {
    start: Vec<u8>,
    end: Vec<u8>,
}

impl Interval {
    fn of(d: &DeleteRangeRequest) -> Interval {
        let (start, end) = d.range.etcd_parts();
        let end = if end.is_empty() { [start.as_slice(), &[0]].concat() } else { end };
        Interval { start, end }
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.start.as_slice() <= key && key < self.end.as_slice()
    }
}

/// etcd's `checkIntervals`: a txn branch must not write one key twice — two puts of a key, or a
/// put of a key that a delete covers (of the same level, of an enclosing one, or of an earlier
/// nested txn). A key put in both branches of one nested txn is fine (only one runs).
/// Returns the branch's puts and deletes.
fn check_intervals(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<Interval>)> {
    let mut dels: Vec<Interval> = ops
        .iter()
        .filter_map(|op| if let RequestOp::DeleteRange(d) = op { Some(Interval::of(d)) } else { None })
        .collect();
    let covered = |dels: &[Interval], key: &[u8]| dels.iter().any(|d| d.contains(key));
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in ops {
        let RequestOp::Txn(inner) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&inner.success)?;
        let (puts_else, dels_else) = check_intervals(&inner.failure)?;
        for key in &puts_then {
            if puts.contains(key) || covered(&dels, key) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        for key in puts_else {
            if (puts.contains(&key) && !puts_then.contains(&key)) || covered(&dels, &key) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(key);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || covered(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{DeleteRangeRequest, PutRequest};
    use crate::types::KeyRange;

    fn put(key: &str) -> RequestOp {
        RequestOp::Put(PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() })
    }
    fn del(key: &str, end: &str) -> RequestOp {
        RequestOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::from_etcd(key.into(), end.into()),
            prev_kv: false,
        })
    }

    #[test]
    fn duplicate_puts_and_covered_puts_are_rejected() {
        let t = TxnRequest { success: vec![put("a"), put("a")], ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::DuplicateKey)));
        let t = TxnRequest { success: vec![del("a", "c"), put("b")], ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::DuplicateKey)));
        let nested = TxnRequest { success: vec![put("b")], ..Default::default() };
        let t = TxnRequest { success: vec![del("a", "c"), RequestOp::Txn(nested)], ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::DuplicateKey)));
        // Overlapping deletes and the same key in success and failure are fine.
        let t = TxnRequest {
            success: vec![del("a", "c"), del("b", "d"), put("x")],
            failure: vec![put("x")],
            ..Default::default()
        };
        assert!(txn(&t).is_ok());
        // One nested txn putting a key in both branches: only one runs (etcd allows it).
        let both = TxnRequest { success: vec![put("a")], failure: vec![put("a")], ..Default::default() };
        assert!(txn(&TxnRequest { success: vec![RequestOp::Txn(both)], ..Default::default() }).is_ok());
        // A delete of everything from a key ("\0") does not count as covering it, as in etcd.
        let t = TxnRequest { success: vec![del("a", "\0"), put("b")], ..Default::default() };
        assert!(txn(&t).is_ok());
    }

    #[test]
    fn empty_keys_and_too_many_ops() {
        let t = TxnRequest { success: vec![put("")], ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::EmptyKey)));
        let t = TxnRequest { success: (0..129).map(|i| put(&i.to_string())).collect(), ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::TooManyOps)));
    }
}
