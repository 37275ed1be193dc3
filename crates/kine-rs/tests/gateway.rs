//! The JSON gateway: the same HTTP session, driven by a non-Go client written the way APISIX's
//! lua-resty-etcd talks to etcd (`gateway/client.py`: cjson bodies, base64 keys, a line-by-line
//! watch, leases, `Authorization: <token>`, lock and election), against real etcd 3.7 and 3.6
//! and against kine-rs: the transcripts must be equal line by line (ids, tokens and the raft
//! term written out). Then bad input: malformed and huge bodies, slow clients, TLS.

mod common;
#[path = "differential/etcd.rs"]
mod etcd;

use common::{TempDir, sqlite_server};
use std::process::Command;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn client_py(url: &str) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gateway/client.py");
    let out = Command::new("python3").arg(script).arg(url).output().expect("python3 (install-test-deps installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "client.py against {url} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

async fn compare(version: etcd::Version) {
    let etcd = etcd::Etcd::start(version);
    let expected = client_py(&etcd.url);
    let (kine, _dir) = sqlite_server(&["--emulated-etcd-version", version.emulated(), "--bcrypt-cost", "4"]);
    let got = client_py(&kine.url);
    common::assert_same_transcript(&expected, &got, 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_answers_as_etcd_3_7_does() {
    compare(etcd::Version::V3_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_answers_as_etcd_3_6_does() {
    compare(etcd::Version::V3_6).await;
}

fn port(url: &str) -> u16 {
    url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port in the URL")
}

/// One raw HTTP/1.1 exchange; returns the status and the body.
async fn raw(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("answered").unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let head =
        format!("POST {path} HTTP/1.1\r\nHost: k\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    [head.as_bytes(), body].concat()
}

/// Malformed JSON, wrong types, a body over the size limit, many slow clients: clear errors,
/// and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_server_stays_up() {
    let (server, _dir) = sqlite_server(&["--max-request-bytes", "65536"]);
    let port = port(&server.url);
    let (status, body) = raw(port, &post("/v3/kv/put", b"{\"key\":")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"code\":3"), "{body}");
    let (status, body) = raw(port, &post("/v3/kv/put", br#"{"key":"YQ==","lease":{"x":1}}"#)).await;
    assert_eq!(status, 400, "{body}");
    // Over the gRPC limit (--max-request-bytes + 512 KiB): refused as etcd's gRPC server does.
    let huge = format!("{{\"key\":\"YQ==\",\"value\":\"{}\"}}", "A".repeat(700 * 1024));
    let (status, body) = raw(port, &post("/v3/kv/put", huge.as_bytes())).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("\"code\":8"), "{body}");
    // Over --max-request-bytes but within the gRPC limit: etcd's "request is too large".
    let big = format!("{{\"key\":\"YQ==\",\"value\":\"{}\"}}", "A".repeat(100 * 1024));
    let (status, body) = raw(port, &post("/v3/kv/put", big.as_bytes())).await;
    assert_eq!((status, body.as_str()), (400, r#"{"code":3,"message":"etcdserver: request is too large"}"#));
    // Slow clients: many connections that send half a request and wait.
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"POST /v3/kv/range HTTP/1.1\r\nHost: k\r\nContent-Le").await.unwrap();
        slow.push(s);
    }
    let (status, body) = raw(port, &post("/v3/kv/range", br#"{"key":"YQ=="}"#)).await;
    assert_eq!(status, 200, "served while slow clients wait: {body}");
    let mut c = server.client().await;
    c.put("a", "1", None).await.expect("gRPC served too");
    drop(slow);
}

/// Over TLS the gateway is on the same port as gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_is_served_over_tls() {
    let certs = TempDir::new("gw-tls");
    let d = certs.path();
    kine_testkit::certs::make_certs(d);
    let p = |n: &str| d.join(n).display().to_string();
    let (server, _dir) =
        sqlite_server(&["--server-cert-file", &p("server.crt"), "--server-key-file", &p("server.key")]);
    let (status, body) = common::http::http_get(port(&server.url), "/version", Some(&d.join("ca.crt"))).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"etcdcluster\":\"3.7.0\""), "{body}");
}
