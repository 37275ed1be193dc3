//! Reading a store a page at a time, as `kine-rs inspect`, `kine-rs migrate` and the S3
//! checkpoints do.

use crate::Result;
use crate::backend::Backend;
use crate::request::RangeRequest;
use crate::{KeyRange, KeyValue, RangeEnd, Revision};
use std::collections::VecDeque;

/// Keys read per range request.
const PAGE: i64 = 1000;

/// The keys of a range at one revision, in key order, read a page at a time.
pub struct Pager<'a> {
    backend: &'a dyn Backend,
    range: KeyRange,
    /// 0 until the first page fixes the current revision.
    revision: Revision,
    page: VecDeque<KeyValue>,
    done: bool,
}

impl<'a> Pager<'a> {
    pub fn new(backend: &'a dyn Backend, range: KeyRange, revision: Revision) -> Pager<'a> {
        Pager { backend, range, revision, page: VecDeque::new(), done: false }
    }

    pub async fn next(&mut self) -> Result<Option<KeyValue>> {
        if self.page.is_empty() && !self.done {
            let mut req = RangeRequest::new(self.range.clone());
            req.limit = PAGE;
            req.revision = self.revision;
            req.total_count = false;
            let resp = self.backend.range(req).await?;
            if self.revision <= 0 {
                self.revision = resp.revision;
            }
            match (resp.value.more, resp.value.kvs.last()) {
                (true, Some(last)) if self.range.end != RangeEnd::Single => {
                    let mut next = last.key.clone();
                    next.push(0);
                    self.range.start = next;
                }
                _ => self.done = true,
            }
            self.page = resp.value.kvs.into();
        }
        Ok(self.page.pop_front())
    }
}
