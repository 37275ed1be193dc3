//! etcd's gRPC-gateway: the JSON API on the client port (HTTP/1.1, and HTTP/2 without the gRPC
//! content type), as etcd 3.6 and 3.7 serve it. Every `POST /v3/…` route of etcd's
//! annotations is served by calling the gRPC method in process (`call`), with the HTTP
//! `Authorization` header (and `Grpc-Metadata-*` headers) as its metadata, so the answers,
//! errors and permission checks are the gRPC ones; `/v3beta/` is the same; `GET /version`
//! answers etcd's versions. Errors: `{"code":N,"message":"…"}` with grpc-gateway's HTTP status
//! for the code. Streams (Watch, LeaseKeepAlive, Snapshot, Observe): one JSON line
//! `{"result":…}` per message, flushed, and `{"error":…}` if the call fails.

pub mod call;
pub mod json;
pub mod routes;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use routes::Route;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::Status;
use tonic::service::Routes;

type Response = http::Response<axum::body::Body>;

pub struct Gateway {
    grpc: Routes,
    routes: HashMap<String, Arc<Route>>,
    /// `/version`'s body.
    version: Vec<u8>,
    /// Bodies larger than this are refused as the gRPC server refuses such a message.
    max_body: usize,
}

/// grpc-gateway's HTTP status for a gRPC code.
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code::*;
    match code {
        Ok => StatusCode::OK,
        Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        InvalidArgument | FailedPrecondition | OutOfRange => StatusCode::BAD_REQUEST,
        DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        NotFound => StatusCode::NOT_FOUND,
        AlreadyExists | Aborted => StatusCode::CONFLICT,
        PermissionDenied => StatusCode::FORBIDDEN,
        ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Unauthenticated => StatusCode::UNAUTHORIZED,
        Unknown | Internal | DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// etcd answers every request with these (its default `--cors=*`).
fn cors(headers: &mut HeaderMap) {
    headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    headers.insert("access-control-allow-methods", HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"));
    headers.insert("access-control-allow-headers", HeaderValue::from_static("accept, content-type, authorization"));
}

fn respond(status: StatusCode, content_type: &'static str, body: impl Into<axum::body::Body>) -> Response {
    let mut r = http::Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    cors(r.headers_mut());
    r
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    respond(status, "application/json", body)
}

/// A failed call, as grpc-gateway answers it.
fn failure(status: &Status) -> Response {
    let mut r = json(http_status(status.code()), json::error(status.code() as i32, status.message()));
    if status.code() == tonic::Code::Unauthenticated
        && let Ok(v) = HeaderValue::from_str(status.message())
    {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// What the call gets as metadata: `Authorization` (etcd reads it as the token's second
/// place) and every `Grpc-Metadata-<name>` header as `<name>`.
fn metadata(headers: &HeaderMap) -> Vec<(http::HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    for (name, value) in headers {
        if name == header::AUTHORIZATION {
            out.push((name.clone(), value.clone()));
        } else if let Some(rest) = name.as_str().strip_prefix("grpc-metadata-")
            && let Ok(name) = http::HeaderName::from_bytes(rest.as_bytes())
            && !matches!(rest, "content-type" | "te")
        {
            out.push((name, value.clone()));
        }
    }
    out
}

impl Gateway {
    /// `grpc` serves the gRPC services the gateway calls.
    pub fn new(grpc: Routes, emulated_version: &str, storage_version: &str, max_body: usize) -> Gateway {
        let pool = prost_reflect::DescriptorPool::decode(kine_proto::FILE_DESCRIPTOR_SET)
            .unwrap_or_else(|e| unreachable!("the descriptors built into kine-proto decode: {e}"));
        // In etcd's order (a Go struct's): etcdserver, etcdcluster, storage.
        let version = format!(
            r#"{{"etcdserver":{},"etcdcluster":{},"storage":{}}}"#,
            serde_json::Value::from(emulated_version),
            serde_json::Value::from(storage_version),
            serde_json::Value::from(storage_version)
        )
        .into_bytes();
        Gateway { grpc, routes: routes::from_descriptors(&pool), version, max_body }
    }

    pub async fn handle(self: Arc<Self>, request: http::Request<axum::body::Body>) -> Response {
        if request.method() == Method::OPTIONS {
            return respond(StatusCode::OK, "text/plain; charset=utf-8", Vec::new());
        }
        let path = request.uri().path();
        if path == "/version" {
            if request.method() != Method::GET {
                let mut r =
                    respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "Method Not Allowed\n");
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET"));
                return r;
            }
            return json(StatusCode::OK, self.version.clone());
        }
        let path = match path.strip_prefix("/v3beta/") {
            Some(rest) => format!("/v3/{rest}"),
            None => path.to_string(),
        };
        let Some(route) = self.routes.get(&path).cloned() else {
            return json(StatusCode::NOT_FOUND, json::error(5, "Not Found"));
        };
        if request.method() != Method::POST {
            return json(StatusCode::NOT_IMPLEMENTED, json::error(12, "Method Not Allowed"));
        }
        let metadata = metadata(request.headers());
        let body = match http_body_util::Limited::new(request.into_body(), self.max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                let text = format!("grpc: received message larger than max (more than {} bytes)", self.max_body);
                return json(StatusCode::TOO_MANY_REQUESTS, json::error(8, &text));
            }
            Err(e) => return json(StatusCode::BAD_REQUEST, json::error(3, &e.to_string())),
        };
        let messages = if route.client_streaming {
            json::requests(&route.input, &body)
        } else {
            json::request(&route.input, &body).map(|m| vec![m])
        };
        let messages = match messages {
            Ok(m) => m,
            Err(e) => return json(StatusCode::BAD_REQUEST, json::error(3, &e)),
        };
        let (tx, rx) = mpsc::channel(messages.len().max(1));
        for m in messages {
            let _ = tx.try_send(m);
        }
        // A Watch stays open after its requests (as etcd's, until the client goes away); every
        // other call's request stream ends here.
        let keep_open = (route.grpc_path == "/etcdserverpb.Watch/Watch").then_some(tx);
        let mut answers = call::start(&self.grpc, &route, metadata, rx).await;
        if !route.server_streaming {
            return match answers.recv().await {
                Some(Ok(message)) => match json::response(&route.output, &message) {
                    Ok(body) => json(StatusCode::OK, body),
                    Err(e) => json(StatusCode::INTERNAL_SERVER_ERROR, json::error(13, &e)),
                },
                Some(Err(status)) => failure(&status),
                None => failure(&Status::unavailable("etcdserver: server stopped")),
            };
        }
        self.stream(route, answers, keep_open).await
    }

    /// A server stream as JSON lines; the first answer decides the HTTP status.
    async fn stream(
        &self,
        route: Arc<Route>,
        mut answers: mpsc::Receiver<Result<Bytes, Status>>,
        keep_open: Option<mpsc::Sender<Vec<u8>>>,
    ) -> Response {
        let line = move |answer: Result<Bytes, Status>| -> Vec<u8> {
            let mut out = match answer {
                Ok(m) => match json::response(&route.output, &m) {
                    Ok(j) => [&b"{\"result\":"[..], &j, b"}"].concat(),
                    Err(e) => [&b"{\"error\":"[..], &json::error(13, &e), b"}"].concat(),
                },
                Err(s) => [&b"{\"error\":"[..], &json::error(s.code() as i32, s.message()), b"}"].concat(),
            };
            out.push(b'\n');
            out
        };
        let first = answers.recv().await;
        let status = match &first {
            Some(Err(s)) => http_status(s.code()),
            _ => StatusCode::OK,
        };
        let Some(first) = first else { return json(StatusCode::OK, Vec::new()) };
        let first_line = line(first);
        let rest = async_stream(answers, keep_open, line);
        let body = axum::body::Body::from_stream(tokio_stream::StreamExt::chain(
            tokio_stream::once(Ok::<_, std::convert::Infallible>(Bytes::from(first_line))),
            rest,
        ));
        respond(status, "application/json", body)
    }
}

/// Anything else: a gRPC call of an unknown service gets gRPC's Unimplemented; any other
/// request etcd's "404 page not found".
pub async fn not_found(request: http::Request<axum::body::Body>) -> Response {
    let grpc =
        request.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        let service = request.uri().path().trim_start_matches('/').split('/').next().unwrap_or_default().to_string();
        return Status::unimplemented(format!("unknown service {service}")).into_http::<axum::body::Body>();
    }
    respond(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "404 page not found\n")
}

/// The remaining answers as lines; `keep_open` (a Watch's request stream) lives as long as the
/// response body, so the watch ends when the client goes away.
fn async_stream(
    answers: mpsc::Receiver<Result<Bytes, Status>>,
    keep_open: Option<mpsc::Sender<Vec<u8>>>,
    line: impl Fn(Result<Bytes, Status>) -> Vec<u8> + Send + 'static,
) -> impl tokio_stream::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(answers), move |a| {
        let _held = &keep_open;
        Ok(Bytes::from(line(a)))
    })
}
