//! A [`Backend`] that measures the one it wraps: every operation counted and timed (by
//! backend, operation and error), and, for the SQL datastores, the same under kine's
//! `kine_sql_*` names; operations slower than the slow threshold (kine's
//! `--slow-sql-threshold`) are logged once each with what they touched.
//!
//! It also bounds them (`--request-timeout`): a datastore that stalls (a stopped process, a
//! partition that drops packets) must not hold requests forever. An operation that runs out of
//! time fails with [`Error::TimedOut`] (etcd's "request timed out"; its outcome is unknown, as
//! in etcd); reads that may legitimately be long (unlimited ranges, a watch catching up) get ten
//! times as long; compaction, defragmentation and promotion have bounds of their own.
//!
//! A client request that makes several operations (a lease grant writes, then reads the
//! revision; an auth check reads before the write) shares one budget: the server runs each
//! request inside [`request`], and a short operation gets what is left of the request timeout
//! since the request began, so the request as a whole answers within it.

use crate::backend::{AuthRecord, Backend, BackendStatus, LeaseUpdate, Promotion, Replication, Revisions, Role};
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::request::{RangeRequest, RangeResponse, Revisioned};
use crate::txn::{WriteOp, WriteResponse};
use crate::types::{KeyRange, LeaseId, Revision, RevisionEvents};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

pub use crate::budget::request;

pub struct Metered {
    inner: Arc<dyn Backend>,
    /// The bound on one operation (zero: none).
    timeout: Duration,
    /// Logged at info from this long, at warn from `warn` (zero: never).
    slow: Duration,
    warn: Duration,
    sql: bool,
}

impl Metered {
    pub fn new(inner: Arc<dyn Backend>, slow: Duration, warn: Duration) -> Metered {
        let sql = matches!(inner.name(), "sqlite" | "postgres" | "mysql");
        Metered { inner, slow, warn, sql, timeout: Duration::ZERO }
    }

    /// Bounds every operation by `timeout` (long reads by ten times as much; zero: no bound).
    pub fn with_timeout(mut self, timeout: Duration) -> Metered {
        self.timeout = timeout;
        self
    }

    async fn bounded<T>(&self, bound: Bound, f: impl Future<Output = Result<T>>) -> Result<T> {
        let limit = match bound {
            Bound::Short => self.timeout,
            Bound::Long => self.timeout * 10,
            Bound::None => Duration::ZERO,
        };
        if bound == Bound::None {
            let result = f.await;
            crate::budget::restart();
            return result;
        }
        if limit.is_zero() {
            return f.await;
        }
        let limit = match (bound, crate::budget::spent()) {
            (Bound::Short, Some(spent)) => limit.saturating_sub(spent),
            _ => limit,
        };
        if limit.is_zero() {
            return Err(Error::TimedOut);
        }
        tokio::time::timeout(limit, f).await.unwrap_or(Err(Error::TimedOut))
    }

    async fn observe<T>(
        &self,
        operation: &'static str,
        what: impl FnOnce() -> String,
        f: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.observe_bounded(Bound::Short, operation, what, f).await
    }

    async fn observe_bounded<T>(
        &self,
        bound: Bound,
        operation: &'static str,
        what: impl FnOnce() -> String,
        f: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = self.bounded(bound, f).await;
        let elapsed = started.elapsed();
        let code = result.as_ref().err().map_or("", error_code);
        let backend = self.inner.name();
        let m = metrics();
        m.backend_total.with_label_values(&[backend, operation, code]).inc();
        m.backend_seconds.with_label_values(&[backend, operation]).observe(elapsed.as_secs_f64());
        if self.sql {
            m.sql_total.with_label_values(&[operation, code]).inc();
            m.sql_seconds.with_label_values(&[operation, code]).observe(elapsed.as_secs_f64());
        }
        let over = |limit: Duration| !limit.is_zero() && elapsed >= limit;
        if over(self.slow) || over(self.warn) {
            m.slow_total.with_label_values(&[backend, operation]).inc();
            let (keys, elapsed_ms) = (what(), elapsed.as_millis() as u64);
            if over(self.warn) {
                tracing::warn!(backend, operation, keys, elapsed_ms, error = code, "slow backend operation");
            } else {
                tracing::info!(backend, operation, keys, elapsed_ms, error = code, "slow backend operation");
            }
        }
        result
    }
}

/// How long an operation may take: the request timeout, ten times it, or no bound here.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bound {
    Short,
    Long,
    None,
}

/// A short, bounded label for an error (never its text, which may name keys).
pub fn error_code(e: &Error) -> &'static str {
    match e {
        Error::Compacted { .. } => "compacted",
        Error::FutureRevision => "future_revision",
        Error::EmptyKey | Error::ValueProvided | Error::LeaseProvided | Error::InvalidSortOption => "invalid_request",
        Error::KeyNotFound | Error::KeyAndLeaseNotFound => "key_not_found",
        Error::TooManyOps | Error::DuplicateKey | Error::InvalidArgument(_) => "invalid_argument",
        Error::LeaseNotFound => "lease_not_found",
        Error::LeaseExists => "lease_exists",
        Error::LeaseTtlTooLarge => "lease_ttl_too_large",
        Error::RequestTooLarge => "request_too_large",
        Error::ResponseTooLarge { .. } => "response_too_large",
        Error::NoSpace => "no_space",
        Error::Corrupt => "corrupt",
        Error::Unsupported(_) => "unsupported",
        Error::ReadOnly(_) => "read_only",
        Error::NotLearner | Error::MemberNotFound => "not_learner",
        Error::SessionExpired | Error::NotLeader | Error::NoLeader => "recipe",
        Error::Auth(_) => "auth",
        Error::Unavailable(_) => "unavailable",
        Error::TimedOut => "timed_out",
        Error::Backend(_) => "backend",
    }
}

/// A key range as a log field: printable keys as text, others escaped, long ones cut.
fn describe(range: &KeyRange) -> String {
    let show = |k: &[u8]| {
        let text = k.escape_ascii().to_string();
        if text.len() > 120 { format!("{}…", &text[..120]) } else { text }
    };
    match &range.end {
        crate::types::RangeEnd::Single => show(&range.start),
        crate::types::RangeEnd::Unbounded => format!("[{}, ∞)", show(&range.start)),
        crate::types::RangeEnd::Before(end) => format!("[{}, {})", show(&range.start), show(end)),
    }
}

fn write_keys(op: &WriteOp) -> String {
    match op {
        WriteOp::Txn(t) => {
            let mut keys: Vec<String> = t.compare.iter().map(|c| describe(&c.range)).collect();
            for op in t.success.iter().chain(&t.failure) {
                match op {
                    crate::request::RequestOp::Range(r) => keys.push(describe(&r.range)),
                    crate::request::RequestOp::Put(p) => keys.push(p.key.escape_ascii().to_string()),
                    crate::request::RequestOp::DeleteRange(d) => keys.push(describe(&d.range)),
                    crate::request::RequestOp::Txn(_) => keys.push("(nested txn)".into()),
                }
            }
            keys.dedup();
            keys.truncate(8);
            keys.join(" ")
        }
        WriteOp::LeaseGrant { id, .. } => format!("lease {id:x}"),
        WriteOp::LeaseRevoke { id, .. } => format!("lease {id:x}"),
        WriteOp::Import(i) => format!("{} versions up to revision {}", i.versions.len(), i.revision),
    }
}

fn write_name(op: &WriteOp) -> &'static str {
    match op {
        WriteOp::Txn(_) => "Txn",
        WriteOp::LeaseGrant { .. } => "LeaseGrant",
        WriteOp::LeaseRevoke { expired: true, .. } => "LeaseExpire",
        WriteOp::LeaseRevoke { .. } => "LeaseRevoke",
        WriteOp::Import(_) => "Import",
    }
}

#[async_trait::async_trait]
impl Backend for Metered {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn cluster_id(&self) -> u64 {
        self.inner.cluster_id()
    }

    fn member_id(&self) -> u64 {
        self.inner.member_id()
    }

    async fn revisions(&self) -> Result<Revisions> {
        let r = self.observe("Revisions", String::new, self.inner.revisions()).await?;
        metrics().current_revision.set(r.current);
        metrics().compact_revision.set(r.compacted);
        Ok(r)
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        let what = describe(&req.range);
        let name = if req.count_only { "Count" } else { "Range" };
        let bound = if req.limit > 0 || req.count_only { Bound::Short } else { Bound::Long };
        self.observe_bounded(bound, name, || what, self.inner.range(req)).await
    }

    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        let (name, what) = (write_name(&op), write_keys(&op));
        self.observe(name, || what, self.inner.write(op)).await
    }

    async fn compact(&self, revision: Revision) -> Result<Revision> {
        let what = || format!("revision {revision}");
        self.observe_bounded(Bound::None, "Compact", what, self.inner.compact(revision)).await
    }

    async fn compact_logically(&self, revision: Revision) -> Result<Revision> {
        let what = || format!("revision {revision}");
        self.observe_bounded(Bound::None, "Compact", what, self.inner.compact_logically(revision)).await
    }

    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        let what = || format!("{} revisions {}..={until}", describe(range), after + 1);
        self.observe_bounded(Bound::Long, "Events", what, self.inner.events(range, after, until)).await
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.inner.subscribe()
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        self.observe("Leases", String::new, self.inner.leases()).await
    }

    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.observe("LeaseKeys", || format!("lease {id:x}"), self.inner.lease_keys(id)).await
    }

    async fn status(&self) -> Result<BackendStatus> {
        let s = self.observe("Status", String::new, self.inner.status()).await?;
        metrics().db_size.set(s.db_size);
        metrics().db_size_in_use.set(s.db_size_in_use);
        Ok(s)
    }

    async fn defragment(&self) -> Result<()> {
        self.observe_bounded(Bound::None, "Defragment", String::new, self.inner.defragment()).await
    }

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.observe("AuthRecord", String::new, self.inner.auth_record()).await
    }

    async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.observe("AuthReplace", String::new, self.inner.auth_replace(expected, data)).await
    }

    async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.observe("MemberPut", String::new, self.inner.member_put(id, record)).await
    }

    async fn member_records(&self) -> Result<Option<Vec<(u64, Vec<u8>)>>> {
        self.observe("MemberRecords", String::new, self.inner.member_records()).await
    }

    async fn member_delete(&self, id: u64) -> Result<()> {
        self.observe("MemberDelete", String::new, self.inner.member_delete(id)).await
    }

    async fn close(&self) {
        self.inner.close().await
    }

    async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.observe("LeaseRenew", || format!("lease {id:x}"), self.inner.lease_renew(id, ttl)).await
    }

    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        self.inner.lease_updates()
    }

    fn role(&self) -> Role {
        self.inner.role()
    }

    fn replication(&self) -> Option<Replication> {
        self.inner.replication()
    }

    async fn promote(&self) -> Result<Promotion> {
        self.observe_bounded(Bound::None, "Promote", String::new, self.inner.promote()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;

    /// The in-memory backend, with writes, revision reads and ranges that take `delay` each.
    struct Slow {
        inner: MemoryBackend,
        delay: Duration,
    }

    #[async_trait::async_trait]
    impl Backend for Slow {
        fn name(&self) -> &'static str {
            "slow"
        }
        fn cluster_id(&self) -> u64 {
            self.inner.cluster_id()
        }
        fn member_id(&self) -> u64 {
            self.inner.member_id()
        }
        async fn revisions(&self) -> Result<Revisions> {
            tokio::time::sleep(self.delay).await;
            self.inner.revisions().await
        }
        async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
            tokio::time::sleep(self.delay).await;
            self.inner.range(req).await
        }
        async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
            tokio::time::sleep(self.delay).await;
            self.inner.write(op).await
        }
        async fn compact(&self, revision: Revision) -> Result<Revision> {
            self.inner.compact(revision).await
        }
        async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
            self.inner.events(range, after, until).await
        }
        fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
            self.inner.subscribe()
        }
        async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
            self.inner.leases().await
        }
        async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
            self.inner.lease_keys(id).await
        }
        async fn status(&self) -> Result<BackendStatus> {
            self.inner.status().await
        }
        async fn defragment(&self) -> Result<()> {
            tokio::time::sleep(self.delay * 3).await;
            self.inner.defragment().await
        }
        async fn close(&self) {
            self.inner.close().await
        }
        async fn auth_record(&self) -> Result<Option<AuthRecord>> {
            self.inner.auth_record().await
        }
        async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
            self.inner.auth_replace(expected, data).await
        }
    }

    fn slow(delay: Duration) -> Metered {
        let backend = Arc::new(Slow { inner: MemoryBackend::new(), delay });
        Metered::new(backend, Duration::ZERO, Duration::ZERO).with_timeout(Duration::from_secs(7))
    }

    /// A lease grant's write and revision read: 5 s each. Alone, each is within the 7-s
    /// timeout; in one request, the second gets the 2 s left and the request ends at 7 s.
    #[tokio::test(start_paused = true)]
    async fn the_operations_of_one_request_share_its_timeout() {
        let m = slow(Duration::from_secs(5));
        let grant = |id| m.write(WriteOp::LeaseGrant { id, ttl: 60 });
        assert!(grant(1).await.is_ok());
        assert!(m.revisions().await.is_ok());

        let started = tokio::time::Instant::now();
        let outcome = request(async {
            grant(2).await?;
            m.revisions().await
        })
        .await;
        assert!(matches!(outcome, Err(Error::TimedOut)), "{outcome:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(7));

        // A request that has spent its budget fails its next operation at once.
        let outcome = request(async {
            tokio::time::sleep(Duration::from_secs(8)).await;
            m.revisions().await
        })
        .await;
        assert!(matches!(outcome, Err(Error::TimedOut)), "{outcome:?}");
    }

    /// A defragmentation has no bound of its own and may outlast the request timeout (a large
    /// SQLite file's VACUUM: 35 s for 4 GiB); the revision read for its answer's header then
    /// gets a fresh budget instead of failing with "request timed out" after the work is done.
    #[tokio::test(start_paused = true)]
    async fn an_operation_without_a_bound_leaves_a_fresh_budget_for_the_answer() {
        let m = slow(Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let outcome = request(async {
            m.defragment().await?;
            m.revisions().await
        })
        .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(20));
        // Short operations still share a budget after it.
        let outcome = request(async {
            m.defragment().await?;
            m.revisions().await?;
            m.revisions().await
        })
        .await;
        assert!(matches!(outcome, Err(Error::TimedOut)), "{outcome:?}");
    }

    /// A hash (HashKV) reads the key space page by page, each page with a budget of its own: a
    /// large store's hash outlasts one request timeout (three pages of 5 s each here) and still
    /// succeeds, as in etcd, where only the client's deadline bounds it.
    #[tokio::test(start_paused = true)]
    async fn a_hash_pages_through_a_large_store_beyond_one_request_timeout() {
        use crate::request::{PutRequest, RequestOp, TxnRequest};
        let inner = MemoryBackend::new();
        for batch in 0..110 {
            let puts = (0..100)
                .map(|i| {
                    RequestOp::Put(PutRequest { key: format!("k{:05}", batch * 100 + i).into(), ..Default::default() })
                })
                .collect();
            inner.write(WriteOp::Txn(TxnRequest { compare: vec![], success: puts, failure: vec![] })).await.unwrap();
        }
        let current = inner.revisions().await.unwrap().current;
        let m = Metered::new(Arc::new(Slow { inner, delay: Duration::from_secs(5) }), Duration::ZERO, Duration::ZERO)
            .with_timeout(Duration::from_secs(7));
        let started = tokio::time::Instant::now();
        let hashed = request(crate::snapshot::hash(&m, current, None)).await;
        assert!(hashed.is_ok(), "{hashed:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(15));
    }
}
