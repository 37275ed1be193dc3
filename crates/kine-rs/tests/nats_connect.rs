//! Connecting to an external nats-server the ways kine users do: TLS with a client
//! certificate (`--ca-file`, `--cert-file`, `--key-file`), and a NATS CLI context file
//! (`contextFile`) carrying the server URL and credentials, and a credentials file
//! (`credsFile`: a user JWT and nkey seed, against a server in operator mode).

mod common;

use common::{Server, TempDir};
use kine_testkit::certs::make_certs;
use kine_testkit::nats::NatsServer;

async fn put_and_get(server: &Server) {
    let mut client = server.client().await;
    client.put("k", "v", None).await.unwrap();
    assert_eq!(client.get("k", None).await.unwrap().kvs()[0].value(), b"v");
}

#[tokio::test]
async fn mutual_tls_to_nats() {
    let dir = TempDir::new("nats-tls");
    make_certs(dir.path());
    let p = |name: &str| dir.path().join(name).display().to_string();
    let nats = NatsServer::start_with_config(&format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\n",
        p("server.crt"),
        p("server.key"),
        p("ca.crt")
    ));
    let endpoint = format!("nats://127.0.0.1:{}?noEmbed&bucket=tls", nats.port);
    let server = Server::start(&[
        "--endpoint",
        &endpoint,
        "--ca-file",
        &p("ca.crt"),
        "--cert-file",
        &p("client.crt"),
        "--key-file",
        &p("client.key"),
    ]);
    put_and_get(&server).await;
}

#[tokio::test]
async fn context_file_gives_url_and_credentials() {
    let nats = NatsServer::start_with_config("authorization { user: kine, password: \"s3cret\" }\n");
    let dir = TempDir::new("nats-context");
    let context = dir.path().join("kine.json");
    std::fs::write(
        &context,
        format!(r#"{{"description":"test","url":"nats://127.0.0.1:{}","user":"kine","password":"s3cret"}}"#, nats.port),
    )
    .unwrap();
    let endpoint = format!("nats://?noEmbed&contextFile={}&bucket=ctx", context.display());
    let server = Server::start(&["--endpoint", &endpoint]);
    put_and_get(&server).await;

    // A context file that cannot be read is a start-up error naming it.
    let out = std::process::Command::new(common::BIN)
        .env("KINE_METRICS_BIND_ADDRESS", "0")
        .args(["--listen-address", "127.0.0.1:0", "--endpoint", "nats://?noEmbed&contextFile=/nonexistent/ctx.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("contextFile /nonexistent/ctx.json"), "{stderr}");
}

/// A signed NATS JWT (v2): `claims` issued by `issuer` about `subject`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("{}{}", name.to_uppercase(), subject),
        "iat": 1_700_000_000,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let body = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let signature = issuer.sign(body.as_bytes()).unwrap();
    format!("{body}.{}", b64(&signature))
}

#[tokio::test]
async fn creds_file_authenticates_with_a_user_jwt() {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt =
        jwt(&operator, &operator.public_key(), "op", serde_json::json!({"type": "operator", "version": 2}));
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1,
        "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "kine",
        serde_json::json!({"limits": unlimited, "type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "kine-rs",
        serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}),
    );
    // JetStream in operator mode needs a system account.
    let system = nkeys::KeyPair::new_account();
    let system_jwt = jwt(&operator, &system.public_key(), "SYS", serde_json::json!({"type": "account", "version": 2}));
    let nats = NatsServer::start_with_config(&format!(
        "operator: {operator_jwt}\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{ {sys}: {system_jwt}, {acc}: {account_jwt} }}\n",
        sys = system.public_key(),
        acc = account.public_key()
    ));
    let dir = TempDir::new("nats-creds");
    let creds = dir.path().join("kine.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
    let endpoint = format!("nats://127.0.0.1:{}?noEmbed&bucket=creds&credsFile={}", nats.port, creds.display());
    let server = Server::start(&["--endpoint", &endpoint]);
    put_and_get(&server).await;
}

/// A shutdown signal while kine-rs still waits for an unreachable NATS ends the wait at once:
/// a clean exit, not a process stuck until the connection timeout.
#[tokio::test]
async fn sigterm_while_waiting_for_nats_exits_cleanly() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let endpoint = format!("nats://127.0.0.1:{}?noEmbed", kine_testkit::nats::free_port());
    let mut child = common::spawn_starting(&endpoint);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(child.try_wait().unwrap().is_none(), "kine-rs should still be waiting for NATS");
    let sent = Instant::now();
    let status = common::terminate_within(&mut child, Duration::from_secs(10))
        .await
        .expect("kine-rs still running 10 s after SIGTERM");
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("stopped during start-up"), "{log}");
    assert!(sent.elapsed() < Duration::from_secs(3), "took {:?} to stop\n{log}", sent.elapsed());
}

/// Wrong credentials fail start-up at once, with the server's reason.
#[tokio::test]
async fn wrong_credentials_fail_at_once() {
    let nats = NatsServer::start_with_config("authorization { user: kine, password: right }\n");
    let endpoint = format!("nats://kine:wrong@127.0.0.1:{}?noEmbed", nats.port);
    let started = std::time::Instant::now();
    let (ok, _, log) = common::run(std::process::Command::new(common::BIN).args([
        "--listen-address",
        "127.0.0.1:0",
        "--endpoint",
        &endpoint,
    ]));
    assert!(!ok, "{log}");
    assert!(log.contains("refused the credentials") && log.contains("authorization violation"), "{log}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// A value larger than the external server's max_payload (nats-server's default, 1 MiB) is a
/// size error with etcd's text, never an outage (Unavailable would make clients retry it), and
/// kine-rs says at start that the server's limit is below etcd's; a server configured for
/// etcd's sizes takes it.
#[tokio::test]
async fn values_above_the_servers_max_payload_are_too_large() {
    let nats = NatsServer::start();
    let server = Server::start(&["--endpoint", &format!("{}?noEmbed&bucket=sizes", nats.url())]);
    assert!(server.log().contains("max_payload is below --max-request-bytes"), "{}", server.log());
    let mut client = server.client().await;
    let e = client.put("big", vec![b'x'; 1_400_000], None).await.unwrap_err();
    match &e {
        etcd_client::Error::GRpcStatus(s) => {
            assert_eq!((s.code(), s.message()), (tonic::Code::InvalidArgument, "etcdserver: request is too large"))
        }
        other => panic!("{other}"),
    }
    assert_eq!(client.get("big", None).await.unwrap().header().unwrap().revision(), 1, "nothing was written");
    let nats = NatsServer::start_with_config("max_payload: 2MB\n");
    let server = Server::start(&["--endpoint", &format!("{}?noEmbed&bucket=sizes", nats.url())]);
    assert!(!server.log().contains("max_payload is below"), "{}", server.log());
    let mut client = server.client().await;
    client.put("big", vec![b'x'; 1_400_000], None).await.unwrap();
    assert_eq!(client.get("big", None).await.unwrap().kvs()[0].value().len(), 1_400_000);
}
