//! `nats://`: the NATS JetStream backend.
//!
//! The bucket's stream is the log: one message per key change, the etcd revision is the
//! message's stream sequence (the init marker is sequence 1). Every process keeps a replica of
//! the retained stream in a [`MemTable`], fed by one pull consumer (`replica.rs`); the shared
//! etcd logic runs on it. A write is evaluated on the replica, then published with a JetStream
//! expectation that makes it conditional (`write.rs`). Reads first wait until the replica has
//! applied the stream's last sequence as the stream leader reports it, so they are
//! linearizable.
//!
//! The stream may also be a JetStream mirror of another kine-rs bucket: this node then serves
//! a read-only copy of it (`layout.rs`, `copy.rs`) until it is promoted (`promote.rs`).

mod api;
mod auth;
mod barrier;
mod compact;
mod consumer;
mod copy;
mod direct;
mod fence;
mod foreign;
mod import;
mod layout;
mod leader;
mod local;
mod marker;
mod members;
mod meta;
mod origin;
mod promote;
mod proposed;
mod record;
mod replica;
mod sent;
mod setup;
mod warm;
mod write;

use crate::batch::MessageSeqs;
use crate::codec;
use crate::config::NatsConfig;
use crate::connect::{self, ClientTls};
use crate::message;
use crate::write_locks::WriteLocks;
use anyhow::{Context as _, anyhow};
use async_nats::jetstream::{self, stream};
use kine_core::backend::{FEED_CAPACITY, LeaseUpdate, Replication, Role};
use kine_core::memory::MemTable;
use kine_core::{Error, LeaseId, Result, Revision, RevisionEvents};
use local::LocalStream;
pub use local::{LocalHead, LocalServer};
use origin::Origin;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch};

/// How long a request waits for NATS before failing with `Unavailable`.
const NATS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long start-up waits for the first connection to NATS.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Purge requests in flight during a compaction.
const PURGE_CONCURRENCY: usize = 32;
/// How long a conditional write that keeps losing to other writers keeps trying. etcd never
/// fails a Put because others write the same key, only a client's deadline ends it: kine-rs's
/// `--request-timeout` (7 s) ends it first; this bounds it when that is off.
const WRITE_PATIENCE: Duration = Duration::from_secs(60);
/// How long a load of the bucket (at start, after a hole, on promotion) may take.
const LOAD_LIMIT: Duration = Duration::from_secs(300);

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
    /// Open the bucket only to read it (`kine-rs inspect`, `kine-rs migrate --from`): nothing is
    /// created or changed, a missing bucket is an error, and every write is refused.
    pub read_only: bool,
    /// Where the replica keeps the bucket's values: a file there, unlinked at once (`None`: in
    /// memory).
    pub values_dir: Option<PathBuf>,
}

impl NatsOptions {
    /// Options without datastore TLS, for etcd's request limit (1.5 MiB), with the values in
    /// the system's temporary directory (on disk: [`values_dir`](crate::values_dir::values_dir)).
    pub fn new(config: NatsConfig) -> NatsOptions {
        NatsOptions {
            config,
            tls: ClientTls::default(),
            max_request_bytes: 1536 * 1024,
            local: None,
            read_only: false,
            values_dir: Some(crate::values_dir::values_dir()),
        }
    }
}

pub struct NatsBackend {
    inner: Arc<Inner>,
    /// The counts of the next pages of paginated lists (`kine_core::page_counts`).
    page_counts: kine_core::page_counts::PageCounts,
}

struct Inner {
    /// The bucket named in the endpoint: the stream is `KV_<bucket>`, writes are published on
    /// `$KV.<bucket>.…`.
    bucket: String,
    /// The bucket named in the stored subjects (`$KV.<stored>.…`): the name it was created with
    /// (another on a copy, or a promoted copy).
    stored: String,
    /// When the bucket was created (unix nanoseconds; the same on its copies): a fence names it.
    birth: i64,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
    /// Compact revision, leases and promotion records (`<bucket>-meta`, see `meta.rs`).
    meta: jetstream::kv::Store,
    /// Primary, read-only copy, or superseded (changed by a promotion or a fence).
    role: RwLock<Role>,
    /// What the bucket mirrors (or mirrored, before its promotion).
    origin: Option<Origin>,
    /// A copy's distance to its origin, as last read (`copy.rs`).
    replication: Mutex<Option<Replication>>,
    /// One promotion at a time.
    promotion: tokio::sync::Mutex<()>,
    table: Mutex<MemTable>,
    /// Where a loaded table keeps its values (`NatsOptions::values_dir`).
    values_dir: Option<PathBuf>,
    /// Message sequences of versions written by multi-key batches (locked after `table`).
    message_seqs: Mutex<MessageSeqs>,
    /// The last stream sequence the replica applied.
    applied: watch::Sender<Revision>,
    /// The last stream sequence the replica received, members of a batch still incomplete
    /// included (a copy serves reads once it has everything its mirror holds, `barrier`).
    delivered: watch::Sender<Revision>,
    /// The origin's time (unix nanoseconds) of the newest message applied (a copy's lag).
    applied_at: AtomicI64,
    /// A copy held everything its origin had when it last heard from it (`copy.rs`).
    current_at_contact: AtomicBool,
    /// The newest compaction a copy's origin recorded, applied once the replica holds it.
    pending_compaction: watch::Sender<Revision>,
    /// Asks the replica to load the bucket again (a counter; `reload`).
    reload_wanted: watch::Sender<u64>,
    /// How many loads the replica has installed.
    loads: watch::Sender<u64>,
    /// The newest last sequence the stream leader reported to a read barrier: the replica must
    /// reach it (when it delivers nothing while behind it, the replica looks into why).
    target: watch::Sender<Revision>,
    /// The read barrier's requests to the stream leader, shared by concurrent reads, and the
    /// stream on the NATS server in this process, which answers them while it leads.
    rounds: barrier::Rounds,
    feed: broadcast::Sender<Arc<RevisionEvents>>,
    /// Which of this process's writes may be in flight together (see `write_locks`).
    locks: WriteLocks,
    /// Writes in flight, found by the replica (`sent.rs`).
    sent: sent::Sent,
    /// Held by a compaction.
    compaction: tokio::sync::Mutex<()>,
    /// `$KV.<stored>.>`: every message of the bucket.
    filter: String,
    /// `KV_<bucket>`.
    stream_name: String,
    /// The stream drops old messages of a key beyond a per-key limit (`revHistory`).
    history_limited: bool,
    /// The servers' longest protocol line (limits a key's subject, `message::check_key`).
    max_control_line: usize,
    slow: Duration,
    /// Set by `close`; shared with the client's event callback.
    closed: Arc<AtomicBool>,
    cluster_id: u64,
    member_id: u64,
    /// The replica, the meta follower, and a copy's or a promoted copy's own tasks.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The `<bucket>-meta` KV revision of each lease record last seen (expiry is conditional
    /// on it: a node that renewed the lease meanwhile wins).
    lease_revs: Mutex<HashMap<LeaseId, u64>>,
    lease_updates: broadcast::Sender<LeaseUpdate>,
    /// Opened to be read only (see [`NatsOptions::read_only`]).
    read_only: bool,
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
    /// Connects, opens (or creates) the bucket, and loads the replica (cost grows with the
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
        if max_payload < options.max_request_bytes && !options.read_only {
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
        let read_only = options.read_only;
        let opened = setup::patiently("open the bucket", || layout::open(&js, cfg, read_only)).await?;
        let role = match &opened.origin {
            Some(origin) if opened.copy => Role::Copy { origin: origin.describe().into() },
            _ => Role::Primary,
        };
        let (feed, _) = broadcast::channel(FEED_CAPACITY);
        let stream_name = origin::stream_name(&cfg.bucket);
        let local = options.local.clone().and_then(|server| LocalStream::bind(server, &client, &stream_name));
        let inner = Arc::new(Inner {
            bucket: cfg.bucket.clone(),
            filter: format!("$KV.{}.>", opened.stored),
            // The same datastore on a copy and its origin.
            cluster_id: hash_id(&format!("kine-rs/{}", opened.stored)),
            stored: opened.stored,
            birth: opened.birth,
            client,
            rounds: barrier::Rounds::new(
                js.clone(),
                stream_name.clone(),
                message::init_subject(&cfg.bucket),
                local,
                opened.copy,
            ),
            js,
            stream_name,
            stream: opened.stream,
            meta: opened.meta,
            role: RwLock::new(role),
            origin: opened.origin,
            replication: Mutex::new(None),
            promotion: tokio::sync::Mutex::new(()),
            table: Mutex::new(MemTable::at(0)),
            values_dir: options.values_dir.clone(),
            message_seqs: Mutex::new(MessageSeqs::default()),
            applied: watch::channel(0).0,
            delivered: watch::channel(0).0,
            applied_at: AtomicI64::new(0),
            current_at_contact: AtomicBool::new(false),
            pending_compaction: watch::channel(-1).0,
            reload_wanted: watch::channel(0).0,
            loads: watch::channel(0).0,
            target: watch::channel(0).0,
            feed,
            locks: WriteLocks::default(),
            sent: sent::Sent::default(),
            compaction: tokio::sync::Mutex::new(()),
            history_limited: opened.info.config.max_messages_per_subject > 0,
            max_control_line: cfg.max_control_line,
            slow: cfg.slow_method,
            closed,
            member_id: kine_core::id::random_nonzero(),
            tasks: Mutex::new(Vec::new()),
            lease_revs: Mutex::new(HashMap::new()),
            lease_updates: broadcast::channel(1024).0,
            read_only,
        });
        let meta_watch = setup::patiently("watch the meta bucket", || async {
            inner.meta.watch_with_history(">").await.context("watch the meta bucket")
        })
        .await?;
        setup::patiently("load the leases", || setup::load_meta(&inner)).await?;
        inner.spawn(meta::follow(inner.clone(), meta_watch));
        let started = Instant::now();
        let (ready, loaded) = tokio::sync::oneshot::channel();
        inner.spawn(replica::replicate(inner.clone(), ready));
        let (revision, messages) = tokio::time::timeout(LOAD_LIMIT, loaded)
            .await
            .map_err(|_| anyhow!("load the bucket into memory: not done within {}s", LOAD_LIMIT.as_secs()))?
            .map_err(|_| anyhow!("load the bucket into memory: stopped"))?;
        tracing::info!(
            bucket = %cfg.bucket,
            revision,
            messages,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "NATS bucket loaded"
        );
        match (&inner.origin, inner.is_copy()) {
            (Some(origin), true) => {
                inner.look_at_mirror(origin).await;
                let r = inner.replication.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(r) = r {
                    tracing::info!(
                        bucket = %cfg.bucket,
                        origin = %r.origin,
                        revision,
                        lag_revisions = r.lag_revisions,
                        lag_seconds = r.lag_seconds,
                        link = if r.link_up { "up" } else { "down" },
                        link_error = r.link_error.as_deref().unwrap_or(""),
                        "serving a read-only copy (writes are refused; etcdctl member promote makes it the primary)"
                    );
                }
                inner.spawn(copy::follow(inner.clone(), origin.clone()));
            }
            // A promoted copy fences its old origin, which is a write.
            (Some(_), false) if !read_only => inner.start_fencing(),
            _ => {}
        }
        if !inner.is_copy() && !read_only {
            inner.spawn(fence::listen_for_fence(inner.clone()));
        }
        Ok(NatsBackend { inner, page_counts: Default::default() })
    }
}

impl Inner {
    fn table(&self) -> std::sync::MutexGuard<'_, MemTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lock order: `table` first, then this.
    fn seqs(&self) -> std::sync::MutexGuard<'_, MessageSeqs> {
        self.message_seqs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn role(&self) -> Role {
        self.role.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn is_copy(&self) -> bool {
        matches!(*self.role.read().unwrap_or_else(|p| p.into_inner()), Role::Copy { .. })
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(tokio::spawn(task));
    }

    /// On a promoted copy: fence its old origin once it can be reached (`promote.rs`).
    fn start_fencing(self: &Arc<Self>) {
        self.spawn(self.clone().keep_fencing());
    }

    /// Refuses a write when the bucket was opened read-only.
    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Unsupported("the NATS bucket was opened read-only (kine-rs inspect or migrate)".into()));
        }
        self.check_open()
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
        Self::wait_for(&self.applied, seq, limit).await
    }

    async fn wait_for(sequence: &watch::Sender<Revision>, seq: Revision, limit: Duration) -> Result<()> {
        if *sequence.borrow() >= seq {
            return Ok(());
        }
        let mut rx = sequence.subscribe();
        match tokio::time::timeout(limit, rx.wait_for(|a| *a >= seq)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Unavailable("etcdserver: server stopped".into())),
            Err(_) => Err(unavailable(format!("the replica did not reach revision {seq} within {limit:?}"))),
        }
    }

    /// Has the replica load the bucket again, and waits until it has.
    async fn reload(&self) -> Result<()> {
        let mut loads = self.loads.subscribe();
        let before = *loads.borrow_and_update();
        self.reload_wanted.send_modify(|r| *r += 1);
        match tokio::time::timeout(LOAD_LIMIT, loads.wait_for(|l| *l > before)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Unavailable("etcdserver: server stopped".into())),
            Err(_) => Err(unavailable("loading the bucket again took too long")),
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
