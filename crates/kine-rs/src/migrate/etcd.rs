//! A live etcd (or any etcd v3 server) as a read-only [`Backend`], for `kine-rs migrate --from
//! http(s)://…`: ranges, the history through a watch, the leases and the status over etcd's
//! gRPC API, so that the copy is read and verified exactly as from a kine-rs datastore.
//!
//! What the API does not give is not copied: users and roles (etcd never returns password
//! hashes; `etcdctl snapshot save` and `kine-rs snapshot restore` carry them).

use anyhow::Context;
use kine_core::backend::{AuthRecord, Backend, BackendStatus, Revisions};
use kine_core::request::{RangeRequest, RangeResponse, Revisioned, SortOrder, SortTarget};
use kine_core::txn::{WriteOp, WriteResponse};
use kine_core::{Error, Event, EventKind, KeyRange, LeaseId, Result, Revision, RevisionEvents};
use kine_proto::etcdserverpb as pb;
use pb::watch_request::RequestUnion;
use std::time::Duration;
use tokio::sync::broadcast;
use tonic::transport::Channel;

/// Responses up to this size (a page of large objects).
const MAX_MESSAGE: usize = 256 << 20;
/// A watch that delivers nothing for this long while history is missing has stalled.
const STALL: Duration = Duration::from_secs(30);

pub struct EtcdSource {
    channel: Channel,
    cluster_id: u64,
    member_id: u64,
    /// The watch the last `events` call read from, kept for the next window: etcd sends a
    /// watcher from an old revision everything up to its current revision, so a watch per
    /// window would read the rest of the history again each time.
    history: tokio::sync::Mutex<Option<History>>,
}

/// A watch over the history, and what it delivered past the last window.
struct History {
    range: KeyRange,
    /// The first revision not yet returned.
    next: Revision,
    pending: std::collections::VecDeque<RevisionEvents>,
    stream: tonic::Streaming<pb::WatchResponse>,
}

fn status(e: tonic::Status) -> Error {
    Error::Unavailable(format!("etcd: {}", e.message()))
}

impl EtcdSource {
    /// Connects to `url` (`http://host:port` or `https://…` with the TLS flags' files).
    pub async fn connect(url: &str, tls: Option<tonic::transport::ClientTlsConfig>) -> anyhow::Result<EtcdSource> {
        let mut endpoint = Channel::from_shared(url.to_string())
            .with_context(|| format!("{url} is not a URL"))?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).context("TLS")?;
        }
        let channel = endpoint.connect().await.with_context(|| format!("connect to {url}"))?;
        let mut source = EtcdSource { channel, cluster_id: 0, member_id: 0, history: tokio::sync::Mutex::new(None) };
        let header = source.kv().range(all_count()).await.map_err(|e| anyhow::anyhow!("{}", status(e)))?;
        let header = header.into_inner().header.unwrap_or_default();
        (source.cluster_id, source.member_id) = (header.cluster_id, header.member_id);
        Ok(source)
    }

    fn kv(&self) -> pb::kv_client::KvClient<Channel> {
        pb::kv_client::KvClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE)
    }

    fn lease(&self) -> pb::lease_client::LeaseClient<Channel> {
        pb::lease_client::LeaseClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE)
    }

    /// The compact revision: a watch from revision 1 is cancelled with it (-1: never compacted).
    async fn compacted(&self) -> Result<Revision> {
        let create = pb::WatchCreateRequest { key: vec![0], start_revision: 1, ..Default::default() };
        let mut responses = self.watch(create).await?;
        loop {
            match tokio::time::timeout(Duration::from_millis(500), responses.message()).await {
                Ok(Ok(Some(r))) if r.compact_revision > 0 => return Ok(r.compact_revision),
                Ok(Ok(Some(r))) if r.canceled => return Ok(-1),
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) | Err(_) => return Ok(-1),
                Ok(Err(e)) => return Err(status(e)),
            }
        }
    }

    async fn watch(&self, create: pb::WatchCreateRequest) -> Result<tonic::Streaming<pb::WatchResponse>> {
        let request = pb::WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) };
        // The request stream stays open (ending it would end the watch).
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(request).await.map_err(|_| Error::Unavailable("etcd: watch".into()))?;
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut client =
            pb::watch_client::WatchClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE);
        let stream = client.watch(requests).await.map_err(status)?.into_inner();
        // Keep the sender alive as long as the stream.
        tokio::spawn(async move {
            tx.closed().await;
        });
        Ok(stream)
    }
}

fn all_count() -> pb::RangeRequest {
    pb::RangeRequest { key: vec![0], range_end: vec![0], count_only: true, ..Default::default() }
}

fn range_request(req: &RangeRequest) -> pb::RangeRequest {
    let (key, range_end) = req.range.etcd_parts();
    pb::RangeRequest {
        key,
        range_end,
        limit: req.limit,
        revision: req.revision,
        sort_order: match req.sort_order {
            SortOrder::None => 0,
            SortOrder::Ascend => 1,
            SortOrder::Descend => 2,
        },
        sort_target: match req.sort_target {
            SortTarget::Key => 0,
            SortTarget::Version => 1,
            SortTarget::Create => 2,
            SortTarget::Mod => 3,
            SortTarget::Value => 4,
        },
        serializable: req.serializable,
        keys_only: req.keys_only,
        count_only: req.count_only,
        min_mod_revision: req.min_mod_revision,
        max_mod_revision: req.max_mod_revision,
        min_create_revision: req.min_create_revision,
        max_create_revision: req.max_create_revision,
    }
}

fn read_only() -> Error {
    Error::ReadOnly("migrate reads etcd only".into())
}

#[async_trait::async_trait]
impl Backend for EtcdSource {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.member_id
    }

    async fn revisions(&self) -> Result<Revisions> {
        let resp = self.kv().range(all_count()).await.map_err(status)?.into_inner();
        let current = resp.header.map_or(1, |h| h.revision);
        Ok(Revisions { current, compacted: self.compacted().await? })
    }

    async fn range(&self, req: RangeRequest) -> Result<Revisioned<RangeResponse>> {
        let resp = self.kv().range(range_request(&req)).await.map_err(|e| {
            if e.message().contains("required revision has been compacted") {
                Error::Compacted { compact_revision: 0 }
            } else if e.message().contains("required revision is a future revision") {
                Error::FutureRevision
            } else {
                status(e)
            }
        })?;
        let resp = resp.into_inner();
        Ok(Revisioned {
            revision: resp.header.map_or(0, |h| h.revision),
            value: RangeResponse {
                kvs: resp.kvs.into_iter().map(kine_server::kv_from_proto).collect(),
                more: resp.more,
                count: resp.count,
            },
        })
    }

    async fn write(&self, _: WriteOp) -> Result<Revisioned<WriteResponse>> {
        Err(read_only())
    }

    async fn compact(&self, _: Revision) -> Result<Revision> {
        Err(read_only())
    }

    /// Through a watch from `after + 1` (the previous call's, when it ended at `after`), until
    /// the revision `until` has come (every revision of etcd's holds a change).
    async fn events(&self, range: &KeyRange, after: Revision, until: Revision) -> Result<Vec<RevisionEvents>> {
        let mut out: Vec<RevisionEvents> = Vec::new();
        if after >= until {
            return Ok(out);
        }
        let mut cached = self.history.lock().await;
        // Taken out while reading: an error leaves no watch behind.
        let mut h = match cached.take() {
            Some(h) if h.range == *range && h.next == after + 1 => h,
            _ => {
                let (key, range_end) = range.etcd_parts();
                let create = pb::WatchCreateRequest { key, range_end, start_revision: after + 1, ..Default::default() };
                let stream = self.watch(create).await?;
                History { range: range.clone(), next: after + 1, pending: Default::default(), stream }
            }
        };
        read_until(&mut h, &mut out, until).await?;
        h.next = until + 1;
        *cached = Some(h);
        Ok(out)
    }

    fn subscribe(&self) -> broadcast::Receiver<std::sync::Arc<RevisionEvents>> {
        broadcast::channel(1).1
    }

    async fn leases(&self) -> Result<Vec<(LeaseId, i64)>> {
        let ids = self.lease().lease_leases(pb::LeaseLeasesRequest {}).await.map_err(status)?.into_inner().leases;
        let mut out = Vec::with_capacity(ids.len());
        for l in ids {
            let ttl = self.lease().lease_time_to_live(pb::LeaseTimeToLiveRequest { id: l.id, keys: false }).await;
            match ttl.map_err(status)?.into_inner() {
                // Expired meanwhile (TTL -1): not copied.
                t if t.ttl < 0 => {}
                t => out.push((l.id, t.granted_ttl)),
            }
        }
        out.sort();
        Ok(out)
    }

    async fn lease_keys(&self, id: LeaseId) -> Result<Vec<Vec<u8>>> {
        let t = self.lease().lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: true }).await;
        Ok(t.map_err(status)?.into_inner().keys)
    }

    async fn status(&self) -> Result<BackendStatus> {
        let mut client = pb::maintenance_client::MaintenanceClient::new(self.channel.clone());
        let s = client.status(pb::StatusRequest {}).await.map_err(status)?.into_inner();
        Ok(BackendStatus { db_size: s.db_size, db_size_in_use: s.db_size_in_use })
    }

    async fn defragment(&self) -> Result<()> {
        Err(read_only())
    }

    async fn close(&self) {}

    async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        Ok(None)
    }

    async fn auth_replace(&self, _: Option<u64>, _: Vec<u8>) -> Result<bool> {
        Err(read_only())
    }
}

/// Moves the revisions up to `until` from the watch into `out`, keeping later ones pending.
async fn read_until(h: &mut History, out: &mut Vec<RevisionEvents>, until: Revision) -> Result<()> {
    loop {
        while h.pending.front().is_some_and(|r| r.revision <= until) {
            out.extend(h.pending.pop_front());
        }
        if out.last().is_some_and(|r| r.revision >= until) || !h.pending.is_empty() {
            // etcd never splits one revision's events over two responses (no fragmenting).
            return Ok(());
        }
        let r = match tokio::time::timeout(STALL, h.stream.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return Err(Error::Unavailable("etcd ended the watch".into())),
            Ok(Err(e)) => return Err(status(e)),
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "etcd's watch from revision {} delivered nothing for {STALL:?}",
                    out.last().map_or(h.next, |r| r.revision + 1)
                )));
            }
        };
        if r.compact_revision > 0 {
            return Err(Error::Compacted { compact_revision: r.compact_revision });
        }
        if r.canceled {
            return Err(Error::Unavailable(format!("etcd cancelled the watch: {}", r.cancel_reason)));
        }
        for e in r.events {
            let kv = kine_server::kv_from_proto(e.kv.unwrap_or_default());
            let kind = if e.r#type == 1 { EventKind::Delete } else { EventKind::Put };
            let event = Event { kind, kv, prev_kv: None };
            match h.pending.back_mut() {
                Some(last) if last.revision == event.kv.mod_revision => last.events.push(event),
                _ => h.pending.push_back(RevisionEvents { revision: event.kv.mod_revision, events: vec![event] }),
            }
        }
    }
}
