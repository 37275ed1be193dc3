//! Connecting to an external nats-server the ways kine users do: TLS with a client
//! certificate (`--ca-file`, `--cert-file`, `--key-file`), and a NATS CLI context file
//! (`contextFile`) carrying the server URL and credentials.

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
        .args(["--listen-address", "127.0.0.1:0", "--endpoint", "nats://?noEmbed&contextFile=/nonexistent/ctx.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("contextFile /nonexistent/ctx.json"), "{stderr}");
}
