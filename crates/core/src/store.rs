//! The etcd KV, lease and watch API in plain Rust: validation, then the backend.
//! This is what the gRPC layer calls; it knows nothing of gRPC.

use crate::alarm::{Access, Alarm, AlarmKind, Alarms};
use crate::auth::{Auth, AuthOptions};
use crate::backend::{Backend, BackendStatus, Promotion};
use crate::compactor::{self, CompactOptions};
use crate::error::{Error, Result};
use crate::lease::{Lessor, TimeToLive};
use crate::members::{Identity, Members};
use crate::request::*;
use crate::shutdown::Shutdown;
use crate::snapshot;
use crate::txn::{WriteOp, WriteResponse};
use crate::types::{LeaseId, Revision};
use crate::validate;
use crate::watch::{self, WatchOptions, WatchRequest, WatchResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub watch_progress_interval: Duration,
    pub compact: CompactOptions,
    pub auth: AuthOptions,
    /// This node's name and client URLs, as MemberList shows them.
    pub identity: Identity,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            watch_progress_interval: Duration::from_secs(5),
            compact: CompactOptions::default(),
            auth: AuthOptions::default(),
            identity: Identity { name: "kine-rs".into(), client_urls: Vec::new() },
        }
    }
}

pub struct Store {
    backend: Arc<dyn Backend>,
    lessor: Arc<Lessor>,
    auth: Arc<Auth>,
    members: Arc<Members>,
    options: StoreOptions,
    alarms: Alarms,
}

/// A Maintenance.HashKV answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpaceHash {
    pub hash: u32,
    /// The revision hashed.
    pub hash_revision: Revision,
    /// The compact revision when hashing (-1 if never compacted).
    pub compact_revision: Revision,
    /// The store's current revision.
    pub revision: Revision,
}

impl Store {
    pub async fn open(backend: Arc<dyn Backend>, options: StoreOptions) -> Result<Arc<Store>> {
        let lessor = Lessor::load(backend.clone()).await?;
        let auth = Auth::open(backend.clone(), options.auth.clone()).await?;
        let members = Arc::new(Members::new(backend.clone(), options.identity.clone()));
        Ok(Arc::new(Store { backend, lessor, auth, members, options, alarms: Alarms::default() }))
    }

    /// Starts the store's background tasks (lease expiry, automatic compaction).
    pub fn spawn_tasks(&self, shutdown: &Shutdown) -> Vec<JoinHandle<()>> {
        vec![
            tokio::spawn(self.lessor.clone().run_expiry(shutdown.clone())),
            tokio::spawn(self.lessor.clone().follow_updates(shutdown.clone())),
            tokio::spawn(compactor::run(self.backend.clone(), self.options.compact.clone(), shutdown.clone())),
            self.auth.clone().spawn_refresh(shutdown.clone()),
            self.members.clone().spawn(shutdown.clone()),
        ]
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The nodes serving this datastore (MemberList).
    pub fn members(&self) -> &Arc<Members> {
        &self.members
    }

    /// Users, roles, tokens and permission checks.
    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// Refuses writes on a node that serves a read-only copy (an etcd learner).
    fn writable(&self) -> Result<()> {
        match self.backend.role().refusal() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// etcd's MemberPromote: turns this node, a read-only copy, into a writable primary.
    pub async fn promote(&self, member_id: u64) -> Result<Promotion> {
        if member_id != self.backend.member_id() {
            return Err(Error::MemberNotFound);
        }
        self.backend.promote().await
    }

    pub async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        validate::range(&req)?;
        // Every read is linearizable here, which also satisfies a serializable request.
        self.backend.range(req).await
    }

    /// etcd 3.7's RangeStream: the answer in parts (see `range_stream`). `part_bytes` is the
    /// size a part aims at.
    pub fn range_stream(&self, req: RangeRequest, part_bytes: usize) -> Result<crate::range_stream::Parts> {
        crate::range_stream::validate(&req)?;
        Ok(crate::range_stream::Parts::new(self.backend.clone(), req, part_bytes))
    }

    async fn txn_raw(&self, t: TxnRequest) -> Result<Revisioned<TxnResponse>> {
        if crate::alarm::txn_writes(&t) {
            self.writable()?;
        }
        if crate::alarm::txn_puts(&t) {
            self.alarms.check(Access::Grow)?;
        } else if crate::alarm::txn_writes(&t) {
            self.alarms.check(Access::Write)?;
        }
        let r = self.backend.write(WriteOp::Txn(t)).await.inspect_err(|e| self.raise_on_full(e))?;
        match r.value {
            WriteResponse::Txn(value) => Ok(Revisioned { revision: r.revision, value }),
            other => Err(Error::Backend(anyhow::anyhow!("unexpected write response {other:?}"))),
        }
    }

    pub async fn put(&self, req: PutRequest) -> Result<Revisioned<PutResponse>> {
        // A node that cannot write refuses before looking at the request, as etcd's learner.
        self.writable()?;
        validate::put(&req)?;
        // An alarm refuses the put before its lease is looked at (etcd's quota check and
        // corrupt applier run before its put applier).
        self.alarms.check(Access::Grow)?;
        // A Put RPC checks its lease before its key (a put in a Txn: as the emulated version
        // does, `Error::KeyAndLeaseNotFound`); the order shows only when both are missing.
        if req.lease != 0 && (req.ignore_value || req.ignore_lease) && !self.lessor.list().contains(&req.lease) {
            return Err(Error::LeaseNotFound);
        }
        let r = self.txn_raw(TxnRequest { success: vec![RequestOp::Put(req)], ..Default::default() }).await?;
        match r.value.responses.into_iter().next() {
            Some(ResponseOp::Put(put)) => Ok(Revisioned { revision: r.revision, value: put.value }),
            _ => Err(Error::Backend(anyhow::anyhow!("put produced no put response"))),
        }
    }

    pub async fn delete_range(&self, req: DeleteRangeRequest) -> Result<Revisioned<DeleteRangeResponse>> {
        self.writable()?;
        validate::delete_range(&req)?;
        let r = self.txn_raw(TxnRequest { success: vec![RequestOp::DeleteRange(req)], ..Default::default() }).await?;
        match r.value.responses.into_iter().next() {
            Some(ResponseOp::DeleteRange(d)) => Ok(Revisioned { revision: r.revision, value: d.value }),
            _ => Err(Error::Backend(anyhow::anyhow!("delete produced no delete response"))),
        }
    }

    pub async fn txn(&self, req: TxnRequest) -> Result<Revisioned<TxnResponse>> {
        if crate::alarm::txn_writes(&req) {
            self.writable()?;
        }
        validate::txn(&req)?;
        self.txn_raw(req).await
    }

    /// Compacts to `revision`, physically (the superseded versions are gone when it answers).
    /// Returns the current revision.
    pub async fn compact(&self, revision: Revision) -> Result<Revision> {
        self.compact_with(revision, true).await
    }

    /// etcd's Compact: without `physical`, the answer may come once reads below `revision` are
    /// refused, before the superseded versions are gone.
    pub async fn compact_with(&self, revision: Revision, physical: bool) -> Result<Revision> {
        self.writable()?;
        self.alarms.check(Access::Write)?;
        let started = std::time::Instant::now();
        let result = if physical {
            self.backend.compact(revision).await
        } else {
            self.backend.compact_logically(revision).await
        };
        if result.is_ok() {
            crate::metrics::metrics().compaction_ms.observe(started.elapsed().as_secs_f64() * 1000.0);
        }
        result
    }

    pub async fn lease_grant(&self, id: LeaseId, ttl: i64) -> Result<(LeaseId, i64, Revision)> {
        self.writable()?;
        self.alarms.check(Access::Grow)?;
        let (id, ttl) = self.lessor.grant(id, ttl).await.inspect_err(|e| self.raise_on_full(e))?;
        Ok((id, ttl, self.backend.revisions().await?.current))
    }

    pub async fn lease_revoke(&self, id: LeaseId) -> Result<Revision> {
        self.writable()?;
        self.alarms.check(Access::Write)?;
        self.lessor.revoke(id).await
    }

    /// A datastore that reports itself full raises NOSPACE for this member, as etcd does when
    /// its quota is exceeded; it stays raised until deactivated.
    fn raise_on_full(&self, e: &Error) {
        if matches!(e, Error::NoSpace) {
            self.alarms.activate(Alarm { member_id: self.backend.member_id(), kind: AlarmKind::NoSpace });
        }
    }

    pub fn alarms(&self) -> &Alarms {
        &self.alarms
    }

    /// A hash of the key space at `revision` (0: current), as Maintenance.HashKV reports it.
    pub async fn hash_kv(&self, revision: Revision) -> Result<KeySpaceHash> {
        let revs = self.backend.revisions().await?;
        let at = snapshot::check_revision(revision, revs.current, revs.compacted)?;
        let hash = snapshot::hash(self.backend.as_ref(), at, None).await?;
        Ok(KeySpaceHash { hash, hash_revision: at, compact_revision: revs.compacted, revision: revs.current })
    }

    /// A hash of the current key space and the leases (Maintenance.Hash). Returns it with the
    /// revision hashed.
    pub async fn hash(&self) -> Result<(u32, Revision)> {
        let current = self.backend.revisions().await?.current;
        let mut leases = self.backend.leases().await?;
        leases.sort_unstable();
        Ok((snapshot::hash(self.backend.as_ref(), current, Some(&leases)).await?, current))
    }

    /// What a snapshot with history holds besides its keys and events, and those, part by part
    /// (etcd's format: the key space at the compact revision and every revision since).
    pub async fn snapshot_history(&self) -> Result<(snapshot::Head, snapshot::History<'_>)> {
        let head = self.snapshot_head(true).await?;
        let history = snapshot::History::new(self.backend.as_ref(), &head);
        Ok((head, history))
    }

    /// The revisions and leases, and the auth record when the format holds it (etcd's does).
    async fn snapshot_head(&self, with_auth: bool) -> Result<snapshot::Head> {
        let revs = self.backend.revisions().await?;
        let mut leases = self.backend.leases().await?;
        leases.sort_unstable();
        let record = if with_auth { self.backend.auth_record().await? } else { None };
        let auth = match record {
            Some(record) => Some(crate::auth::state::AuthState::decode(&record.data)?),
            None => None,
        };
        Ok(snapshot::Head {
            revision: revs.current,
            compact_revision: revs.compacted,
            base_revision: revs.compacted.clamp(1, revs.current.max(1)),
            cluster_id: self.backend.cluster_id(),
            member_id: self.backend.member_id(),
            leases,
            auth,
        })
    }

    /// Writes a snapshot of the current key space and leases in kine-rs's format (without its
    /// sha256, which the caller appends) to `out`. Returns the revision it holds.
    pub async fn snapshot<W: tokio::io::AsyncWrite + Unpin>(&self, out: &mut W) -> Result<Revision> {
        use tokio::io::AsyncWriteExt;
        let io = |e: std::io::Error| Error::Backend(anyhow::anyhow!("writing the snapshot: {e}"));
        let head = self.snapshot_head(false).await?;
        let mut pages = snapshot::Pages::new(self.backend.as_ref(), head.revision);
        let encoded = snapshot::encode_head(head.revision, head.compact_revision, head.cluster_id, &head.leases);
        out.write_all(&encoded).await.map_err(io)?;
        let mut written = encoded.len() as u64;
        let mut count = 0u64;
        let mut buf = Vec::new();
        while let Some(kvs) = pages.next().await? {
            buf.clear();
            kvs.iter().for_each(|kv| snapshot::encode_kv(&mut buf, kv));
            count += kvs.len() as u64;
            written += buf.len() as u64;
            out.write_all(&buf).await.map_err(io)?;
        }
        out.write_all(&snapshot::encode_tail(count, written)).await.map_err(io)?;
        out.flush().await.map_err(io)?;
        Ok(head.revision)
    }

    pub async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64> {
        self.writable()?;
        self.lessor.keep_alive(id).await
    }

    pub async fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> Result<Option<TimeToLive>> {
        self.lessor.time_to_live(id, keys).await
    }

    pub fn lease_list(&self) -> Vec<LeaseId> {
        self.lessor.list()
    }

    pub async fn current_revision(&self) -> Result<Revision> {
        Ok(self.backend.revisions().await?.current)
    }

    pub async fn status(&self) -> Result<(BackendStatus, Revision)> {
        let status = self.backend.status().await?;
        Ok((status, self.current_revision().await?))
    }

    pub async fn defragment(&self) -> Result<()> {
        self.backend.defragment().await
    }

    /// Starts one watch stream's session; it ends when `requests` closes or on shutdown.
    pub fn watch(
        &self,
        requests: mpsc::Receiver<WatchRequest>,
        out: mpsc::Sender<WatchResponse>,
        shutdown: Shutdown,
    ) -> JoinHandle<()> {
        let options = WatchOptions { progress_interval: self.options.watch_progress_interval };
        tokio::spawn(watch::run_session(self.backend.clone(), options, requests, out, shutdown))
    }
}
