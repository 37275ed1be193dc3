//! `KV.RangeStream` (etcd 3.7): the parts of `kine_core::range_stream` sent as they are read.
//!
//! The first part is read before the RPC answers, so its errors (a compacted or future
//! revision, an outage) are the RPC's own, as in etcd. The rest are read by a task, one part
//! ahead of the client at most (a channel of one): a client that reads slowly holds one part,
//! and one that goes away, or a shutdown, ends the task.

use crate::Context;
use crate::convert;
use crate::error::status;
use kine_core::auth::Caller;
use kine_core::range_stream::Part;
use kine_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tonic::Status;

pub type Parts = tokio_stream::wrappers::ReceiverStream<Result<pb::RangeStreamResponse, Status>>;

pub async fn serve(ctx: &Context, who: &Caller, request: pb::RangeRequest) -> Result<Parts, Status> {
    if !ctx.config.serves_range_stream() {
        // What etcd 3.6, which has no RangeStream, answers (gRPC's text for an unknown method).
        let unknown = "unknown method RangeStream for service etcdserverpb.KV";
        return Err(status(kine_core::Error::Unsupported(unknown.into())));
    }
    let drop_lease = crate::emulation::drops_lease(&request) && ctx.config.keys_only_without_lease();
    let req = convert::range_request(request).map_err(status)?;
    if *who != Caller::Anyone {
        kine_core::validate::range(&req).map_err(status)?;
        ctx.store.auth().check_read(who, &req.range).map_err(status)?;
    }
    let mut parts = ctx.store.range_stream(req, ctx.config.max_request_bytes).map_err(status)?;
    let first = parts.next().await.map_err(status)?;
    let (tx, rx) = mpsc::channel(1);
    let headers = ctx.headers;
    let mut shutdown = ctx.shutdown.clone();
    let active = kine_core::metrics::metrics().range_streams.clone();
    active.inc();
    tokio::spawn(async move {
        let _done = scopeguard(move || active.dec());
        let mut next = first;
        while let Some(part) = next.take() {
            let mut m = message(&headers, part);
            if let Some(r) = m.range_response.as_mut() {
                crate::emulation::range(drop_lease, &mut r.kvs);
            }
            tokio::select! {
                sent = tx.send(Ok(m)) => if sent.is_err() { return },
                _ = shutdown.wait() => return,
            }
            next = match parts.next().await {
                Ok(p) => p,
                Err(e) => {
                    let _ = tx.send(Err(status(e))).await;
                    return;
                }
            };
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A part as etcd sends it: only the last one carries the header, `more` and `count`.
fn message(headers: &convert::Headers, part: Part) -> pb::RangeStreamResponse {
    let (header, more, count) = match part.last {
        Some(last) => (headers.at(last.revision), last.more, last.count),
        None => (None, false, 0),
    };
    pb::RangeStreamResponse {
        range_response: Some(pb::RangeResponse {
            header,
            kvs: part.kvs.into_iter().map(convert::kv).collect(),
            more,
            count,
        }),
    }
}

/// Runs `f` when dropped (the task ends however it ends).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
