//! Every etcd RPC through the real server in-process: kine-server's `serve` on a loopback port
//! over a memory store, started once per fuzzing process, and a gRPC client sending the request
//! the input decodes to (first byte: which RPC; the rest: the protobuf message). The store keeps
//! what earlier inputs wrote, so later ones meet keys, leases and compactions.
//!
//! A handler that panics runs in a task of its own, whose panic would only end that task and
//! look like a closed stream: the panic hook aborts the process instead, so the fuzzer sees it.
//! A unary request without an answer within 10 s is a hang and aborts as well.

use kine_core::memory::MemoryBackend;
use kine_core::store::{Store, StoreOptions};
use kine_proto::etcdserverpb as pb;
use kine_server::{Listener, ServerConfig};
use pb::{
    auth_client::AuthClient, cluster_client::ClusterClient, kv_client::KvClient, lease_client::LeaseClient,
    maintenance_client::MaintenanceClient, watch_client::WatchClient,
};
use prost::Message;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tonic::transport::Channel;

const LIMIT: Duration = Duration::from_secs(10);

struct Harness {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
}

static HARNESS: OnceLock<Harness> = OnceLock::new();

fn harness() -> &'static Harness {
    HARNESS.get_or_init(|| {
        crate::abort_on_panic();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let channel = runtime.block_on(async {
            let backend = Arc::new(MemoryBackend::new());
            // The cheapest bcrypt: fuzzing looks for crashes, not for slow hashes.
            let auth = kine_core::auth::AuthOptions { bcrypt_cost: 4, ..Default::default() };
            let store =
                Store::open(backend, StoreOptions { auth, ..Default::default() }).await.expect("a memory store");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
            let address = listener.local_addr().unwrap();
            let (reporter, _) = tonic_health::server::health_reporter();
            let (trigger, shutdown) = kine_core::shutdown::channel();
            // The server lives as long as the process.
            std::mem::forget(trigger);
            let config = ServerConfig {
                max_request_bytes: 1_572_864,
                emulated_version: "3.7.3".into(),
                client_cert_auth: false,
                snapshot_format: None,
            };
            tokio::spawn(kine_server::serve(store, config, Listener::Tcp(listener), None, reporter, shutdown));
            let endpoint = Channel::from_shared(format!("http://{address}")).unwrap();
            loop {
                if let Ok(channel) = endpoint.connect().await {
                    break channel;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Harness { runtime, channel }
    })
}

/// Decodes the input's request, or returns from the target.
macro_rules! request {
    ($ty:ty, $body:expr) => {
        match <$ty>::decode($body) {
            Ok(r) => r,
            Err(_) => return,
        }
    };
}

/// A unary call that must be answered (any answer) within the limit.
macro_rules! unary {
    ($call:expr) => {{
        let _answer = tokio::time::timeout(LIMIT, $call).await.expect("a unary RPC answered within 10 s");
    }};
}

/// The RPCs, by the input's first byte.
pub fn grpc(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else { return };
    let h = harness();
    let ch = h.channel.clone();
    h.runtime.block_on(async move {
        let kv = || KvClient::new(ch.clone());
        let lease = || LeaseClient::new(ch.clone());
        let maintenance = || MaintenanceClient::new(ch.clone());
        let auth = || AuthClient::new(ch.clone());
        match which % 40 {
            0 => unary!(kv().range(request!(pb::RangeRequest, body))),
            1 => unary!(kv().put(request!(pb::PutRequest, body))),
            2 => unary!(kv().delete_range(request!(pb::DeleteRangeRequest, body))),
            3 => unary!(kv().txn(request!(pb::TxnRequest, body))),
            4 => unary!(kv().compact(request!(pb::CompactionRequest, body))),
            5 => {
                let req = request!(pb::RangeRequest, body);
                if let Ok(Ok(answer)) = tokio::time::timeout(LIMIT, kv().range_stream(req)).await {
                    let mut parts = answer.into_inner();
                    while let Ok(Ok(Some(_))) = tokio::time::timeout(LIMIT, parts.message()).await {}
                }
            }
            6 => unary!(lease().lease_grant(request!(pb::LeaseGrantRequest, body))),
            7 => unary!(lease().lease_revoke(request!(pb::LeaseRevokeRequest, body))),
            8 => unary!(lease().lease_time_to_live(request!(pb::LeaseTimeToLiveRequest, body))),
            9 => unary!(lease().lease_leases(request!(pb::LeaseLeasesRequest, body))),
            10 => {
                let req = request!(pb::LeaseKeepAliveRequest, body);
                let stream = tokio_stream_once(req);
                if let Ok(Ok(answers)) = tokio::time::timeout(LIMIT, lease().lease_keep_alive(stream)).await {
                    let _ = tokio::time::timeout(Duration::from_millis(200), answers.into_inner().message()).await;
                }
            }
            11 => {
                let req = request!(pb::WatchRequest, body);
                let stream = tokio_stream_once(req);
                if let Ok(Ok(answers)) = tokio::time::timeout(LIMIT, WatchClient::new(ch.clone()).watch(stream)).await {
                    let mut answers = answers.into_inner();
                    for _ in 0..3 {
                        if !matches!(
                            tokio::time::timeout(Duration::from_millis(100), answers.message()).await,
                            Ok(Ok(Some(_)))
                        ) {
                            break;
                        }
                    }
                }
            }
            12 => unary!(maintenance().status(request!(pb::StatusRequest, body))),
            13 => unary!(maintenance().hash(request!(pb::HashRequest, body))),
            14 => unary!(maintenance().hash_kv(request!(pb::HashKvRequest, body))),
            15 => unary!(maintenance().alarm(request!(pb::AlarmRequest, body))),
            16 => unary!(maintenance().defragment(request!(pb::DefragmentRequest, body))),
            17 => unary!(ClusterClient::new(ch.clone()).member_list(request!(pb::MemberListRequest, body))),
            18 => unary!(ClusterClient::new(ch.clone()).member_promote(request!(pb::MemberPromoteRequest, body))),
            20 => unary!(auth().auth_enable(request!(pb::AuthEnableRequest, body))),
            21 => unary!(auth().auth_disable(request!(pb::AuthDisableRequest, body))),
            22 => unary!(auth().auth_status(request!(pb::AuthStatusRequest, body))),
            23 => unary!(auth().authenticate(request!(pb::AuthenticateRequest, body))),
            24 => unary!(auth().user_add(request!(pb::AuthUserAddRequest, body))),
            25 => unary!(auth().user_get(request!(pb::AuthUserGetRequest, body))),
            26 => unary!(auth().user_list(request!(pb::AuthUserListRequest, body))),
            27 => unary!(auth().user_delete(request!(pb::AuthUserDeleteRequest, body))),
            28 => unary!(auth().user_change_password(request!(pb::AuthUserChangePasswordRequest, body))),
            29 => unary!(auth().user_grant_role(request!(pb::AuthUserGrantRoleRequest, body))),
            30 => unary!(auth().user_revoke_role(request!(pb::AuthUserRevokeRoleRequest, body))),
            31 => unary!(auth().role_add(request!(pb::AuthRoleAddRequest, body))),
            32 => unary!(auth().role_get(request!(pb::AuthRoleGetRequest, body))),
            33 => unary!(auth().role_list(request!(pb::AuthRoleListRequest, body))),
            34 => unary!(auth().role_delete(request!(pb::AuthRoleDeleteRequest, body))),
            35 => unary!(auth().role_grant_permission(request!(pb::AuthRoleGrantPermissionRequest, body))),
            36 => unary!(auth().role_revoke_permission(request!(pb::AuthRoleRevokePermissionRequest, body))),
            _ => unary!(maintenance().move_leader(request!(pb::MoveLeaderRequest, body))),
        }
    });
}

/// A client stream that sends one message and then stays open a moment (as a real client's
/// would), so that the server does not see it end at once.
fn tokio_stream_once<T: Send + 'static>(first: T) -> tokio_stream::wrappers::ReceiverStream<T> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(first);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(tx);
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
