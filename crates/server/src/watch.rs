//! The etcd Watch service: decodes the client stream into core watch requests, runs one core
//! watch session per stream, and encodes (and, when asked, fragments) its responses.

use crate::Context;
use crate::convert;
use crate::credentials::Credentials;
use crate::error::status;
use kine_core::KeyRange;
use kine_core::watch::{WatchCreate, WatchRequest, WatchResponse};
use kine_proto::etcdserverpb as pb;
use prost::Message;
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub struct WatchService(pub Context);

type Out = mpsc::Sender<Result<pb::WatchResponse, Status>>;

#[tonic::async_trait]
impl pb::watch_server::Watch for WatchService {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let credentials = Credentials::of(&self.0, &request);
        let mut inbound = request.into_inner();
        let (req_tx, req_rx) = mpsc::channel::<WatchRequest>(64);
        let (resp_tx, mut resp_rx) = mpsc::channel::<WatchResponse>(64);
        let (out_tx, out_rx) = mpsc::channel(64);
        let ctx = self.0.clone();
        ctx.store.watch(req_rx, resp_tx, ctx.shutdown.clone());

        // Inbound: client requests → session. Ends when the client half-closes or errs, which
        // drops `req_tx` and so ends the session.
        let reject_tx = out_tx.clone();
        let headers = ctx.headers;
        let mut shutdown = ctx.shutdown.clone();
        let checks = ctx.clone();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = shutdown.wait() => return,
                    msg = inbound.next() => msg,
                };
                let Some(Ok(msg)) = msg else { return };
                match decode(msg) {
                    Ok(Some(WatchRequest::Create(c))) if checks.store.auth().enabled() => {
                        let resp = permitted(&checks, &credentials, &c.range).await.err();
                        let sent = match resp {
                            None => req_tx.send(WatchRequest::Create(c)).await.is_ok(),
                            Some(resp) => reject_tx.send(Ok(resp)).await.is_ok(),
                        };
                        if !sent {
                            return;
                        }
                    }
                    Ok(Some(req)) => {
                        if req_tx.send(req).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {}
                    Err(reason) => {
                        let resp = pb::WatchResponse {
                            header: headers.at(0),
                            watch_id: -1,
                            created: true,
                            canceled: true,
                            cancel_reason: reason,
                            ..Default::default()
                        };
                        if reject_tx.send(Ok(resp)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });

        // Outbound: session responses → client.
        let max_bytes = ctx.config.max_request_bytes;
        tokio::spawn(async move {
            while let Some(resp) = resp_rx.recv().await {
                if send(&out_tx, encode(&ctx, resp), max_bytes).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }
}

/// etcd's check of a new watch: read permission on its range, by the stream's credentials (a
/// token that expired since the stream opened fails here). A refusal is a canceled watch with
/// id -1 and the whole gRPC error as its reason.
async fn permitted(ctx: &Context, credentials: &Credentials, range: &KeyRange) -> Result<(), pb::WatchResponse> {
    let checked = credentials.caller(ctx).and_then(|who| ctx.store.auth().check_read(&who, range).map_err(status));
    let Err(e) = checked else { return Ok(()) };
    let revision = ctx.store.current_revision().await.unwrap_or_default();
    Err(pb::WatchResponse {
        header: ctx.headers.at(revision),
        watch_id: -1,
        created: true,
        canceled: true,
        cancel_reason: format!("rpc error: code = {:?} desc = {}", e.code(), e.message()),
        ..Default::default()
    })
}

/// `Ok(None)` for messages etcd ignores (an empty request union).
fn decode(msg: pb::WatchRequest) -> Result<Option<WatchRequest>, String> {
    use pb::watch_request::RequestUnion;
    Ok(match msg.request_union {
        Some(RequestUnion::CreateRequest(c)) => {
            let (mut no_put, mut no_delete) = (false, false);
            for f in &c.filters {
                match pb::watch_create_request::FilterType::try_from(*f) {
                    Ok(pb::watch_create_request::FilterType::Noput) => no_put = true,
                    Ok(pb::watch_create_request::FilterType::Nodelete) => no_delete = true,
                    Err(_) => return Err(format!("etcdserver: unknown watch filter {f}")),
                }
            }
            // As etcd: an empty key means the smallest key, "\0".
            let key = if c.key.is_empty() { vec![0] } else { c.key };
            Some(WatchRequest::Create(WatchCreate {
                watch_id: c.watch_id,
                range: KeyRange::from_etcd(key, c.range_end),
                start_revision: c.start_revision,
                prev_kv: c.prev_kv,
                progress_notify: c.progress_notify,
                no_put,
                no_delete,
                fragment: c.fragment,
            }))
        }
        Some(RequestUnion::CancelRequest(c)) => Some(WatchRequest::Cancel(c.watch_id)),
        Some(RequestUnion::ProgressRequest(_)) => Some(WatchRequest::Progress),
        None => {
            tracing::debug!("ignoring a watch request with no request union");
            None
        }
    })
}

/// The encoded response and whether the watch asked for fragmentation.
fn encode(ctx: &Context, resp: WatchResponse) -> (pb::WatchResponse, bool) {
    let h = |rev| ctx.headers.at(rev);
    match resp {
        WatchResponse::Created { watch_id, revision } => {
            (pb::WatchResponse { header: h(revision), watch_id, created: true, ..Default::default() }, false)
        }
        WatchResponse::Rejected { watch_id, revision, reason } => (
            pb::WatchResponse {
                header: h(revision),
                watch_id,
                created: true,
                canceled: true,
                cancel_reason: reason,
                ..Default::default()
            },
            false,
        ),
        WatchResponse::Events { watch_id, revision, events, fragment } => (
            pb::WatchResponse {
                header: h(revision),
                watch_id,
                events: events.into_iter().map(convert::event).collect(),
                ..Default::default()
            },
            fragment,
        ),
        WatchResponse::Progress { watch_id, revision } => {
            (pb::WatchResponse { header: h(revision), watch_id, ..Default::default() }, false)
        }
        WatchResponse::Canceled { watch_id, revision, compact_revision, reason } => (
            pb::WatchResponse {
                header: h(revision),
                watch_id,
                canceled: true,
                compact_revision,
                cancel_reason: reason,
                ..Default::default()
            },
            false,
        ),
    }
}

/// Sends a response, split into fragments of at most `max_bytes` when the watch asked for it
/// (as etcd: only responses with two or more events are split).
async fn send(out: &Out, (resp, fragment): (pb::WatchResponse, bool), max_bytes: usize) -> Result<(), ()> {
    if !fragment || resp.events.len() < 2 || resp.encoded_len() < max_bytes {
        return out.send(Ok(resp)).await.map_err(|_| ());
    }
    let mut template = resp.clone();
    template.events.clear();
    let base = template.encoded_len();
    let mut chunk: Vec<kine_proto::mvccpb::Event> = Vec::new();
    let mut size = base;
    let total = resp.events.len();
    for (i, ev) in resp.events.into_iter().enumerate() {
        let ev_size = prost::encoding::message::encoded_len(11, &ev);
        if !chunk.is_empty() && size + ev_size >= max_bytes {
            let part = pb::WatchResponse { events: std::mem::take(&mut chunk), fragment: true, ..template.clone() };
            out.send(Ok(part)).await.map_err(|_| ())?;
            size = base;
        }
        size += ev_size;
        chunk.push(ev);
        if i + 1 == total {
            let last = pb::WatchResponse { events: std::mem::take(&mut chunk), fragment: false, ..template.clone() };
            out.send(Ok(last)).await.map_err(|_| ())?;
        }
    }
    Ok(())
}
