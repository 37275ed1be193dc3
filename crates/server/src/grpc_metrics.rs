//! etcd's gRPC server metrics (`grpc_server_started_total`, `grpc_server_handled_total`,
//! `grpc_server_handling_seconds`, labelled by type, service, method and code) as a tower layer
//! around every service. An RPC is handled when its response ends: the `grpc-status` of a
//! trailers-only answer, of the trailers, or `Canceled` when the client went away first (a
//! watch stream closed by its client).

use http_body::{Body, Frame};
use kine_core::metrics::metrics;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::codegen::http;

#[derive(Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> tower_layer::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;
    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics { inner }
    }
}

#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

/// An RPC in flight: its labels and start.
struct Call {
    labels: [String; 3],
    started: Instant,
    finished: bool,
}

impl Call {
    fn finish(mut self, code: &str) {
        self.record(code);
    }

    fn record(&mut self, code: &str) {
        self.finished = true;
        let m = metrics();
        let [kind, service, method] = &self.labels;
        m.grpc_handled.with_label_values(&[kind.as_str(), service, method, code]).inc();
        m.grpc_seconds
            .with_label_values(&[kind.as_str(), service, method])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// An RPC dropped before it was answered (the client cancelled while the handler ran, e.g.
/// during a RangeStream's first part) counts as Canceled too.
impl Drop for Call {
    fn drop(&mut self) {
        if !self.finished {
            self.record("Canceled");
        }
    }
}

/// gRPC's code names, as etcd's metrics spell them.
fn code_name(status: &[u8]) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("Unknown")
}

/// The streaming RPCs of the etcd API; everything else is unary.
fn grpc_type(service: &str, method: &str) -> &'static str {
    match (service, method) {
        ("etcdserverpb.Watch", "Watch") | ("etcdserverpb.Lease", "LeaseKeepAlive") => "bidi_stream",
        ("etcdserverpb.Maintenance", "Snapshot")
        | ("etcdserverpb.KV", "RangeStream")
        | ("grpc.health.v1.Health", "Watch") => "server_stream",
        _ => "unary",
    }
}

impl<S, B, ResBody> tower_service::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Observed<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The JSON gateway's requests (and any other HTTP) are not gRPC calls: no labels made
        // from their paths.
        let grpc = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if !grpc {
            let fut = self.inner.call(req);
            return Box::pin(async move { Ok(fut.await?.map(|body| Observed { body, call: None })) });
        }
        // "/etcdserverpb.KV/Range"
        let (service, method) =
            req.uri().path().trim_start_matches('/').split_once('/').unwrap_or(("unknown", "unknown"));
        let kind = grpc_type(service, method);
        metrics().grpc_started.with_label_values(&[kind, service, method]).inc();
        let call = Call {
            labels: [kind.to_string(), service.to_string(), method.to_string()],
            started: Instant::now(),
            finished: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            // A trailers-only answer (an error before any message) carries its status here.
            let call = match resp.headers().get("grpc-status") {
                Some(status) => {
                    call.finish(code_name(status.as_bytes()));
                    None
                }
                None => Some(call),
            };
            Ok(resp.map(|body| Observed { body, call }))
        })
    }
}

/// A response body that reports its RPC handled when its trailers pass (or, through its
/// `Call`, as Canceled when it is dropped first).
pub struct Observed<B> {
    body: B,
    call: Option<Call>,
}

impl<B: Body + Unpin> Body for Observed<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(status) = frame.trailers_ref().and_then(|t| t.get("grpc-status"))
                    && let Some(call) = self.call.take()
                {
                    call.finish(code_name(status.as_bytes()));
                }
            }
            Poll::Ready(None) => {
                if let Some(call) = self.call.take() {
                    call.finish("Unknown");
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn codes_and_types() {
        assert_eq!(super::code_name(b"0"), "OK");
        assert_eq!(super::code_name(b"14"), "Unavailable");
        assert_eq!(super::code_name(b"99"), "Unknown");
        assert_eq!(super::grpc_type("etcdserverpb.Watch", "Watch"), "bidi_stream");
        assert_eq!(super::grpc_type("etcdserverpb.KV", "Range"), "unary");
        assert_eq!(super::grpc_type("etcdserverpb.KV", "RangeStream"), "server_stream");
    }
}
