//! Sending one request to a server and reducing the answer to what must be equal between etcd
//! and kine-rs: every field, except the ids that name a cluster or member (only whether they are
//! set), raft terms (kine-rs has no raft), and lease time left (it depends on the clock).

use super::requests::Op;
use super::revisions::Renaming;
use kine_proto::etcdserverpb as pb;
use kine_proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient, watch_client::WatchClient,
};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

/// What an answer is compared by.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Range(pb::RangeResponse),
    /// Every part, and the error that ended the stream after them, if one did.
    RangeStream(Vec<pb::RangeResponse>, Option<(i32, String)>),
    Put(pb::PutResponse),
    Delete(pb::DeleteRangeResponse),
    Txn(pb::TxnResponse),
    Compact(pb::CompactionResponse),
    LeaseGrant(pb::LeaseGrantResponse),
    LeaseRevoke(pb::LeaseRevokeResponse),
    LeaseTimeToLive(pb::LeaseTimeToLiveResponse),
    Leases(pb::LeaseLeasesResponse),
    HashKv(pb::HashKvResponse),
    Alarm(pb::AlarmResponse),
    Watch(Vec<pb::WatchResponse>),
    /// gRPC code and message.
    Error(i32, String),
}

impl Outcome {
    /// The store revision the answer reports, if any.
    pub fn revision(&self) -> Option<i64> {
        let header = match self {
            Outcome::Range(r) => &r.header,
            Outcome::Put(r) => &r.header,
            Outcome::Delete(r) => &r.header,
            Outcome::Txn(r) => &r.header,
            Outcome::Compact(r) => &r.header,
            Outcome::LeaseGrant(r) => &r.header,
            Outcome::LeaseRevoke(r) => &r.header,
            Outcome::LeaseTimeToLive(r) => &r.header,
            Outcome::Leases(r) => &r.header,
            Outcome::HashKv(r) => &r.header,
            Outcome::Alarm(r) => &r.header,
            // The last part has the header.
            Outcome::RangeStream(parts, _) => return parts.last()?.header.as_ref().map(|h| h.revision),
            Outcome::Watch(_) | Outcome::Error(..) => return None,
        };
        header.as_ref().map(|h| h.revision)
    }
}

fn header(h: &mut Option<pb::ResponseHeader>) {
    if let Some(h) = h {
        h.cluster_id = (h.cluster_id != 0) as u64;
        h.member_id = (h.member_id != 0) as u64;
        h.raft_term = 0;
    }
}

fn txn(t: &mut pb::TxnResponse) {
    use pb::response_op::Response;
    header(&mut t.header);
    for r in &mut t.responses {
        match &mut r.response {
            Some(Response::ResponseRange(x)) => header(&mut x.header),
            Some(Response::ResponsePut(x)) => header(&mut x.header),
            Some(Response::ResponseDeleteRange(x)) => header(&mut x.header),
            Some(Response::ResponseTxn(x)) => txn(x),
            None => {}
        }
    }
}

pub fn watch_response(mut w: pb::WatchResponse) -> pb::WatchResponse {
    header(&mut w.header);
    w
}

/// A watch stream opened by a `Watch` request.
pub struct OpenWatch {
    requests: mpsc::Sender<pb::WatchRequest>,
    stream: Streaming<pb::WatchResponse>,
    start_revision: i64,
    /// The create was refused or the watch cancelled.
    ended: bool,
    /// Its events, flattened, and how it ended.
    seen: Vec<String>,
}

/// One server: its clients, and the watch streams opened on it.
pub struct Side {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
    channel: Channel,
    pub watches: Vec<OpenWatch>,
}

impl Side {
    pub async fn connect(url: &str) -> Side {
        let channel = Channel::from_shared(url.to_string()).unwrap().connect().await.expect("connect");
        Side {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            maintenance: MaintenanceClient::new(channel.clone()),
            channel,
            watches: Vec::new(),
        }
    }

    pub async fn run(&mut self, op: &Op) -> Outcome {
        let out = match op.clone() {
            Op::Range(r) => self.kv.range(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                Outcome::Range(r)
            }),
            Op::RangeStream(r) => return self.range_stream(r).await,
            Op::Put(r) => self.kv.put(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                Outcome::Put(r)
            }),
            Op::Delete(r) => self.kv.delete_range(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                Outcome::Delete(r)
            }),
            Op::Txn(r) => self.kv.txn(r).await.map(|r| {
                let mut r = r.into_inner();
                txn(&mut r);
                Outcome::Txn(r)
            }),
            Op::Compact(r) => self.kv.compact(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                Outcome::Compact(r)
            }),
            Op::LeaseGrant(r) => self.lease.lease_grant(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                Outcome::LeaseGrant(r)
            }),
            Op::LeaseRevoke(r) => self.lease.lease_revoke(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                Outcome::LeaseRevoke(r)
            }),
            Op::LeaseTimeToLive(r) => self.lease.lease_time_to_live(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                // Time left depends on the clock; whether the lease exists does not.
                r.ttl = r.ttl.signum();
                r.keys.sort();
                Outcome::LeaseTimeToLive(r)
            }),
            Op::LeaseLeases => self.lease.lease_leases(pb::LeaseLeasesRequest {}).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                r.leases.sort_by_key(|l| l.id);
                Outcome::Leases(r)
            }),
            Op::HashKv(r) => self.maintenance.hash_kv(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                r.hash = 0;
                Outcome::HashKv(r)
            }),
            Op::Alarm(r) => self.maintenance.alarm(r).await.map(|r| {
                let mut r = r.into_inner();
                header(&mut r.header);
                r.alarms.sort_by_key(|a| (a.member_id, a.alarm));
                Outcome::Alarm(r)
            }),
            Op::Watch(create) => return self.watch(create).await,
        };
        out.unwrap_or_else(|s| Outcome::Error(s.code() as i32, s.message().to_string()))
    }

    async fn range_stream(&mut self, r: pb::RangeRequest) -> Outcome {
        let mut stream = match self.kv.range_stream(r).await {
            Ok(s) => s.into_inner(),
            Err(s) => return Outcome::Error(s.code() as i32, s.message().to_string()),
        };
        let mut parts = Vec::new();
        let end = loop {
            match stream.message().await {
                Ok(Some(m)) => {
                    let mut r = m.range_response.unwrap_or_default();
                    header(&mut r.header);
                    parts.push(r);
                }
                Ok(None) => break None,
                Err(s) => break Some((s.code() as i32, s.message().to_string())),
            }
        };
        match (parts.is_empty(), end) {
            // Refused before any part: however the server sent the refusal, it is the RPC's.
            (true, Some((code, message))) => Outcome::Error(code, message),
            (_, end) => Outcome::RangeStream(parts, end),
        }
    }

    /// Opens a watch on a stream of its own; the answer is the response to the create.
    async fn watch(&mut self, create: pb::WatchCreateRequest) -> Outcome {
        let start_revision = create.start_revision;
        let (tx, rx) = mpsc::channel(16);
        let request = pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)) };
        tx.send(request).await.unwrap();
        let mut client = WatchClient::new(self.channel.clone());
        let mut stream = match client.watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await {
            Ok(s) => s.into_inner(),
            Err(s) => return Outcome::Error(s.code() as i32, s.message().to_string()),
        };
        let first = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
        let (out, ended) = match first {
            Ok(Ok(Some(r))) => {
                let ended = r.canceled;
                (Outcome::Watch(vec![watch_response(r)]), ended)
            }
            Ok(Ok(None)) => (Outcome::Error(-1, "watch stream ended".into()), true),
            Ok(Err(s)) => (Outcome::Error(s.code() as i32, s.message().to_string()), true),
            Err(_) => (Outcome::Error(-1, "no answer to a watch create".into()), true),
        };
        self.watches.push(OpenWatch { requests: tx, stream, start_revision, ended, seen: Vec::new() });
        out
    }

    /// Reads watch `i` until it is synced at `last` (it answered a progress request, asked
    /// again every 100 ms: etcd drops one that comes while a watch is still catching up) or
    /// cancelled, keeping its events. A watch whose start revision is still ahead gets no
    /// progress answer from etcd: it is given 300 ms to (not) deliver anything.
    pub async fn sync_watch(&mut self, i: usize, last: i64, renaming: Option<&Renaming>) {
        let w = &mut self.watches[i];
        if w.ended {
            return;
        }
        let ahead = w.start_revision > last;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(if ahead { 0 } else { 10 });
        let quiet = if ahead { Duration::from_millis(300) } else { Duration::from_millis(100) };
        loop {
            if !ahead {
                let progress = pb::WatchRequest {
                    request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(Default::default())),
                };
                let _ = w.requests.send(progress).await;
            }
            let r = match tokio::time::timeout(quiet, w.stream.message()).await {
                Ok(Ok(Some(r))) => {
                    let mut r = watch_response(r);
                    if let Some(renaming) = renaming {
                        renaming.watch(&mut r);
                    }
                    r
                }
                Ok(Ok(None)) => {
                    w.seen.push("stream ended".into());
                    w.ended = true;
                    return;
                }
                Ok(Err(s)) => {
                    w.seen.push(format!("error {:?} {}", s.code(), s.message()));
                    w.ended = true;
                    return;
                }
                Err(_) if tokio::time::Instant::now() < deadline => continue,
                Err(_) if ahead => return,
                Err(_) => {
                    w.seen.push("no progress answer within 10 s".into());
                    w.ended = true;
                    return;
                }
            };
            for e in &r.events {
                w.seen.push(format!("{e:?}"));
            }
            if r.canceled {
                w.seen.push(format!(
                    "canceled compact_revision={} reason={:?} revision={}",
                    r.compact_revision,
                    r.cancel_reason,
                    r.header.as_ref().map_or(-1, |h| h.revision)
                ));
                w.ended = true;
                return;
            }
            let is_progress = r.events.is_empty() && !r.created;
            if is_progress && r.header.as_ref().is_some_and(|h| h.revision >= last) {
                return;
            }
        }
    }

    /// Everything watch `i` delivered, once synced at `last`.
    pub async fn drain_watch(&mut self, i: usize, last: i64, renaming: Option<&Renaming>) -> Vec<String> {
        self.sync_watch(i, last, renaming).await;
        std::mem::take(&mut self.watches[i].seen)
    }
}
