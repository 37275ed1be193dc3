//! The `--metrics-bind-address` listener (kine's: default `:8080`, `0` disables): Prometheus
//! `/metrics` and etcd's `/health`, over TLS with the server certificate when one is
//! configured (unless `--metrics-ignore-tls-config`). Also the task that keeps the gRPC health
//! service's status in step with the same check.

use anyhow::{Context, Result, bail};
use hyper_util::rt::TokioIo;
use kine_core::health;
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
    Ok(tokio_rustls::TlsAcceptor::from(crate::tls_config::metrics(cert, key)?))
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
            let service = hyper::service::service_fn(move |req| kine_server::http::handle(store.clone(), req));
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
}
