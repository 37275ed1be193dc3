//! Static request checks, made before a request reaches a backend (etcd's `check*Request`).

use crate::error::{Error, Result};
use crate::request::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};
use crate::types::KeyRange;
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
    if t.compare.len() > MAX_TXN_OPS || t.success.len() > MAX_TXN_OPS || t.failure.len() > MAX_TXN_OPS {
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
            RequestOp::Txn(inner) => txn(inner)?,
        }
    }
    check_intervals(&t.success)?;
    check_intervals(&t.failure)?;
    Ok(())
}

/// etcd rejects a txn branch that writes one key twice: two puts of a key, or a put of a key
/// that a delete in the same branch (or a nested one) covers. Deletes may overlap each other.
/// Returns the branch's puts and delete ranges.
fn check_intervals(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<KeyRange>)> {
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| if let RequestOp::DeleteRange(d) = op { Some(d.range.clone()) } else { None })
        .collect();
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    let covered = |dels: &[KeyRange], key: &[u8]| dels.iter().any(|d| d.contains(key));
    for op in ops {
        let RequestOp::Txn(inner) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&inner.success)?;
        let (puts_else, dels_else) = check_intervals(&inner.failure)?;
        for key in puts_then.into_iter().chain(puts_else) {
            if puts.contains(&key) || covered(&dels, &key) {
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
    }

    #[test]
    fn empty_keys_and_too_many_ops() {
        let t = TxnRequest { success: vec![put("")], ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::EmptyKey)));
        let t = TxnRequest { success: (0..129).map(|i| put(&i.to_string())).collect(), ..Default::default() };
        assert!(matches!(txn(&t), Err(Error::TooManyOps)));
    }
}
