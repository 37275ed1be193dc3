//! etcd's Range semantics (limit, count, more, sort, revision filters) over any [`ReadView`].

use crate::error::{Error, Result};
use crate::page_counts::PageCounts;
use crate::request::{RangeRequest, RangeResponse, SortOrder, SortTarget};
use crate::types::{KeyValue, Revision};
use crate::view::ReadView;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys read per scan of a range that may be long: the response is assembled a page at a time,
/// and its size checked as it grows.
const PAGE: usize = 4096;
/// What a key-value pair adds to a response besides its key and value (its numbers and
/// protobuf framing), for the size check.
const KV_OVERHEAD: usize = 32;
/// The largest response etcd sends: its gRPC server's limit (`math.MaxInt32`).
pub const ETCD_MAX_RESPONSE_BYTES: usize = i32::MAX as usize;

static MAX_RESPONSE_BYTES: AtomicUsize = AtomicUsize::new(ETCD_MAX_RESPONSE_BYTES);

/// Sets the largest Range (or Txn) response this process assembles (`--max-response-bytes`);
/// a larger one fails with [`Error::ResponseTooLarge`] once that much has been read, so that a
/// range without a limit over a huge key space never holds more than that in memory.
pub fn set_max_response_bytes(max: usize) {
    MAX_RESPONSE_BYTES.store(max, Ordering::Relaxed);
}

/// Resolves the revision a read should see: 0 means `current`; future and compacted
/// revisions are errors (reading exactly the compact revision is allowed, as in etcd).
pub fn read_revision(requested: Revision, current: Revision, compacted: Revision) -> Result<Revision> {
    let rev = if requested <= 0 { current } else { requested };
    if rev > current {
        return Err(Error::FutureRevision);
    }
    if rev < compacted {
        return Err(Error::Compacted { compact_revision: compacted });
    }
    Ok(rev)
}

/// Runs a Range at an already resolved revision.
pub fn execute(view: &mut dyn ReadView, req: &RangeRequest, rev: Revision) -> Result<RangeResponse> {
    execute_with(view, req, rev, None)
}

/// [`execute`], taking the count of a paginated list's page from `counts` when the page before
/// it left it there, and leaving the next page's (`page_counts.rs`).
pub fn execute_with(
    view: &mut dyn ReadView,
    req: &RangeRequest,
    rev: Revision,
    counts: Option<&PageCounts>,
) -> Result<RangeResponse> {
    if req.range.is_empty() {
        return Ok(RangeResponse::default());
    }
    if req.count_only {
        let count = view.count(&req.range, rev)?;
        return Ok(RangeResponse { kvs: Vec::new(), more: false, count });
    }
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // Sorting or filtering needs every key; otherwise fetch one more than asked to learn `more`.
    let fetch_all = req.sort_order != SortOrder::None || filtered || req.limit <= 0;
    let fetch = if fetch_all { 0 } else { req.limit as usize + 1 };
    // Values are needed to sort by value even when only keys are returned.
    let scan_keys_only = req.keys_only && req.sort_target != SortTarget::Value;
    let mut kvs = scan_in_pages(view, &req.range, rev, fetch, scan_keys_only)?;
    // `count` is every live key in the range, before filters and limit (as etcd).
    let count = if fetch == 0 || kvs.len() < fetch || !req.total_count {
        kvs.len() as i64
    } else if let Some(count) = counts.and_then(|c| c.take(&req.range, rev)) {
        count
    } else {
        view.count(&req.range, rev)?
    };
    if filtered {
        kvs.retain(|kv| keep(req, kv));
    }
    sort(&mut kvs, req.sort_order, req.sort_target);
    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
        // The first `limit` keys of the range in key order, none filtered out, and `count` all
        // of its keys: the next page's count is this one's minus them.
        if let (Some(counts), Some(last), false, true) = (counts, kvs.last(), fetch_all, req.total_count) {
            counts.remember(&req.range, rev, &last.key, count, kvs.len());
        }
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse { kvs, more, count })
}

/// `view.scan` (`fetch` 0: every key) a page at a time, failing once the keys read exceed the
/// response size limit.
fn scan_in_pages(
    view: &mut dyn ReadView,
    range: &crate::types::KeyRange,
    rev: Revision,
    fetch: usize,
    keys_only: bool,
) -> Result<Vec<KeyValue>> {
    let max = MAX_RESPONSE_BYTES.load(Ordering::Relaxed);
    let (mut kvs, mut size) = (Vec::new(), 0usize);
    let mut page_range = range.clone();
    loop {
        let want = if fetch == 0 { PAGE } else { (fetch - kvs.len()).min(PAGE) };
        let page = view.scan(&page_range, rev, want, keys_only)?;
        size += page.iter().map(|kv| kv.key.len() + kv.value.len() + KV_OVERHEAD).sum::<usize>();
        if size > max {
            return Err(Error::ResponseTooLarge { size, max });
        }
        let last = page.len() == want && page_range.end != crate::types::RangeEnd::Single;
        let next = page.last().map(|kv| kv.key.clone());
        kvs.extend(page);
        match next {
            Some(mut after) if last && (fetch == 0 || kvs.len() < fetch) => {
                // The smallest key after the page's last one.
                after.push(0);
                page_range.start = after;
            }
            _ => return Ok(kvs),
        }
    }
}

fn keep(req: &RangeRequest, kv: &KeyValue) -> bool {
    (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
        && (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
        && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
        && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
}

fn sort(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    // Scans return keys ascending. As etcd: a non-key target with no order sorts ascending;
    // key/ascend is already in order.
    let order = match (order, target) {
        (SortOrder::None, SortTarget::Key) | (SortOrder::Ascend, SortTarget::Key) => return,
        (SortOrder::None, _) => SortOrder::Ascend,
        (o, _) => o,
    };
    let cmp = |a: &KeyValue, b: &KeyValue| match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    };
    if order == SortOrder::Descend {
        kvs.sort_by(|a, b| cmp(b, a));
    } else {
        kvs.sort_by(cmp);
    }
}

/// A [`ReadView`] of one key read ahead: its live version at the read revision, or none (absent
/// or deleted). Lets a backend answer a single-key Range with one query, then run the Range
/// rules here as for any other read.
pub struct OneKey(pub Option<KeyValue>);

impl ReadView for OneKey {
    fn scan(
        &mut self,
        range: &crate::types::KeyRange,
        _rev: Revision,
        _limit: usize,
        keys_only: bool,
    ) -> Result<Vec<KeyValue>> {
        debug_assert!(range.end == crate::types::RangeEnd::Single);
        let mut kvs: Vec<KeyValue> = self.0.iter().filter(|kv| kv.key == range.start).cloned().collect();
        if keys_only {
            kvs.iter_mut().for_each(|kv| kv.value.clear());
        }
        Ok(kvs)
    }

    fn count(&mut self, range: &crate::types::KeyRange, rev: Revision) -> Result<i64> {
        Ok(self.scan(range, rev, 0, true)?.len() as i64)
    }
}
