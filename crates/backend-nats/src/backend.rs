//! `nats://`: the NATS JetStream backend.
//!
//! The bucket's stream is the log: one message per key change, the etcd revision is the
//! message's stream sequence (the init marker is sequence 1). Every process keeps a replica of
//! the retained stream in a [`MemTable`], fed by one pull consumer (`replica.rs`); the shared etcd logic
//! runs on it. A write is evaluated on the replica, then published with a JetStream
//! expectation that makes it conditional: on each written key's last sequence when the write
//! reads nothing but those keys (the Kubernetes create/update/delete shapes), otherwise on the
//! whole stream's last sequence. A failed expectation means another writer got there first:
//! the write is evaluated again. Reads first wait until the replica has applied the stream's
//! last sequence as the stream leader reports it, so they are linearizable.

mod barrier;
mod consumer;
mod leader;
mod local;
mod replica;
mod setup;

use crate::batch::MessageSeqs;
use crate::codec;
use crate::config::NatsConfig;
use crate::connect::{self, ClientTls};
use crate::message;
use crate::write_locks::{self, WriteLocks};
use anyhow::{Context as _, anyhow};
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use kine_core::backend::{Backend, BackendStatus, FEED_CAPACITY, LeaseUpdate, Revisions};
use kine_core::memory::MemTable;
use kine_core::request::{
    DeleteRangeRequest, RangeRequest, RangeResponse, RequestOp, ResponseOp, Revisioned, TxnRequest, TxnResponse,
};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::view::WriteView;
use kine_core::{Error, KeyRange, LeaseId, RangeEnd, Result, Revision, RevisionEvents, range};
pub use local::LocalServer;
use local::LocalStream;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch};

/// How long a request waits for NATS before failing with `Unavailable`.
const NATS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long start-up waits for the first connection to NATS.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Purge requests in flight during a compaction.
const PURGE_CONCURRENCY: usize = 32;
/// Attempts of a conditional write that keeps losing to other writers.
const MAX_WRITE_ATTEMPTS: usize = 64;

#[derive(Clone, Debug)]
pub struct NatsOptions {
    pub config: NatsConfig,
    pub tls: ClientTls,
    /// The largest write kine-rs accepts (`--max-request-bytes`): NATS should take messages
    /// that large.
    pub max_request_bytes: usize,
    /// The NATS server in this process (the embedded one), which answers read barriers
    /// in-process while it leads the bucket's stream.
    pub local: Option<Arc<dyn LocalServer>>,
}

impl NatsOptions {
    /// Options without datastore TLS, for etcd's request limit (1.5 MiB).
    pub fn new(config: NatsConfig) -> NatsOptions {
        NatsOptions { config, tls: ClientTls::default(), max_request_bytes: 1536 * 1024, local: None }
    }
}

pub struct NatsBackend {
    inner: Arc<Inner>,
}

struct Inner {
    bucket: String,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
    /// Compact revision and leases (`<bucket>-meta` KV bucket): not etcd writes, no revision.
    meta: jetstream::kv::Store,
    table: Mutex<MemTable>,
    /// Message sequences of versions written by multi-key batches (locked after `table`).
    message_seqs: Mutex<MessageSeqs>,
    /// The last stream sequence the replica applied.
    applied: watch::Sender<Revision>,
    /// The newest last sequence the stream leader reported to a read barrier: the replica must
    /// reach it (when it delivers nothing while behind it, the replica looks into why).
    target: watch::Sender<Revision>,
    /// The read barrier's requests to the stream leader, shared by concurrent reads.
    rounds: barrier::Rounds,
    /// The stream on the NATS server in this process, which answers barriers while it leads.
    local: Option<LocalStream>,
    feed: broadcast::Sender<Arc<RevisionEvents>>,
    /// Which of this process's writes may be in flight together (see `write_locks`).
    locks: WriteLocks,
    /// Held by a compaction.
    compaction: tokio::sync::Mutex<()>,
    /// `$KV.<bucket>.>`: every message of the bucket.
    filter: String,
    /// `KV_<bucket>`.
    stream_name: String,
    /// The stream drops old messages of a key beyond a per-key limit (`revHistory`).
    history_limited: bool,
    slow: Duration,
    /// Set by `close`; shared with the client's event callback.
    closed: Arc<AtomicBool>,
    cluster_id: u64,
    member_id: u64,
    replica_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    meta_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The `<bucket>-meta` KV revision of each lease record last seen (expiry is conditional
    /// on it: a node that renewed the lease meanwhile wins).
    lease_revs: Mutex<HashMap<LeaseId, u64>>,
    lease_updates: broadcast::Sender<LeaseUpdate>,
}

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("etcdserver: NATS unavailable: {e}"))
}

/// Whether an error is one that a NATS cluster gives while it forms or elects a leader (worth
/// retrying for a while).
fn transient(error: &str) -> bool {
    const SIGNS: [&str; 10] = [
        "no responders",
        // A stream just created on a forming cluster (by this node or another), not yet known
        // to this server.
        "no stream found",
        "stream not found",
        "timed out",
        "deadline has elapsed",
        "temporarily unavailable",
        "no suitable peers",
        "can not handle request",
        "is offline",
        "leader",
    ];
    let text = error.to_ascii_lowercase();
    SIGNS.iter().any(|sign| text.contains(sign))
}

async fn timed<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(NATS_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(format!("{what}: {e}"))),
        Err(_) => Err(unavailable(format!("{what}: timed out after {NATS_TIMEOUT:?}"))),
    }
}

/// A stable, non-zero id from a name.
fn hash_id(text: &str) -> u64 {
    codec::fnv1a(text.as_bytes()).max(1)
}

impl NatsBackend {
    /// Connects, creates the bucket if needed, and loads the replica (cost grows with the
    /// retained messages, which compaction keeps close to the number of live keys).
    pub async fn open(options: NatsOptions) -> anyhow::Result<NatsBackend> {
        let cfg = &options.config;
        let closed = Arc::new(AtomicBool::new(false));
        let (servers, opts, last_error) = connect::options(cfg, &options.tls, closed.clone()).await?;
        // The client connects in the background (and reconnects forever); start-up waits for
        // the first connection.
        let client = opts
            .connect(servers.clone())
            .await
            .with_context(|| format!("connect to NATS at {}", connect::shown(&servers)))?;
        connect::wait_connected(&client, &servers, &last_error, CONNECT_TIMEOUT).await?;
        let max_payload = client.server_info().max_payload;
        if max_payload < options.max_request_bytes {
            tracing::warn!(
                max_payload,
                max_request_bytes = options.max_request_bytes,
                "the NATS server's max_payload is below --max-request-bytes: larger values are refused with \
                 \"request is too large\" (raise max_payload on the server, e.g. max_payload: 2MB)"
            );
        }
        let js = jetstream::new(client.clone());
        // A NATS cluster that is forming or electing leaders refuses JetStream requests for a
        // while: the set-up steps wait for it (bounded, see `setup::patiently`).
        let (stream, meta, info) = setup::patiently("open the bucket", || async {
            let stream = setup::ensure_stream(&js, cfg).await?;
            let meta = setup::ensure_meta(&js, cfg).await?;
            let info = stream.get_info().await.context("read the bucket's stream info")?;
            Ok((stream, meta, info))
        })
        .await?;
        let (feed, _) = broadcast::channel(FEED_CAPACITY);
        let member_id = kine_core::id::random_nonzero();
        let stream_name = format!("KV_{}", cfg.bucket);
        let local = options.local.clone().and_then(|server| LocalStream::bind(server, &client, &stream_name));
        let inner = Arc::new(Inner {
            bucket: cfg.bucket.clone(),
            client,
            rounds: barrier::Rounds::new(js.clone(), stream_name.clone()),
            local,
            js,
            stream_name,
            stream,
            meta,
            table: Mutex::new(MemTable::at(0)),
            message_seqs: Mutex::new(MessageSeqs::default()),
            applied: watch::channel(0).0,
            target: watch::channel(0).0,
            feed,
            locks: WriteLocks::default(),
            compaction: tokio::sync::Mutex::new(()),
            filter: format!("$KV.{}.>", cfg.bucket),
            history_limited: info.config.max_messages_per_subject > 0,
            slow: cfg.slow_method,
            closed,
            cluster_id: hash_id(&format!("kine-rs/{}", cfg.bucket)),
            member_id,
            replica_task: Mutex::new(None),
            meta_task: Mutex::new(None),
            lease_revs: Mutex::new(HashMap::new()),
            lease_updates: broadcast::channel(1024).0,
        });
        let meta_watch = setup::patiently("watch the meta bucket", || async {
            inner.meta.watch_with_history(">").await.context("watch the meta bucket")
        })
        .await?;
        setup::patiently("load the leases", || setup::load_leases(&inner)).await?;
        let meta_task = tokio::spawn(follow_meta(inner.clone(), meta_watch));
        *inner.meta_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(meta_task);
        let started = Instant::now();
        let (ready, loaded) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(replica::replicate(inner.clone(), ready));
        *inner.replica_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        let (revision, messages) = tokio::time::timeout(Duration::from_secs(300), loaded)
            .await
            .map_err(|_| anyhow!("load the bucket into memory: not done within 300 s"))?
            .map_err(|_| anyhow!("load the bucket into memory: stopped"))?;
        tracing::info!(
            bucket = %cfg.bucket,
            revision,
            messages,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "NATS bucket loaded"
        );
        Ok(NatsBackend { inner })
    }
}

/// Follows `<bucket>-meta`: leases granted, renewed or revoked and compactions done by any node.
async fn follow_meta(inner: Arc<Inner>, mut watch: jetstream::kv::Watch) {
    loop {
        match watch.next().await {
            Some(Ok(entry)) => {
                if entry.key == "compact_revision" && entry.operation == jetstream::kv::Operation::Put {
                    let Some(rev) = std::str::from_utf8(&entry.value).ok().and_then(|s| s.parse::<Revision>().ok())
                    else {
                        continue;
                    };
                    // Compact once the replica holds everything the stream has (messages up to
                    // `rev` that it never saw were removed by that compaction).
                    match inner.barrier().await {
                        Ok(()) => {
                            let mut t = inner.table();
                            t.advance(rev);
                            if t.revisions().compacted < rev {
                                let _ = t.compact(rev);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, revision = rev, "cannot apply a compaction made by another node yet")
                        }
                    }
                } else {
                    inner.apply_meta(&entry);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "meta bucket watch failed; re-creating it");
                tokio::time::sleep(Duration::from_secs(1)).await;
                match inner.meta.watch_with_history(">").await {
                    Ok(w) => watch = w,
                    Err(e) => tracing::warn!(error = %e, "cannot watch the meta bucket"),
                }
            }
            None => {
                if inner.closed.load(Ordering::SeqCst) {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Ok(w) = inner.meta.watch_with_history(">").await {
                    watch = w;
                }
            }
        }
    }
}

/// How a write is made conditional.
enum Expect {
    /// Each message carries its key's last sequence: the write read nothing but those keys.
    PerKey,
    /// The first message carries the stream's last sequence.
    Stream(Revision),
}

impl Inner {
    /// Applies one `<bucket>-meta` lease record (newer KV revisions only).
    fn apply_meta(&self, entry: &jetstream::kv::Entry) {
        let Some(id) = entry.key.strip_prefix("lease.").and_then(|s| s.parse::<LeaseId>().ok()) else { return };
        let mut revs = self.lease_revs.lock().unwrap_or_else(|p| p.into_inner());
        if revs.get(&id).is_some_and(|r| *r >= entry.revision) {
            return;
        }
        match entry.operation {
            jetstream::kv::Operation::Put => {
                let Some(ttl) = std::str::from_utf8(&entry.value).ok().and_then(|s| s.parse::<i64>().ok()) else {
                    return;
                };
                revs.insert(id, entry.revision);
                let _ = self.table().insert_lease(id, ttl);
                let _ = self.lease_updates.send(LeaseUpdate::Renewed { id, ttl });
            }
            jetstream::kv::Operation::Delete | jetstream::kv::Operation::Purge => {
                revs.insert(id, entry.revision);
                let _ = self.table().remove_lease(id);
                let _ = self.lease_updates.send(LeaseUpdate::Revoked { id });
            }
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, MemTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lock order: `table` first, then this.
    fn seqs(&self) -> std::sync::MutexGuard<'_, MessageSeqs> {
        self.message_seqs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fails at once when stopped or while the NATS connection is down (requests must not
    /// hang while the client reconnects).
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Unavailable("etcdserver: server stopped".into()));
        }
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(unavailable("not connected to NATS (reconnecting)"));
        }
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    async fn wait_applied(&self, seq: Revision, limit: Duration) -> Result<()> {
        if *self.applied.borrow() >= seq {
            return Ok(());
        }
        let mut rx = self.applied.subscribe();
        match tokio::time::timeout(limit, rx.wait_for(|a| *a >= seq)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Unavailable("etcdserver: server stopped".into())),
            Err(_) => Err(unavailable(format!("the replica did not reach revision {seq} within {limit:?}"))),
        }
    }

    /// Linearizability: wait until the replica holds everything the stream leader holds now.
    /// Costs one shared request to the leader (see `barrier`), whatever the bucket holds, or
    /// none when the leader is the server in this process (see `local`).
    async fn barrier(&self) -> Result<()> {
        self.check_open()?;
        let started = Instant::now();
        let last = match self.local.as_ref().and_then(LocalStream::last) {
            Some(last) => last,
            None => self.rounds.stream_state().await?.last,
        };
        self.target.send_if_modified(|t| {
            let newer = last > *t;
            *t = (*t).max(last);
            newer
        });
        let remaining = NATS_TIMEOUT.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
        self.wait_applied(last, remaining).await?;
        let elapsed = started.elapsed();
        if elapsed >= self.slow {
            tracing::warn!(elapsed_ms = elapsed.as_millis() as u64, "slow NATS read barrier");
        }
        Ok(())
    }

    /// Evaluates a write on the replica: the outcome, the revision it was evaluated at, and
    /// the expectations that make publishing it conditional on exactly that state (taken under
    /// the same lock, never later).
    fn evaluate(&self, op: &WriteOp) -> Result<(kine_core::txn::Applied, Revision, Expect, Vec<Revision>)> {
        let mut t = self.table();
        let base = t.revision();
        let applied = t.evaluate(op)?;
        let seqs = self.seqs();
        let key_last: Vec<Revision> = applied
            .events
            .as_ref()
            .map(|ev| {
                ev.events
                    .iter()
                    .map(|e| t.newest(&e.kv.key).map_or(0, |(rev, _)| seqs.last_subject_seq(&e.kv.key, rev)))
                    .collect()
            })
            .unwrap_or_default();
        let expect = match (op, &applied.response, &applied.events) {
            (WriteOp::Txn(req), WriteResponse::Txn(resp), Some(ev)) => {
                let written: HashSet<Vec<u8>> = ev.events.iter().map(|e| e.kv.key.clone()).collect();
                if per_key(req, resp, &written) { Expect::PerKey } else { Expect::Stream(base) }
            }
            _ => Expect::Stream(base),
        };
        Ok((applied, base, expect, key_last))
    }

    /// Publishes the messages of one write. `key_last[i]` is the last revision of event `i`'s
    /// key when the write was evaluated. `None`: an expectation failed.
    async fn publish(
        &self,
        events: &[kine_core::Event],
        expect: Expect,
        key_last: &[Revision],
    ) -> Result<Option<Revision>> {
        let batch_id = (events.len() > 1).then(|| format!("kine-{:x}", kine_core::id::random_u64()));
        let mut ack = None;
        for (i, event) in events.iter().enumerate() {
            let (mut headers, payload) = message::encode(event);
            match &expect {
                Expect::PerKey => {
                    headers.insert("Nats-Expected-Last-Subject-Sequence", key_last[i].to_string().as_str());
                }
                Expect::Stream(last) if i == 0 => {
                    headers.insert("Nats-Expected-Last-Sequence", last.to_string().as_str());
                }
                Expect::Stream(_) => {}
            }
            if let Some(id) = &batch_id {
                message::mark_batch(&mut headers, i, events.len());
                headers.insert("Nats-Batch-Id", id.as_str());
                headers.insert("Nats-Batch-Sequence", (i + 1).to_string().as_str());
                if i + 1 == events.len() {
                    headers.insert("Nats-Batch-Commit", "1");
                }
            }
            let subject = message::subject(&self.bucket, &event.kv.key);
            let sent = match tokio::time::timeout(NATS_TIMEOUT, self.js.publish_with_headers(subject, headers, payload))
                .await
            {
                Ok(Ok(future)) => future,
                // Larger than the server's max_payload: a size error, never an outage (an
                // unfinished batch is dropped by the server).
                Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                    return Err(Error::RequestTooLarge);
                }
                Ok(Err(e)) => return Err(unavailable(format!("publish: {e}"))),
                Err(_) => return Err(unavailable(format!("publish: timed out after {NATS_TIMEOUT:?}"))),
            };
            if batch_id.is_some() && i + 1 < events.len() {
                // Batch members before the commit are not acknowledged one by one.
                continue;
            }
            let future = sent;
            ack = Some(match tokio::time::timeout(NATS_TIMEOUT, future).await {
                Ok(Ok(ack)) => ack,
                Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => return Ok(None),
                Ok(Err(e)) => {
                    let text = e.to_string();
                    // Wrong-last-sequence inside a batch, or a replicated stream's variant of it.
                    if text.contains("wrong last sequence") || text.contains("10071") || text.contains("10164") {
                        return Ok(None);
                    }
                    if stream_full(&text) {
                        tracing::warn!(error = %text, "the NATS stream has no room for a write");
                        return Err(Error::NoSpace);
                    }
                    return Err(unavailable(format!("publish: {text}")));
                }
                Err(_) => return Err(unavailable("publish: no acknowledgement within 5 s")),
            });
        }
        Ok(ack.map(|a| a.sequence as Revision))
    }
}

/// Does a refused publish say the stream (its max_bytes/max_msgs with discard=new) or the
/// server's JetStream storage is full?
fn stream_full(text: &str) -> bool {
    ["maximum bytes exceeded", "maximum messages exceeded", "insufficient resources", "insufficient storage"]
        .iter()
        .any(|s| text.contains(s))
}

/// Can this write be made conditional on its own keys alone? Only if everything it read is a
/// single key it also writes, and it ran no Range.
fn per_key(req: &TxnRequest, resp: &TxnResponse, written: &HashSet<Vec<u8>>) -> bool {
    for c in &req.compare {
        if c.range.end != RangeEnd::Single || !written.contains(&c.range.start) {
            return false;
        }
    }
    let branch = if resp.succeeded { &req.success } else { &req.failure };
    for (op, r) in branch.iter().zip(&resp.responses) {
        match (op, r) {
            (RequestOp::Range(_), _) => return false,
            (RequestOp::Put(_), _) => {}
            (RequestOp::DeleteRange(d), _) => {
                if d.range.end != RangeEnd::Single {
                    return false;
                }
            }
            (RequestOp::Txn(inner), ResponseOp::Txn(inner_resp)) => {
                if !per_key(inner, inner_resp, written) {
                    return false;
                }
            }
            (RequestOp::Txn(_), _) => return false,
        }
    }
    true
}

impl NatsBackend {
    /// Evaluates on the replica and publishes conditionally. The first attempt skips the read
    /// barrier: the expectations reject a write evaluated on a stale replica, and only then is
    /// the replica synchronised. An answer that writes nothing (a failed compare, an error)
    /// carries no expectation, so it is only given from a synchronised replica.
    async fn conditional_write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        let inner = &self.inner;
        inner.check_open()?;
        let mut synced = false;
        let keys = write_locks::request_keys(&op);
        let mut exclusive = keys.is_none();
        let mut lost: Vec<Vec<u8>> = Vec::new();
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let _guard = match &keys {
                Some(keys) if !exclusive => inner.locks.keys(keys).await,
                _ => inner.locks.alone().await,
            };
            let evaluated = inner.evaluate(&op);
            let (applied, base, expect, key_last) = match evaluated {
                Ok(v) => v,
                Err(_) if !synced => {
                    inner.barrier().await?;
                    synced = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if matches!(expect, Expect::Stream(_)) && applied.events.is_some() && !exclusive {
                // Conditional on the whole stream: evaluate again with this process's other
                // writes held back.
                exclusive = true;
                continue;
            }
            let Some(ev) = &applied.events else {
                if !synced {
                    inner.barrier().await?;
                    synced = true;
                    continue;
                }
                return Ok(Revisioned { revision: base, value: applied.response });
            };
            match inner.publish(&ev.events, expect, &key_last).await? {
                Some(seq) => {
                    let mut response = applied.response;
                    if let WriteResponse::Txn(t) = &mut response {
                        // Evaluated as revision `base + 1`; it landed at `seq`.
                        t.renumber(base + 1, seq);
                    }
                    // Committed. Give the replica a moment to apply it, so that this node's
                    // next write is evaluated on it (reads wait for it anyway); a slow replica
                    // does not turn a committed write into an error.
                    let _ = inner.wait_applied(seq, Duration::from_secs(1)).await;
                    return Ok(Revisioned { revision: seq, value: response });
                }
                None => {
                    tracing::debug!("conditional write lost to another writer; evaluating again");
                    inner.barrier().await?;
                    self.find_emptied_keys(&ev.events).await?;
                    lost = ev.events.iter().map(|e| e.kv.key.clone()).collect();
                    synced = true;
                    continue;
                }
            }
        }
        for key in lost {
            let newest = inner.table().newest(&key);
            if let Some((rev, false)) = newest
                && !self.subject_exists(&key).await?
            {
                return Err(unavailable(format!(
                    "key {:?} has no message in the NATS stream although this node holds its version at \
                     revision {rev}: the stream was changed outside kine-rs (purged?)",
                    String::from_utf8_lossy(&key)
                )));
            }
        }
        Err(unavailable("a write kept conflicting with other writers"))
    }

    /// Does the stream (its leader) hold a message for `key`?
    async fn subject_exists(&self, key: &[u8]) -> Result<bool> {
        let subject = message::subject(&self.inner.bucket, key);
        match tokio::time::timeout(NATS_TIMEOUT, self.inner.stream.get_last_raw_message_by_subject(&subject)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Ok(Err(e)) => Err(unavailable(format!("read the last message of a key: {e}"))),
            Err(_) => Err(unavailable("read the last message of a key: timed out")),
        }
    }

    /// After a failed expectation, on a synchronised replica: a written key whose newest
    /// version here is a deletion, and whose subject is empty on the server, was compacted away
    /// (by another node, or by a compaction this replica has not applied yet): its next write
    /// must expect an empty subject. The replica's history is never changed on such an answer:
    /// a key whose newest version is a put is left alone whatever the server says (a stream
    /// leader still catching up after a restart can miss a subject; believing it once dropped a
    /// key's whole history here), and a wrong "empty" costs one more failed expectation, never
    /// a lost update.
    async fn find_emptied_keys(&self, events: &[kine_core::Event]) -> Result<()> {
        let deleted: Vec<(Vec<u8>, Revision)> = {
            let t = self.inner.table();
            events
                .iter()
                .filter_map(|e| match t.newest(&e.kv.key) {
                    Some((rev, true)) => Some((e.kv.key.clone(), rev)),
                    _ => None,
                })
                .collect()
        };
        for (key, rev) in deleted {
            if !self.subject_exists(&key).await? {
                self.inner.seqs().mark_emptied(&key, rev);
            }
        }
        Ok(())
    }

    async fn lease_grant(&self, id: LeaseId, ttl: i64) -> Result<Revisioned<WriteResponse>> {
        let inner = &self.inner;
        let key = format!("lease.{id}");
        match tokio::time::timeout(NATS_TIMEOUT, inner.meta.create(&key, ttl.to_string().into())).await {
            Ok(Ok(rev)) => {
                inner.lease_revs.lock().unwrap_or_else(|p| p.into_inner()).insert(id, rev);
            }
            Ok(Err(e)) if e.kind() == jetstream::kv::CreateErrorKind::AlreadyExists => return Err(Error::LeaseExists),
            Ok(Err(e)) => return Err(unavailable(format!("grant lease: {e}"))),
            Err(_) => return Err(unavailable("grant lease: timed out")),
        }
        inner.table().insert_lease(id, ttl)?;
        Ok(Revisioned { revision: inner.table().revision(), value: WriteResponse::LeaseGranted })
    }

    /// Revokes a lease: first its record (for an expiry, only if no node renewed it since this
    /// node last saw it — so exactly one node revokes an expired lease), then its keys.
    async fn lease_revoke(&self, id: LeaseId, expired: bool) -> Result<Revisioned<WriteResponse>> {
        let inner = &self.inner;
        inner.barrier().await?;
        if inner.table().lease(id)?.is_none() {
            return Err(Error::LeaseNotFound);
        }
        let key = format!("lease.{id}");
        let seen = inner.lease_revs.lock().unwrap_or_else(|p| p.into_inner()).get(&id).copied();
        let expect = if expired { seen } else { None };
        match tokio::time::timeout(NATS_TIMEOUT, inner.meta.delete_expect_revision(&key, expect)).await {
            Ok(Ok(())) => {}
            // Renewed or revoked by another node meanwhile: not ours to revoke.
            Ok(Err(e)) if expired && e.kind() == jetstream::kv::DeleteErrorKind::WrongLastRevision => {
                return Err(Error::LeaseNotFound);
            }
            Ok(Err(e)) => return Err(unavailable(format!("revoke lease: {e}"))),
            Err(_) => return Err(unavailable("revoke lease: timed out")),
        }
        inner.table().remove_lease(id)?;
        let keys = {
            let mut t = inner.table();
            let rev = t.revision();
            t.keys_with_lease(id, rev)?
        };
        let mut revision = inner.table().revision();
        if !keys.is_empty() {
            let txn = TxnRequest {
                success: keys
                    .into_iter()
                    .map(|k| RequestOp::DeleteRange(DeleteRangeRequest { range: KeyRange::single(k), prev_kv: false }))
                    .collect(),
                ..Default::default()
            };
            revision = self.conditional_write(WriteOp::Txn(txn)).await?.revision;
        }
        Ok(Revisioned { revision, value: WriteResponse::LeaseRevoked })
    }
}

#[async_trait::async_trait]
impl Backend for NatsBackend {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn cluster_id(&self) -> u64 {
        self.inner.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.inner.member_id
    }

    async fn revisions(&self) -> Result<Revisions> {
        self.inner.barrier().await?;
        Ok(self.inner.table().revisions())
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        // A serializable read is served by this node as it stands, as etcd serves it from a
        // member without asking the leader (possibly stale, never half-applied).
        if req.serializable {
            if self.inner.is_closed() {
                return Err(Error::Unavailable("etcdserver: server stopped".into()));
            }
        } else {
            self.inner.barrier().await?;
        }
        let mut t = self.inner.table();
        let Revisions { current, compacted } = t.revisions();
        let rev = range::read_revision(req.revision, current, compacted)?;
        let value = range::execute(&mut *t, &req, rev)?;
        Ok(Revisioned { revision: current, value })
    }

    async fn write(&self, op: WriteOp) -> Result<Revisioned<WriteResponse>> {
        self.inner.check_open()?;
        match op {
            WriteOp::LeaseGrant { id, ttl } => self.lease_grant(id, ttl).await,
            WriteOp::LeaseRevoke { id, expired } => self.lease_revoke(id, expired).await,
            txn @ WriteOp::Txn(_) => self.conditional_write(txn).await,
        }
    }

    async fn compact(&self, revision: Revision) -> Result<Revision> {
        let inner = &self.inner;
        // One compaction at a time. Writes go on meanwhile: purges remove only messages at or
        // below the compact revision, and a write to a key whose messages were all purged fails
        // its expectation and is evaluated again (`find_emptied_keys`); a long compaction
        // (many keys, a long stream) must not stop writes.
        let _compaction = inner.compaction.lock().await;
        inner.barrier().await?;
        let (current, previous, plan) = {
            let t = inner.table();
            let Revisions { current, compacted } = t.revisions();
            kine_core::txn::check_compact(revision, current, compacted)?;
            (current, compacted, t.changed_keys_between(compacted, revision))
        };
        timed("record the compact revision", inner.meta.put("compact_revision", revision.to_string().into())).await?;
        // One purge request per key, PURGE_CONCURRENCY of them in flight (different subjects,
        // so their order does not matter).
        let purges = futures_util::stream::iter(plan).map(|(key, newest, deleted)| async move {
            let subject = message::subject(&inner.bucket, &key);
            // Keep the newest version at or below the compact revision, unless it is a deletion
            // below it (etcd keeps a deletion at the compact revision itself).
            let seq = inner.seqs().get(&key, newest);
            let gone = deleted && newest < revision;
            let keep_from = if gone { seq + 1 } else { seq };
            timed(
                "purge superseded versions",
                std::future::IntoFuture::into_future(inner.stream.purge().filter(subject).sequence(keep_from as u64)),
            )
            .await?;
            inner.seqs().prune(&key, newest, gone);
            Ok::<(), Error>(())
        });
        let mut purges = purges.buffer_unordered(PURGE_CONCURRENCY);
        while let Some(done) = purges.next().await {
            done?;
        }
        {
            // The meta watch may have applied it already.
            let mut t = inner.table();
            if t.revisions().compacted < revision {
                t.compact(revision)?;
            }
        }
        tracing::debug!(revision, previous, "compacted");
        Ok(current)
    }

    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        self.inner.table().events(range, after, until)
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionEvents>> {
        self.inner.feed.subscribe()
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        Ok(self.inner.table().lease_list())
    }

    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        self.inner.barrier().await?;
        let mut t = self.inner.table();
        let rev = t.revision();
        t.keys_with_lease(id, rev)
    }

    async fn status(&self) -> Result<BackendStatus> {
        let info = timed("read the stream state", self.inner.stream.get_info()).await?;
        let bytes = info.state.bytes as i64;
        Ok(BackendStatus { db_size: bytes, db_size_in_use: bytes })
    }

    async fn defragment(&self) -> Result<()> {
        // JetStream manages its own files; compaction already removed the messages.
        self.inner.check_open()
    }

    async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        for task in [&self.inner.replica_task, &self.inner.meta_task] {
            if let Some(task) = task.lock().unwrap_or_else(|p| p.into_inner()).take() {
                task.abort();
            }
        }
        // Flush what was published and close the connection (an embedded server is shut down
        // next; the client must not try to reconnect to it).
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.client.flush()).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.client.drain()).await;
    }

    async fn lease_renew(&self, id: LeaseId, ttl: i64) -> Result<()> {
        self.inner.check_open()?;
        let rev = timed("renew lease", self.inner.meta.put(format!("lease.{id}"), ttl.to_string().into())).await?;
        self.inner.lease_revs.lock().unwrap_or_else(|p| p.into_inner()).insert(id, rev);
        Ok(())
    }

    fn lease_updates(&self) -> Option<broadcast::Receiver<LeaseUpdate>> {
        Some(self.inner.lease_updates.subscribe())
    }
}

impl Drop for NatsBackend {
    fn drop(&mut self) {
        for task in [&self.inner.replica_task, &self.inner.meta_task] {
            if let Some(task) = task.lock().unwrap_or_else(|p| p.into_inner()).take() {
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::transient;

    #[test]
    fn cluster_formation_errors_are_transient() {
        for e in [
            "read the compact revision: failed getting entry: unable to get message: 503 no responders",
            "create stream KV_kine: insufficient resources: no suitable peers for placement",
            "JetStream system temporarily unavailable",
            "read stream KV_kine: timed out: request timed out: deadline has elapsed",
            "initialise bucket faults: no stream found for given subject",
            "read stream KV_ha: request failed: stream not found (code 404, error code 10059)",
        ] {
            assert!(transient(e), "{e}");
        }
        for e in [
            "bucket kine holds data that kine-rs did not write",
            "JetStream not enabled for account",
            "compact_revision is not a number",
        ] {
            assert!(!transient(e), "{e}");
        }
    }
}
