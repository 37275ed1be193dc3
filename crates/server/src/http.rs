//! The HTTP side of the metrics listener (`--metrics-bind-address`): Prometheus `/metrics` and
//! etcd's `/health` (kine-rs binds the listener and runs hyper's HTTP/1 connections; this
//! answers each request). A crate of its own so that the fuzzer reaches it (`crates/fuzz`).

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use kine_core::alarm::AlarmKind;
use kine_core::health;
use kine_core::metrics::metrics;
use kine_core::store::Store;
use std::sync::Arc;
use std::time::Duration;

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Answers one request (any body: it is not read).
pub async fn handle<B>(store: Arc<Store>, req: Request<B>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path();
    if path != "/metrics" && path != "/health" {
        return Ok(response(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "404 page not found\n".into()));
    }
    if req.method() != Method::GET {
        let mut r =
            response(StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "Method Not Allowed\n".into());
        r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET"));
        return Ok(r);
    }
    Ok(if path == "/metrics" {
        refresh(&store).await;
        response(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", kine_core::metrics::render())
    } else {
        health_response(&store, req.uri().query().unwrap_or_default()).await
    })
}

/// Reads the datastore's gauges (revisions, size, leases) for a scrape; a datastore that does
/// not answer leaves the last values.
async fn refresh(store: &Store) {
    let limit = Duration::from_secs(2);
    let backend = store.backend();
    // Through the metered backend, these calls set the revision and size gauges.
    let _ = tokio::time::timeout(limit, backend.revisions()).await;
    let _ = tokio::time::timeout(limit, backend.status()).await;
    let m = metrics();
    m.leases_alive.set(store.lease_list().len() as i64);
    m.is_learner.set(i64::from(backend.role().is_learner()));
    if let Some(r) = backend.replication() {
        m.copy_lag_revisions.set(r.lag_revisions);
        m.copy_lag_seconds.set(r.lag_seconds);
        m.copy_link_up.set(i64::from(r.link_up));
        m.copy_last_contact_seconds.set(r.last_contact_seconds.unwrap_or(-1.0));
    }
}

/// etcd's `/health`: `{"health":"true","reason":""}` (200), or `"false"` with the reason (503).
/// `?exclude=NOSPACE` ignores that alarm; `?serializable=true` reads without the linearizable
/// barrier. kine-rs's own: on a read-only copy, `?lag=10s` / `?lag_revisions=1000` fail when the
/// copy is further behind its origin than that, or its link is down (400 for a bad value).
async fn health_response(store: &Store, query: &str) -> Response<Full<Bytes>> {
    let mut exclude = Vec::new();
    let mut serializable = false;
    let mut lag = health::LagLimit::default();
    for (name, value) in query.split('&').filter_map(|p| p.split_once('=')) {
        match (name, value) {
            ("exclude", "NOSPACE") => exclude.push(AlarmKind::NoSpace),
            ("exclude", "CORRUPT") => exclude.push(AlarmKind::Corrupt),
            ("serializable", "true") => serializable = true,
            ("lag", v) => match kine_core::duration::parse(v) {
                Ok(d) => lag.seconds = Some(d),
                Err(e) => return bad_request(&format!("lag={v}: {e} (a duration such as 10s)")),
            },
            ("lag_revisions", v) => match v.parse::<i64>() {
                Ok(n) if n >= 0 => lag.revisions = Some(n),
                _ => return bad_request(&format!("lag_revisions={v}: not a whole number of revisions")),
            },
            _ => {}
        }
    }
    match health::check(store, &exclude, serializable, lag).await {
        Ok(()) => {
            metrics().health_success.inc();
            response(StatusCode::OK, "text/plain; charset=utf-8", r#"{"health":"true","reason":""}"#.into())
        }
        Err(reason) => {
            metrics().health_failures.inc();
            tracing::debug!(reason, "health check failed");
            let body = format!("{{\"health\":\"false\",\"reason\":{}}}\n", json_string(&reason));
            response(StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", body)
        }
    }
}

fn bad_request(why: &str) -> Response<Full<Bytes>> {
    response(StatusCode::BAD_REQUEST, "text/plain; charset=utf-8", format!("{why}\n"))
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(super::json_string("RANGE ERROR:a \"b\"\n"), r#""RANGE ERROR:a \"b\"\n""#);
    }
}
