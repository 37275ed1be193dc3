//! JWT tokens (`--auth-token jwt,…`): etcd's claims and rules, tokens from etcd itself accepted,
//! a verify-only node, expiry, and a change of the auth state making tokens old.

mod common;
#[allow(dead_code)]
#[path = "differential/etcd.rs"]
mod etcd;

use base64::Engine as _;
use common::{Server, TempDir, sqlite_server};
use kine_proto::etcdserverpb as pb;
use kine_testkit::nats::NatsServer;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// An RSA key pair: `jwt.key` (private) and `jwt.pub`.
fn rsa_keys(dir: &Path) -> (String, String) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["genrsa", "-out", "jwt.key", "2048"]);
    run(&["rsa", "-in", "jwt.key", "-pubout", "-out", "jwt.pub"]);
    (dir.join("jwt.key").display().to_string(), dir.join("jwt.pub").display().to_string())
}

async fn auth_client(url: &str) -> pb::auth_client::AuthClient<tonic::transport::Channel> {
    pb::auth_client::AuthClient::connect(url.to_string()).await.expect("connect")
}

fn with_token<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("token", token.parse().unwrap());
    r
}

/// Root, role `app` (read-write on `app/`), user alice with it, auth on: the same calls, so
/// etcd and kine-rs reach the same auth revision.
async fn set_up(url: &str) {
    let mut a = auth_client(url).await;
    let user = |n: &str, p: &str| pb::AuthUserAddRequest { name: n.into(), password: p.into(), ..Default::default() };
    a.user_add(user("root", "rootpw")).await.unwrap();
    a.user_grant_role(pb::AuthUserGrantRoleRequest { user: "root".into(), role: "root".into() }).await.unwrap();
    a.role_add(pb::AuthRoleAddRequest { name: "app".into() }).await.unwrap();
    let perm = kine_proto::authpb::Permission { perm_type: 2, key: b"app/".to_vec(), range_end: b"app0".to_vec() };
    a.role_grant_permission(pb::AuthRoleGrantPermissionRequest { name: "app".into(), perm: Some(perm) }).await.unwrap();
    a.user_add(user("alice", "alicepw")).await.unwrap();
    a.user_grant_role(pb::AuthUserGrantRoleRequest { user: "alice".into(), role: "app".into() }).await.unwrap();
    a.auth_enable(pb::AuthEnableRequest {}).await.unwrap();
}

async fn login(url: &str, user: &str, password: &str) -> Result<String, tonic::Status> {
    let req = pb::AuthenticateRequest { name: user.into(), password: password.into() };
    auth_client(url).await.authenticate(req).await.map(|r| r.into_inner().token)
}

async fn get(url: &str, token: &str, key: &str) -> Result<i64, tonic::Status> {
    let mut kv = pb::kv_client::KvClient::connect(url.to_string()).await.unwrap();
    kv.range(with_token(token, pb::RangeRequest { key: key.into(), ..Default::default() }))
        .await
        .map(|r| r.into_inner().count)
}

fn claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// Tokens carry etcd's claims; a change of users, roles or permissions makes them old for key
/// operations (admins' RPCs do not check it, as in etcd); they expire after the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_follow_etcds_rules() {
    let keys = TempDir::new("jwt");
    let (private, public) = rsa_keys(keys.path());
    let spec = format!("jwt,sign-method=RS256,priv-key={private},pub-key={public},ttl=3s");
    let (server, _dir) = sqlite_server(&["--auth-token", &spec, "--bcrypt-cost", "4"]);
    set_up(&server.url).await;
    let alice = login(&server.url, "alice", "alicepw").await.unwrap();
    let c = claims(&alice);
    assert_eq!((c["username"].as_str(), c["revision"].as_u64()), (Some("alice"), Some(7)), "{c}");
    assert!(c["exp"].as_u64().is_some(), "{c}");
    assert_eq!(get(&server.url, &alice, "app/x").await.unwrap(), 0);
    let root = login(&server.url, "root", "rootpw").await.unwrap();
    // A new role: the auth revision moves; alice's token is now old for key operations.
    let mut a = auth_client(&server.url).await;
    a.role_add(with_token(&root, pb::AuthRoleAddRequest { name: "other".into() })).await.unwrap();
    let e = get(&server.url, &alice, "app/x").await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "etcdserver: revision of auth store is old"));
    // Root's old token still passes admin checks (etcd checks no revision there).
    a.user_list(with_token(&root, pb::AuthUserListRequest {})).await.expect("admin RPC with an old JWT");
    let fresh = login(&server.url, "alice", "alicepw").await.unwrap();
    get(&server.url, &fresh, "app/x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(4100)).await;
    let e = get(&server.url, &fresh, "app/x").await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "etcdserver: invalid auth token"));
    // A token signed with another key, and a garbled one.
    let other = TempDir::new("jwt-other");
    let (other_private, other_public) = rsa_keys(other.path());
    let spec = format!("jwt,sign-method=RS256,priv-key={other_private},pub-key={other_public}");
    let (foreign, _dir2) = sqlite_server(&["--auth-token", &spec, "--bcrypt-cost", "4"]);
    set_up(&foreign.url).await;
    let forged = login(&foreign.url, "alice", "alicepw").await.unwrap();
    let e = get(&server.url, &forged, "app/x").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let e = get(&server.url, "a.b.c", "app/x").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
}

/// A node with only the public key accepts tokens from a node that signs, and refuses to issue
/// any, as etcd does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verify_only_node_accepts_tokens_it_cannot_issue() {
    let keys = TempDir::new("jwt-verify");
    let (private, public) = rsa_keys(keys.path());
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=jwt", nats.url());
    let signer = format!("jwt,sign-method=RS256,priv-key={private},pub-key={public}");
    let verifier = format!("jwt,sign-method=RS256,pub-key={public}");
    let one = Server::start(&["--endpoint", &endpoint, "--auth-token", &signer, "--bcrypt-cost", "4"]);
    let two = Server::start(&["--endpoint", &endpoint, "--auth-token", &verifier]);
    set_up(&one.url).await;
    let token = login(&one.url, "alice", "alicepw").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // node two reads the auth record
    assert_eq!(get(&two.url, &token, "app/x").await.unwrap(), 0);
    let e = login(&two.url, "alice", "alicepw").await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unknown, "auth: token signing attempted with verify-only key"));
}

/// A JWT issued by etcd 3.7 with the same key is accepted by kine-rs (same users set up the
/// same way, so the same auth revision), and one from kine-rs by etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_from_etcd_and_kine_rs_are_interchangeable() {
    let keys = TempDir::new("jwt-etcd");
    let (private, public) = rsa_keys(keys.path());
    let spec = format!("jwt,pub-key={public},priv-key={private},sign-method=RS256,ttl=10m");
    let etcd = etcd::Etcd::start_with(etcd::Version::V3_7, &["--auth-token", &spec]);
    let (kine, _dir) = sqlite_server(&["--auth-token", &spec, "--bcrypt-cost", "4"]);
    set_up(&etcd.url).await;
    set_up(&kine.url).await;
    let from_etcd = login(&etcd.url, "alice", "alicepw").await.unwrap();
    let from_kine = login(&kine.url, "alice", "alicepw").await.unwrap();
    assert_eq!(claims(&from_etcd)["revision"], claims(&from_kine)["revision"]);
    assert_eq!(get(&kine.url, &from_etcd, "app/x").await.unwrap(), 0, "kine-rs accepts etcd's token");
    assert_eq!(get(&etcd.url, &from_kine, "app/x").await.unwrap(), 0, "etcd accepts kine-rs's token");
    let e = get(&kine.url, &from_etcd, "other").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
}
