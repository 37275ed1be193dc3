//! etcd 3.7's `KV.RangeStream`: one Range answered in parts, so that a range of any size costs
//! memory for one part at a time.
//!
//! As etcd serves it: the request is checked as a Range is, plus two refusals of its own (a
//! sort other than by key ascending, and revision filters). The first part is read as the Range
//! would be (linearizable unless `serializable`); its header revision, the store's current one
//! then, is the stream's, and a request without a revision reads every part at it, so the parts
//! fit together whatever is written meanwhile. Parts start at 10 keys and double while a part is
//! under half the byte target (etcd's `--max-request-bytes`; here the server's), halving above
//! twice it. Only the last part carries the header, `more` and `count`; concatenating the parts'
//! keys gives the unary Range's. `count_only` is one part. A compaction past the stream's
//! revision fails the next part with "compacted", after what was sent.
//!
//! Each part is a Range of its own through the backend (no transaction, lock or snapshot held
//! between parts), so a client that reads slowly or stops holds nothing but one part.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::request::{RangeRequest, SortOrder, SortTarget};
use crate::types::{KeyRange, KeyValue, RangeEnd, Revision};
use std::sync::Arc;

/// etcd's first part size, in keys.
pub const FIRST_PART_KEYS: usize = 10;
/// Bytes a key-value costs in a part beyond its key and value (fields, lengths, tags).
const KV_OVERHEAD: usize = 32;

/// One part of the answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Part {
    pub kvs: Vec<KeyValue>,
    /// On the last part only: the stream's header revision, `more` and `count`.
    pub last: Option<LastPart>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastPart {
    pub revision: Revision,
    pub more: bool,
    pub count: i64,
}

/// etcd's refusals of a RangeStream beyond those of a Range.
pub fn validate(r: &RangeRequest) -> Result<()> {
    crate::validate::range(r)?;
    let default_order =
        r.sort_order == SortOrder::None || (r.sort_order == SortOrder::Ascend && r.sort_target == SortTarget::Key);
    if !default_order {
        return Err(Error::Unsupported("RangeStream does not support custom sort orders".into()));
    }
    if r.min_mod_revision != 0 || r.max_mod_revision != 0 || r.min_create_revision != 0 || r.max_create_revision != 0 {
        return Err(Error::Unsupported("RangeStream does not support revision filters".into()));
    }
    Ok(())
}

/// The parts of one RangeStream, read one at a time by [`Parts::next`].
pub struct Parts {
    backend: Arc<dyn Backend>,
    req: RangeRequest,
    /// Where the next part starts.
    next: Vec<u8>,
    /// The stream's header revision (from the first part) and the revision it reads at.
    header: Option<(Revision, Revision)>,
    /// Keys sent so far, and at most how many to send in all (`limit`).
    sent: i64,
    total: i64,
    part_keys: usize,
    target_bytes: usize,
    done: bool,
}

impl Parts {
    /// `target_bytes`: the part size aimed at (the server's request size limit).
    pub fn new(backend: Arc<dyn Backend>, req: RangeRequest, target_bytes: usize) -> Parts {
        Parts {
            backend,
            next: req.range.start.clone(),
            total: if req.limit > 0 { req.limit } else { i64::MAX },
            req,
            header: None,
            sent: 0,
            part_keys: FIRST_PART_KEYS,
            target_bytes: target_bytes.max(1),
            done: false,
        }
    }

    /// The next part; `None` once the last one was returned.
    pub async fn next(&mut self) -> Result<Option<Part>> {
        if self.done {
            return Ok(None);
        }
        if self.req.count_only || self.req.range.is_empty() {
            self.done = true;
            let r = self.backend.range(self.req.clone()).await?;
            let last = LastPart { revision: r.revision, more: false, count: r.value.count };
            return Ok(Some(Part { kvs: Vec::new(), last: Some(last) }));
        }
        let keys = (self.part_keys as i64).min(self.total - self.sent);
        let mut part = RangeRequest {
            range: KeyRange { start: self.next.clone(), end: self.req.range.end.clone() },
            limit: keys,
            total_count: false,
            ..self.req.clone()
        };
        if let Some((_, at)) = self.header {
            // Later parts read at the stream's revision, without another linearizable wait.
            part.revision = at;
            part.serializable = true;
        }
        let r = self.backend.range(part).await?;
        let (header, at) = *self.header.get_or_insert_with(|| {
            let at = if self.req.revision > 0 { self.req.revision } else { r.revision };
            (r.revision, at)
        });
        let kvs = r.value.kvs;
        self.sent += kvs.len() as i64;
        // After the part's last key, as etcd: a part sorted by another target than the key
        // (`sort_order` NONE with a non-key target, which etcd accepts) continues after its last
        // key in that order, skipping keys before it, as etcd 3.7 does.
        if let Some(k) = kvs.last().map(|kv| &kv.key) {
            self.next = k.clone();
            self.next.push(0);
        }
        let more = r.value.more;
        if more && self.sent < self.total && self.req.range.end != RangeEnd::Single {
            let bytes: usize = kvs.iter().map(|kv| kv.key.len() + kv.value.len() + KV_OVERHEAD).sum();
            self.part_keys = adjust(self.part_keys, bytes, self.target_bytes);
            return Ok(Some(Part { kvs, last: None }));
        }
        self.done = true;
        // etcd's count: every key in the range, also past a `limit`.
        let mut count = self.sent;
        if more {
            let rest = RangeRequest {
                range: KeyRange { start: self.next.clone(), end: self.req.range.end.clone() },
                revision: at,
                serializable: true,
                count_only: true,
                ..RangeRequest::new(KeyRange::single(Vec::new()))
            };
            count += self.backend.range(rest).await?.value.count;
        }
        Ok(Some(Part { kvs, last: Some(LastPart { revision: header, more, count }) }))
    }
}

/// etcd's part size rule: twice as many keys while a part is under half the target in bytes,
/// half as many above twice the target, at least one.
fn adjust(keys: usize, bytes: usize, target: usize) -> usize {
    if bytes < target / 2 {
        keys.saturating_mul(2)
    } else if bytes > target.saturating_mul(2) {
        (keys / 2).max(1)
    } else {
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::request::{PutRequest, RequestOp, TxnRequest};
    use crate::txn::WriteOp;

    async fn filled(n: usize, value_bytes: usize) -> Arc<dyn Backend> {
        let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        for i in 0..n {
            let put =
                PutRequest { key: format!("k/{i:06}").into(), value: vec![b'v'; value_bytes], ..Default::default() };
            let txn = TxnRequest { success: vec![RequestOp::Put(put)], ..Default::default() };
            b.write(WriteOp::Txn(txn)).await.unwrap();
        }
        b
    }

    async fn all(b: &Arc<dyn Backend>, req: RangeRequest, target: usize) -> Vec<Part> {
        let mut parts = Parts::new(b.clone(), req, target);
        let mut out = Vec::new();
        while let Some(p) = parts.next().await.unwrap() {
            out.push(p);
        }
        out
    }

    fn prefix() -> KeyRange {
        KeyRange { start: b"k/".to_vec(), end: RangeEnd::Before(b"k0".to_vec()) }
    }

    #[tokio::test]
    async fn parts_concatenate_to_the_range() {
        let b = filled(1000, 100).await;
        for limit in [0, 1, 10, 11, 999, 1000, 1001] {
            let req = RangeRequest { limit, ..RangeRequest::new(prefix()) };
            let unary = b.range(req.clone()).await.unwrap();
            let parts = all(&b, req, 4096).await;
            assert!(parts.len() > 1 || limit <= 10, "limit {limit}: {} parts", parts.len());
            let kvs: Vec<KeyValue> = parts.iter().flat_map(|p| p.kvs.clone()).collect();
            assert_eq!(kvs, unary.value.kvs, "limit {limit}");
            let last = parts.last().unwrap().last.unwrap();
            assert_eq!((last.revision, last.more, last.count), (unary.revision, unary.value.more, unary.value.count));
            // Only the last part carries them; no part but the last is empty.
            assert!(parts[..parts.len() - 1].iter().all(|p| p.last.is_none() && !p.kvs.is_empty()), "limit {limit}");
        }
    }

    #[tokio::test]
    async fn parts_grow_and_shrink_with_their_size() {
        let b = filled(2000, 10).await;
        let sizes: Vec<usize> =
            all(&b, RangeRequest::new(prefix()), 100_000).await.iter().map(|p| p.kvs.len()).collect();
        assert_eq!(&sizes[..4], &[10, 20, 40, 80], "{sizes:?}");
        // With values larger than the target, parts shrink to one key.
        let b = filled(40, 5000).await;
        let sizes: Vec<usize> = all(&b, RangeRequest::new(prefix()), 4000).await.iter().map(|p| p.kvs.len()).collect();
        assert_eq!(&sizes[..5], &[10, 5, 2, 1, 1], "{sizes:?}");
        assert_eq!(adjust(1, 1_000_000, 10), 1);
    }

    #[tokio::test]
    async fn empty_ranges_and_counts_are_one_part() {
        let b = filled(30, 10).await;
        let none = KeyRange { start: b"x".to_vec(), end: RangeEnd::Before(b"y".to_vec()) };
        let parts = all(&b, RangeRequest::new(none), 4096).await;
        assert_eq!(parts, vec![Part { kvs: vec![], last: Some(LastPart { revision: 31, more: false, count: 0 }) }]);
        let parts = all(&b, RangeRequest { count_only: true, limit: 5, ..RangeRequest::new(prefix()) }, 4096).await;
        assert_eq!(parts, vec![Part { kvs: vec![], last: Some(LastPart { revision: 31, more: false, count: 30 }) }]);
    }

    #[tokio::test]
    async fn every_part_reads_at_the_first_parts_revision() {
        let b = filled(100, 10).await;
        let mut parts = Parts::new(b.clone(), RangeRequest::new(prefix()), 1);
        let first = parts.next().await.unwrap().unwrap();
        // Written after the first part: not in the stream.
        let put = PutRequest { key: b"k/zzz".to_vec(), value: b"late".to_vec(), ..Default::default() };
        b.write(WriteOp::Txn(TxnRequest { success: vec![RequestOp::Put(put)], ..Default::default() })).await.unwrap();
        let mut kvs = first.kvs;
        let mut last = None;
        while let Some(p) = parts.next().await.unwrap() {
            kvs.extend(p.kvs);
            last = p.last;
        }
        assert_eq!(kvs.len(), 100);
        assert_eq!(last.unwrap().revision, 101);
        assert_eq!(last.unwrap().count, 100);
    }

    #[test]
    fn etcds_refusals() {
        let sorted = RangeRequest { sort_order: SortOrder::Descend, ..RangeRequest::new(prefix()) };
        assert_eq!(validate(&sorted).unwrap_err().to_string(), "RangeStream does not support custom sort orders");
        let by_key = RangeRequest { sort_order: SortOrder::Ascend, ..RangeRequest::new(prefix()) };
        assert!(validate(&by_key).is_ok());
        let no_order = RangeRequest { sort_target: SortTarget::Mod, ..RangeRequest::new(prefix()) };
        assert!(validate(&no_order).is_ok());
        let filtered = RangeRequest { min_mod_revision: 3, ..RangeRequest::new(prefix()) };
        assert_eq!(validate(&filtered).unwrap_err().to_string(), "RangeStream does not support revision filters");
        assert!(matches!(validate(&RangeRequest::new(KeyRange::single(Vec::new()))), Err(Error::EmptyKey)));
    }
}
