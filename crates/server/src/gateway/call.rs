//! A gateway request as a gRPC call, in process: the request messages framed as gRPC over an
//! in-memory body into the server's own services (so credentials, permission checks and size
//! limits apply exactly as to a gRPC client), the response frames read back.

use super::routes::Route;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::service::Routes;
use tower_service::Service;

/// One message in gRPC's framing (uncompressed).
fn frame(message: Vec<u8>) -> Bytes {
    let mut out = BytesMut::with_capacity(message.len() + 5);
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(&message);
    out.freeze()
}

/// The next whole message in `buf`, if there is one.
fn unframe(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    buf.advance(5);
    Some(buf.split_to(len).freeze())
}

/// Starts the call: `input` carries the request messages (the request stream ends when it is
/// closed); the answer carries the response messages, then the call's error if it failed. The
/// call ends when the answer's receiver is dropped.
pub async fn start(
    grpc: &Routes,
    route: &Route,
    metadata: Vec<(http::HeaderName, http::HeaderValue)>,
    input: mpsc::Receiver<Vec<u8>>,
) -> mpsc::Receiver<Result<Bytes, Status>> {
    let body =
        StreamBody::new(ReceiverStream::new(input).map(|m| Ok::<_, Infallible>(http_body::Frame::data(frame(m)))));
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(route.grpc_path.as_str())
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers");
    for (name, value) in metadata {
        request = request.header(name, value);
    }
    let (tx, rx) = mpsc::channel(16);
    let request = match request.body(tonic::body::Body::new(body)) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
            return rx;
        }
    };
    let mut svc = grpc.clone();
    let pending = async move {
        let _ = std::future::poll_fn(|cx| Service::<http::Request<tonic::body::Body>>::poll_ready(&mut svc, cx)).await;
        svc.call(request).await
    };
    tokio::spawn(async move {
        let send = tx.clone();
        tokio::select! {
            _ = tx.closed() => {}
            _ = forward(pending, send) => {}
        }
    });
    rx
}

async fn forward<F>(pending: F, tx: mpsc::Sender<Result<Bytes, Status>>)
where
    F: Future<Output = Result<http::Response<tonic::body::Body>, Infallible>>,
{
    let Ok(response) = pending.await;
    // A trailers-only answer: an error before any message.
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != tonic::Code::Ok
    {
        let _ = tx.send(Err(status)).await;
        return;
    }
    let mut body = response.into_body();
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        if let Some(trailers) = frame.trailers_ref() {
            if let Some(status) = Status::from_header_map(trailers)
                && status.code() != tonic::Code::Ok
            {
                let _ = tx.send(Err(status)).await;
            }
            return;
        }
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
            while let Some(message) = unframe(&mut buf) {
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
        }
    }
}
