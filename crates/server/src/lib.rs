//! kine-rs gRPC layer: the etcd v3 services over a [`kine_core::store::Store`].
//!
//! The only crate that knows the protobuf types; the only place that builds a `tonic::Status`
//! ([`error`]). It knows no datastore.

mod auth;
mod budget;
mod cluster;
mod convert;
/// etcd's mvccpb.KeyValue to and from the core's (also the records of etcd's `key` bucket).
pub use convert::{kv as kv_to_proto, kv_from_proto};
mod credentials;
mod election;
mod emulation;
pub mod error;
mod gateway;
mod grpc_metrics;
pub mod http;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod range_stream;
mod snapshot;
pub mod tls;
mod watch;

use kine_core::shutdown::Shutdown;
use kine_core::store::Store;
use kine_proto::etcdserverpb as pb;
use std::sync::Arc;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

/// etcd's gRPC allowance on top of `--max-request-bytes`.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// An etcd version (`MAJOR.MINOR.PATCH`), as `--emulated-etcd-version` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EtcdVersion(pub u32, pub u32, pub u32);

impl EtcdVersion {
    pub fn parse(text: &str) -> Option<EtcdVersion> {
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        let v = EtcdVersion(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Writes larger than this are rejected with "etcdserver: request is too large".
    pub max_request_bytes: usize,
    /// Reported by Maintenance.Status; kube-apiserver enables features by it.
    pub emulated_version: String,
    /// Client certificates are verified: with auth enabled, a request without a token comes
    /// from the user its certificate's common name names (etcd's `--client-cert-auth`).
    pub client_cert_auth: bool,
    /// Maintenance.Snapshot writes this format (etcd's bbolt file) instead of kine-rs's own.
    pub snapshot_format: Option<Arc<dyn kine_core::snapshot::Format>>,
}

impl ServerConfig {
    pub(crate) fn version(&self) -> EtcdVersion {
        EtcdVersion::parse(&self.emulated_version).unwrap_or(EtcdVersion(3, 7, 0))
    }

    /// etcd 3.7's RangeStream is served when emulating 3.7 or newer.
    pub fn serves_range_stream(&self) -> bool {
        self.version() >= EtcdVersion(3, 7, 0)
    }

    /// etcd 3.7 answers keys-only ranges with lease 0 (`emulation`).
    pub fn keys_only_without_lease(&self) -> bool {
        self.version() >= EtcdVersion(3, 7, 0)
    }

    /// etcd 3.7 checks a Txn put's lease before its key (`emulation::lease_first`).
    pub fn txn_checks_lease_first(&self) -> bool {
        self.version() >= EtcdVersion(3, 7, 0)
    }

    /// `storageVersion` of Status: etcd reports its cluster's `MAJOR.MINOR.0`.
    pub fn storage_version(&self) -> String {
        let EtcdVersion(major, minor, _) = self.version();
        format!("{major}.{minor}.0")
    }
}

/// The standard gRPC health service (`grpc.health.v1.Health`): SERVING for service "" while
/// this node can serve reads, NOT_SERVING otherwise (set by the caller's health checks).
pub type HealthReporter = tonic_health::server::HealthReporter;

/// What every service needs.
#[derive(Clone)]
pub struct Context {
    store: Arc<Store>,
    headers: convert::Headers,
    config: Arc<ServerConfig>,
    shutdown: Shutdown,
}

pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Serves the etcd API on `listener` until `shutdown` fires, then stops accepting, ends every
/// stream and returns once in-flight requests are done.
pub async fn serve(
    store: Arc<Store>,
    config: ServerConfig,
    listener: Listener,
    tls: Option<Tls>,
    health: HealthReporter,
    shutdown: Shutdown,
) -> Result<(), tonic::transport::Error> {
    let backend = store.backend().clone();
    let max_decode = config.max_request_bytes + GRPC_OVERHEAD_BYTES;
    let ctx = Context {
        store,
        headers: convert::Headers { cluster_id: backend.cluster_id(), member_id: backend.member_id() },
        config: Arc::new(config),
        shutdown: shutdown.clone(),
    };
    let builder = Server::builder();
    let health_service = tonic_health::pb::health_server::HealthServer::new(
        tonic_health::server::HealthService::from_health_reporter(health),
    );
    let grpc = tonic::service::Routes::new(health_service)
        .add_service(pb::kv_server::KvServer::new(kv::KvService(ctx.clone())).max_decoding_message_size(max_decode))
        .add_service(
            pb::watch_server::WatchServer::new(watch::WatchService(ctx.clone())).max_decoding_message_size(max_decode),
        )
        .add_service(
            pb::lease_server::LeaseServer::new(lease::LeaseService(ctx.clone())).max_decoding_message_size(max_decode),
        )
        .add_service(
            pb::maintenance_server::MaintenanceServer::new(maintenance::MaintenanceService(ctx.clone()))
                .max_decoding_message_size(max_decode),
        )
        .add_service(
            pb::cluster_server::ClusterServer::new(cluster::ClusterService(ctx.clone()))
                .max_decoding_message_size(max_decode),
        )
        .add_service(
            pb::auth_server::AuthServer::new(auth::AuthService(ctx.clone())).max_decoding_message_size(max_decode),
        )
        .add_service(
            kine_proto::v3lockpb::lock_server::LockServer::new(lock::LockService(ctx.clone()))
                .max_decoding_message_size(max_decode),
        )
        .add_service(
            kine_proto::v3electionpb::election_server::ElectionServer::new(election::ElectionService(ctx.clone()))
                .max_decoding_message_size(max_decode),
        );
    let gateway = Arc::new(gateway::Gateway::new(
        grpc.clone(),
        &ctx.config.emulated_version,
        &ctx.config.storage_version(),
        max_decode,
    ));
    let handler = move |request: axum::extract::Request| gateway.clone().handle(request);
    let served = grpc
        .into_axum_router()
        .route("/v3/{*rest}", axum::routing::any(handler.clone()))
        .route("/v3beta/{*rest}", axum::routing::any(handler.clone()))
        .route("/version", axum::routing::any(handler))
        .fallback(gateway::not_found);
    // HTTP/1.1 too, for the JSON gateway (gRPC needs HTTP/2).
    let router = builder
        .accept_http1(true)
        .layer(grpc_metrics::GrpcMetricsLayer)
        .layer(budget::RequestBudgetLayer)
        .add_routes(served.into());
    let mut stop = shutdown;
    let signal = async move { stop.wait().await };
    match (listener, tls) {
        (Listener::Tcp(l), None) => {
            let incoming = TcpListenerStream::new(l).map(|s| {
                if let Ok(s) = &s {
                    let _ = s.set_nodelay(true);
                }
                s
            });
            router.serve_with_incoming_shutdown(incoming, signal).await
        }
        (Listener::Unix(l), None) => router.serve_with_incoming_shutdown(UnixListenerStream::new(l), signal).await,
        (Listener::Tcp(l), Some(tls)) => {
            router.serve_with_incoming_shutdown(tls::incoming(l, tls.config, tls.explainer), signal).await
        }
        (Listener::Unix(l), Some(tls)) => {
            router.serve_with_incoming_shutdown(tls::incoming(l, tls.config, tls.explainer), signal).await
        }
    }
}

/// TLS for the etcd port: the rustls configuration (certificate, client-certificate
/// verification, ALPN h2 and http/1.1) and what explains a refused handshake.
pub struct Tls {
    pub config: Arc<rustls::ServerConfig>,
    pub explainer: Arc<tls::Explainer>,
}

use tokio_stream::StreamExt as _;
