//! Auth end to end: several nodes on one datastore agree on users and tokens, tokens expire,
//! etcdctl and client certificates work, a flood of wrong passwords leaves other clients
//! served, the Lock and Election services check permissions, and no secret reaches the log.
//! (What each RPC answers is compared with etcd in `auth_differential`.)

mod common;

use common::{Server, TempDir, sqlite_server};
use etcd_client::*;
use kine_proto::etcdserverpb as pb;
use kine_testkit::certs::make_certs;
use kine_testkit::nats::NatsServer;
use std::process::Command;
use std::time::{Duration, Instant};

/// Users `root` (role root) and `alice` (read-write on `app/`), then auth enabled.
async fn set_up_users(c: &mut Client) {
    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("app").await.unwrap();
    c.role_grant_permission("app", Permission::read_write("app/").with_prefix()).await.unwrap();
    c.user_add("alice", "alicepw", None).await.unwrap();
    c.user_grant_role("alice", "app").await.unwrap();
    c.auth_enable().await.unwrap();
}

async fn login(url: &str, user: &str, password: &str) -> Result<Client, Error> {
    Client::connect([url], Some(ConnectOptions::new().with_user(user, password))).await
}

/// A raw KV client sending `token` (as issued by any node).
async fn get_with_token(url: &str, token: &str, key: &str) -> Result<i64, tonic::Status> {
    let mut kv = pb::kv_client::KvClient::connect(url.to_string()).await.expect("connect");
    let mut req = tonic::Request::new(pb::RangeRequest { key: key.into(), ..Default::default() });
    req.metadata_mut().insert("token", token.parse().unwrap());
    kv.range(req).await.map(|r| r.into_inner().count)
}

async fn issue_token(url: &str, user: &str, password: &str) -> Result<String, tonic::Status> {
    let mut auth = pb::auth_client::AuthClient::connect(url.to_string()).await.expect("connect");
    let req = pb::AuthenticateRequest { name: user.into(), password: password.into() };
    auth.authenticate(req).await.map(|r| r.into_inner().token)
}

fn denied(e: Error) -> String {
    match e {
        Error::GRpcStatus(s) => format!("{:?} {}", s.code(), s.message()),
        other => other.to_string(),
    }
}

/// Two nodes on one NATS bucket: a user added on one logs in on the other; a token from one is
/// good on the other; a new password or disabling auth on one holds on the other within the
/// refresh bound (1 s; the test allows 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_users_tokens_and_changes() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=auth", nats.url());
    let args = ["--endpoint", endpoint.as_str(), "--bcrypt-cost", "4"];
    let (one, two) = (Server::start(&args), Server::start(&args));
    set_up_users(&mut one.client().await).await;
    // Node two learns of it within the bound.
    let start = Instant::now();
    let mut alice_two = loop {
        match login(&two.url, "alice", "alicepw").await {
            Ok(c) => break c,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(5), "node two never learnt of alice: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    alice_two.put("app/x", "1", None).await.unwrap();
    assert_eq!(
        denied(alice_two.put("other", "1", None).await.unwrap_err()),
        "PermissionDenied etcdserver: permission denied"
    );
    // A token from node one is good on node two.
    let token = issue_token(&one.url, "alice", "alicepw").await.unwrap();
    assert_eq!(get_with_token(&two.url, &token, "app/x").await.unwrap(), 1);
    // A new password set on node one voids the token and the old password on node two.
    let mut root_one = login(&one.url, "root", "rootpw").await.unwrap();
    root_one.user_change_password("alice", "newpw").await.unwrap();
    let changed = Instant::now();
    loop {
        let old_token = get_with_token(&two.url, &token, "app/x").await;
        let old_password = issue_token(&two.url, "alice", "alicepw").await;
        if let (Err(t), Err(p)) = (&old_token, &old_password) {
            assert_eq!((t.code(), t.message()), (tonic::Code::Unauthenticated, "etcdserver: invalid auth token"));
            assert_eq!(p.message(), "etcdserver: authentication failed, invalid user ID or password");
            break;
        }
        assert!(changed.elapsed() < Duration::from_secs(5), "node two still takes the old password or token");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("a new password held on the other node after {:?}", changed.elapsed());
    login(&two.url, "alice", "newpw").await.expect("the new password works on node two");
    // Auth disabled on node two: node one serves anonymous clients soon after.
    let mut root_two = login(&two.url, "root", "rootpw").await.unwrap();
    root_two.auth_disable().await.unwrap();
    let mut anonymous = one.client().await;
    let start = Instant::now();
    while anonymous.put("open", "1", None).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "node one still requires auth");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A simple token unused for `--auth-token-ttl` is void; each use restarts its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_unless_used() {
    let (server, _dir) = sqlite_server(&["--auth-token-ttl", "2", "--bcrypt-cost", "4"]);
    set_up_users(&mut server.client().await).await;
    let token = issue_token(&server.url, "alice", "alicepw").await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        get_with_token(&server.url, &token, "app/x").await.expect("a token in use stays valid");
    }
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let e = get_with_token(&server.url, &token, "app/x").await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "etcdserver: invalid auth token"));
}

/// Users and the enabled flag are in the datastore: they survive a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_survives_a_restart() {
    let dir = TempDir::new("auth-restart");
    let endpoint = common::db_endpoint(dir.path());
    let mut server = Server::start(&["--endpoint", &endpoint, "--bcrypt-cost", "4"]);
    set_up_users(&mut server.client().await).await;
    server.stop("TERM").await;
    let server = Server::start(&["--endpoint", &endpoint]);
    let e = server.client().await.get("app/x", None).await.unwrap_err();
    assert_eq!(denied(e), "InvalidArgument etcdserver: user name is empty");
    let mut alice = login(&server.url, "alice", "alicepw").await.unwrap();
    alice.put("app/x", "1", None).await.unwrap();
}

fn etcdctl(url: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("etcdctl").arg("--endpoints").arg(url).args(args).output().expect("etcdctl");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// etcdctl's user, role and auth commands, and `--user`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_manages_users_and_logs_in() {
    let (server, _dir) = sqlite_server(&["--bcrypt-cost", "4"]);
    let url = server.url.as_str();
    for cmd in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "app"],
        &["role", "grant-permission", "app", "readwrite", "app/", "--prefix=true"],
        &["user", "add", "alice:alicepw"],
        &["user", "grant-role", "alice", "app"],
        &["auth", "enable"],
    ] {
        let (ok, out) = etcdctl(url, cmd);
        assert!(ok, "etcdctl {cmd:?}: {out}");
    }
    let (ok, out) = etcdctl(url, &["--user", "alice:alicepw", "put", "app/a", "1"]);
    assert!(ok, "{out}");
    let (ok, out) = etcdctl(url, &["--user", "alice:alicepw", "get", "app/a"]);
    assert!(ok && out.contains("app/a\n1"), "{out}");
    let (ok, out) = etcdctl(url, &["--user", "alice:alicepw", "put", "other", "1"]);
    assert!(!ok && out.contains("etcdserver: permission denied"), "{out}");
    let (ok, out) = etcdctl(url, &["--user", "alice:wrong", "get", "app/a"]);
    assert!(!ok && out.contains("authentication failed, invalid user ID or password"), "{out}");
    let (ok, out) = etcdctl(url, &["get", "app/a"]);
    assert!(!ok && out.contains("etcdserver: user name is empty"), "{out}");
    let (ok, out) = etcdctl(url, &["--user", "root:rootpw", "role", "get", "app"]);
    assert!(ok && out.contains("[app/, app0) (prefix app/)"), "{out}");
    let (ok, out) = etcdctl(url, &["--user", "root:rootpw", "auth", "disable"]);
    assert!(ok, "{out}");
    let (ok, out) = etcdctl(url, &["get", "app/a"]);
    assert!(ok, "{out}");
}

/// With client-certificate auth, a request without a token comes from the user its
/// certificate's common name names ("client" here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_the_user() {
    let certs = TempDir::new("auth-tls");
    let d = certs.path();
    make_certs(d);
    let mut flags = common::client_cert_tls_flags(d);
    flags.extend(["--bcrypt-cost".to_string(), "4".to_string()]);
    let (server, _dir) = sqlite_server(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let read = |n: &str| std::fs::read(d.join(n)).unwrap();
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read("ca.crt")))
        .identity(Identity::from_pem(read("client.crt"), read("client.key")));
    let mut c = Client::connect([server.url.as_str()], Some(ConnectOptions::new().with_tls(tls))).await.unwrap();
    set_up_users(&mut c).await;
    assert_eq!(denied(c.put("app/x", "1", None).await.unwrap_err()), "PermissionDenied etcdserver: permission denied");
    // User "client" does not exist yet: denied. Root (by token) adds it with role app.
    let token = issue_token_tls(&server.url, d).await;
    let mut admin = pb::auth_client::AuthClient::new(tls_channel(&server.url, d).await);
    let add = |r: pb::AuthUserAddRequest| {
        let mut req = tonic::Request::new(r);
        req.metadata_mut().insert("token", token.parse().unwrap());
        req
    };
    admin
        .user_add(add(pb::AuthUserAddRequest {
            name: "client".into(),
            options: Some(kine_proto::authpb::UserAddOptions { no_password: true }),
            ..Default::default()
        }))
        .await
        .unwrap();
    let mut grant = tonic::Request::new(pb::AuthUserGrantRoleRequest { user: "client".into(), role: "app".into() });
    grant.metadata_mut().insert("token", token.parse().unwrap());
    admin.user_grant_role(grant).await.unwrap();
    c.put("app/x", "1", None).await.expect("the certificate's user may write app/");
    assert_eq!(denied(c.put("other", "1", None).await.unwrap_err()), "PermissionDenied etcdserver: permission denied");
}

async fn tls_channel(url: &str, d: &std::path::Path) -> tonic::transport::Channel {
    use tonic::transport::{Certificate as Ca, ClientTlsConfig, Identity as Id};
    let read = |n: &str| std::fs::read(d.join(n)).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Ca::from_pem(read("ca.crt")))
        .identity(Id::from_pem(read("client.crt"), read("client.key")))
        .domain_name("localhost");
    tonic::transport::Channel::from_shared(url.to_string()).unwrap().tls_config(tls).unwrap().connect().await.unwrap()
}

async fn issue_token_tls(url: &str, d: &std::path::Path) -> String {
    let mut auth = pb::auth_client::AuthClient::new(tls_channel(url, d).await);
    let req = pb::AuthenticateRequest { name: "root".into(), password: "rootpw".into() };
    auth.authenticate(req).await.unwrap().into_inner().token
}

/// Many wrong passwords at once (bcrypt at etcd's default cost): each is refused, the server's
/// hashing is bounded, and an authenticated client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_wrong_passwords_leaves_others_served() {
    let (server, _dir) = sqlite_server(&[]);
    set_up_users(&mut server.client().await).await;
    let mut alice = login(&server.url, "alice", "alicepw").await.unwrap();
    let flood: Vec<_> = (0..64)
        .map(|i| {
            let url = server.url.clone();
            tokio::spawn(async move { issue_token(&url, "alice", &format!("guess-{i}")).await })
        })
        .collect();
    let mut served = 0;
    while !flood.iter().all(|f| f.is_finished()) {
        alice.put("app/during", "1", None).await.expect("served during the flood");
        served += 1;
    }
    for f in flood {
        let e = f.await.unwrap().unwrap_err();
        assert_eq!(e.message(), "etcdserver: authentication failed, invalid user ID or password");
    }
    assert!(served > 0);
    alice.get("app/during", None).await.unwrap();
}

/// The Lock and Election services need read and write on the name's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_check_permissions() {
    let (server, _dir) = sqlite_server(&["--bcrypt-cost", "4"]);
    set_up_users(&mut server.client().await).await;
    let mut alice = login(&server.url, "alice", "alicepw").await.unwrap();
    let lease = alice.lease_grant(30, None).await.unwrap().id();
    let held = alice.lock("app/lock", Some(LockOptions::new().with_lease(lease))).await.unwrap();
    alice.unlock(held.key()).await.unwrap();
    let e = alice.lock("elsewhere", Some(LockOptions::new().with_lease(lease))).await.unwrap_err();
    assert_eq!(denied(e), "Unknown etcdserver: permission denied");
    let won = alice.campaign("app/vote", "me", lease).await.unwrap();
    assert_eq!(alice.leader("app/vote").await.unwrap().kv().unwrap().value(), b"me");
    alice.resign(Some(ResignOptions::new().with_leader(won.leader().unwrap().clone()))).await.unwrap();
    assert_eq!(denied(alice.leader("elsewhere").await.unwrap_err()), "Unknown etcdserver: permission denied");
    let mut anonymous = server.client().await;
    assert_eq!(denied(anonymous.lock("app/lock", None).await.unwrap_err()), "Unknown etcdserver: user name is empty");
}

/// Passwords and tokens never reach the log, even at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_the_log() {
    let (server, _dir) = sqlite_server(&["--debug", "--bcrypt-cost", "4"]);
    let mut c = server.client().await;
    c.user_add("root", "S3cret-root-PW", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();
    let token = issue_token(&server.url, "root", "S3cret-root-PW").await.unwrap();
    let _ = issue_token(&server.url, "root", "Wr0ng-guess-PW").await.unwrap_err();
    get_with_token(&server.url, &token, "k").await.unwrap();
    let _ = get_with_token(&server.url, &format!("{token}x"), "k").await.unwrap_err();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = server.log();
    assert!(log.contains("auth switched"), "the log shows auth switched on:\n{log}");
    for secret in ["S3cret-root-PW", "Wr0ng-guess-PW", token.as_str(), &token[..20]] {
        assert!(!log.contains(secret), "{secret:?} is in the log:\n{log}");
    }
}
