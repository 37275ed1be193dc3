//! The `--metrics-bind-address` listener (kine's: default `:8080`, `0` disables): Prometheus
//! `/metrics` and etcd's `/health`, over TLS with the server certificate when one is
//! configured (unless `--metrics-ignore-tls-config`). Also the task that keeps the gRPC health
//! service's status in step with the same check.

use anyhow::{Context, Result, bail};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kine_core::alarm::AlarmKind;
use kine_core::health;
use kine_core::metrics::metrics;
use kine_core::shutdown::Shutdown;
use kine_core::store::Store;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How often the gRPC health status is checked again.
const GRPC_HEALTH_EVERY: Duration = Duration::from_secs(5);

/// The address to bind, or `None` when disabled ("0"). kine's ":8080" means every interface.
pub fn address(flag: &str) -> Result<Option<String>> {
    let flag = flag.trim();
    if flag == "0" {
        return Ok(None);
    }
    let address = if flag.is_empty() { ":8080" } else { flag };
    if !address.contains(':') {
        bail!("--metrics-bind-address {flag:?}: expected host:port, :port, or 0 to disable");
    }
    Ok(Some(if address.starts_with(':') { format!("0.0.0.0{address}") } else { address.to_string() }))
}

/// TLS for the listener from the server certificate and key files (PEM).
pub fn tls(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("--server-cert-file {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("--server-key-file {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("--server-cert-file/--server-key-file for the metrics listener")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Binds the listener (a busy port stops start-up, naming the flag).
pub async fn bind(address: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("--metrics-bind-address {address}: cannot listen"))
}

/// Serves until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    store: Arc<Store>,
    mut stop: Shutdown,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.wait() => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics listener: accept failed");
                    continue;
                }
            },
        };
        let (store, tls) = (store.clone(), tls.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(store.clone(), req));
            let http = hyper::server::conn::http1::Builder::new();
            let served = match tls {
                Some(tls) => match tls.accept(stream).await {
                    Ok(s) => http.serve_connection(TokioIo::new(s), service).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "metrics listener: TLS handshake failed");
                        return;
                    }
                },
                None => http.serve_connection(TokioIo::new(stream), service).await,
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "metrics listener: connection failed");
            }
        });
    }
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(store: Arc<Store>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
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
            ("lag", v) => match crate::duration::parse(v) {
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

/// Keeps the gRPC health service's status for "" in step with the health check.
pub async fn follow_grpc_health(store: Arc<Store>, reporter: kine_server::HealthReporter, mut stop: Shutdown) {
    let mut serving = true;
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            _ = tokio::time::sleep(GRPC_HEALTH_EVERY) => {}
        }
        let result = health::check(&store, &[], false, health::LagLimit::default()).await;
        if result.is_ok() != serving {
            serving = result.is_ok();
            let status =
                if serving { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
            match &result {
                Ok(()) => tracing::info!("healthy again: gRPC health is SERVING"),
                Err(reason) => tracing::warn!(reason, "unhealthy: gRPC health is NOT_SERVING"),
            }
            reporter.set_service_status("", status).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn addresses() {
        assert_eq!(super::address(":8080").unwrap().as_deref(), Some("0.0.0.0:8080"));
        assert_eq!(super::address("").unwrap().as_deref(), Some("0.0.0.0:8080"));
        assert_eq!(super::address("127.0.0.1:9").unwrap().as_deref(), Some("127.0.0.1:9"));
        assert_eq!(super::address("0").unwrap(), None);
        assert!(super::address("nowhere").is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(super::json_string("RANGE ERROR:a \"b\"\n"), r#""RANGE ERROR:a \"b\"\n""#);
    }
}
