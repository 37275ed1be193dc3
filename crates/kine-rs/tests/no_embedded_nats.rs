//! A kine-rs built without the `embedded-nats` feature (`cargo test -p kine-rs
//! --no-default-features --test no_embedded_nats`, run by scripts/test): asking for the
//! embedded server is a clear start-up error, and `nats://host:port` means an external server.
#![cfg(not(feature = "embedded-nats"))]

mod common;

use common::Server;
use kine_testkit::nats::NatsServer;

fn start_error(endpoint: &str) -> String {
    let out = std::process::Command::new(common::BIN)
        .env("KINE_METRICS_BIND_ADDRESS", "0")
        .args(["--listen-address", "127.0.0.1:0", "--endpoint", endpoint])
        .output()
        .expect("run kine-rs");
    assert!(!out.status.success(), "{endpoint}: kine-rs should refuse to start");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn embedded_server_requests_are_refused_clearly() {
    let err = start_error("nats://");
    assert!(err.contains("built without the embedded NATS server (cargo feature embedded-nats)"), "{err}");
    let err = start_error("nats://?dontListen");
    assert!(err.contains("parameter dontListen configures an embedded NATS server"), "{err}");
    let err = start_error("nats://127.0.0.1:4222?serverConfig=/etc/nats.conf");
    assert!(err.contains("parameter serverConfig"), "{err}");
}

#[tokio::test]
async fn a_host_means_an_external_server() {
    let nats = NatsServer::start();
    // No noEmbed needed: this build has nothing to embed.
    let endpoint = format!("{}?bucket=plain", nats.url());
    let server = Server::start(&["--endpoint", &endpoint]);
    assert!(!server.log().contains("embedded NATS server"));
    let mut client = server.client().await;
    client.put("k", "v", None).await.unwrap();
    assert_eq!(client.get("k", None).await.unwrap().kvs()[0].value(), b"v");
}
