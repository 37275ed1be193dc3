//! TLS on the etcd endpoint, with client-certificate authentication. Certificates are made
//! with openssl for each run (X.509 v3, as rustls requires).

mod common;
use common::*;
use etcd_client::*;
use std::path::Path;
use std::time::Duration;

use kine_testkit::certs::make_certs;

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

async fn connect(url: &str, tls: TlsOptions) -> Result<Client, Error> {
    let opts = ConnectOptions::new()
        .with_tls(tls)
        .with_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(5));
    Client::connect([url], Some(opts)).await
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let certs = TempDir::new("tls");
    let d = certs.path();
    make_certs(d);
    let p = |n: &str| d.join(n).display().to_string();
    let flags = client_cert_tls_flags(d);
    let (server, _dir) = sqlite_server(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(server.url.starts_with("https://127.0.0.1:"), "{}", server.url);
    let ready = format!("tls=certificate {}, client certificates signed by {}", p("server.crt"), p("ca.crt"));
    assert!(server.log().contains(&ready), "the ready line must name the TLS files:\n{}", server.log());
    let ca = Certificate::from_pem(read(d, "ca.crt"));
    // With a valid client certificate: works.
    let tls = TlsOptions::new()
        .ca_certificate(ca.clone())
        .identity(Identity::from_pem(read(d, "client.crt"), read(d, "client.key")));
    let mut c = connect(&server.url, tls).await.expect("connect with a client certificate");
    c.put("secure", "yes", None).await.unwrap();
    assert_eq!(c.get("secure", None).await.unwrap().kvs()[0].value(), b"yes");
    // Without one: refused.
    let refused = match connect(&server.url, TlsOptions::new().ca_certificate(ca.clone())).await {
        Err(_) => true,
        Ok(mut c) => c.get("secure", None).await.is_err(),
    };
    assert!(refused, "a client without a certificate must be refused");
    // A plaintext client gets nothing either.
    let plain = server.url.replace("https://", "http://");
    let refused =
        match Client::connect([plain.as_str()], Some(ConnectOptions::new().with_timeout(Duration::from_secs(3)))).await
        {
            Err(_) => true,
            Ok(mut c) => c.get("secure", None).await.is_err(),
        };
    assert!(refused, "plaintext must be refused on a TLS endpoint");
}

#[tokio::test]
async fn tls_without_client_auth() {
    let certs = TempDir::new("tls-noauth");
    let d = certs.path();
    make_certs(d);
    let p = |n: &str| d.join(n).display().to_string();
    let (server, _dir) =
        sqlite_server(&["--server-cert-file", &p("server.crt"), "--server-key-file", &p("server.key")]);
    let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(d, "ca.crt")));
    let mut c = connect(&server.url, tls).await.expect("connect over TLS");
    c.put("k", "v", None).await.unwrap();
}

/// Waits until the server's log holds `text` (or fails naming what it holds).
fn wait_for_log(server: &Server, text: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !server.log().contains(text) {
        assert!(std::time::Instant::now() < deadline, "log never said {text:?}:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each way a client's TLS can be wrong is refused and explained once in the log, naming the
/// flag or file to fix; etcdctl is the client (as an operator would try it).
#[tokio::test]
async fn refused_handshakes_are_explained() {
    use kine_testkit::certs::{make_ca, sign};
    let certs = TempDir::new("tls-explain");
    let d = certs.path();
    make_certs(d);
    make_ca(d, "other-ca");
    sign(d, "other-ca", "stranger", "stranger", "clientAuth");
    sign(d, "ca", "server-only", "server-only", "serverAuth");
    let p = |n: &str| d.join(n).display().to_string();
    let flags = client_cert_tls_flags(d);
    let (server, _dir) = sqlite_server(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let endpoint = server.url.clone();
    let etcdctl = |args: &[String]| {
        let out = std::process::Command::new("etcdctl")
            .arg(format!("--endpoints={endpoint}"))
            .arg("--dial-timeout=3s")
            .arg("--command-timeout=3s")
            .args(args)
            .arg("get")
            .arg("k")
            .output()
            .expect("etcdctl (Debian's etcd-client)");
        out.status.success()
    };
    let ok = |args: &[&str]| etcdctl(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    let (ca, cert, key) = (format!("--cacert={}", p("ca.crt")), format!("--cert={}", p("client.crt")), p("client.key"));
    assert!(ok(&[&ca, &cert, &format!("--key={key}")]), "the right certificates must work");
    let ca_path = p("ca.crt");
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec![ca.clone()], format!("the client sent no certificate, and --trusted-ca-file {ca_path} requires one")),
        (
            vec![ca.clone(), format!("--cert={}", p("stranger.crt")), format!("--key={}", p("stranger.key"))],
            format!("the client's certificate is not signed by the CA in --trusted-ca-file {ca_path}"),
        ),
        (
            vec![ca.clone(), format!("--cert={}", p("server-only.crt")), format!("--key={}", p("server-only.key"))],
            "the client's certificate is not for client authentication".to_string(),
        ),
        (
            vec![format!("--cacert={}", p("other-ca.crt")), cert.clone(), format!("--key={key}")],
            "the client refused kine-rs's certificate --server-cert-file".to_string(),
        ),
    ];
    for (args, expected) in &cases {
        assert!(!etcdctl(args), "{args:?} must be refused");
        wait_for_log(&server, expected);
    }
    // Plain text on the TLS port.
    let plain = server.url.replace("https://", "http://");
    let out = std::process::Command::new("etcdctl")
        .args([format!("--endpoints={plain}"), "--dial-timeout=2s".into(), "--command-timeout=2s".into()])
        .args(["get", "k"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    wait_for_log(&server, "the client spoke plain text (not TLS) to this TLS port");
    // etcdctl retries: each reason is logged once per 10 s, not once per attempt.
    let log = server.log();
    for (_, expected) in &cases {
        assert_eq!(log.matches(expected.as_str()).count(), 1, "{expected:?} logged more than once:\n{log}");
    }
    // The server still serves the right client.
    assert!(ok(&[&ca, &cert, &format!("--key={key}")]));
}

/// A key that is not the certificate's stops start-up naming both flags.
#[test]
fn a_key_that_does_not_match_the_certificate_is_refused_at_start() {
    let certs = TempDir::new("tls-mismatch");
    let d = certs.path();
    make_certs(d);
    let p = |n: &str| d.join(n).display().to_string();
    let dir = TempDir::new("tls-mismatch-db");
    let (ok, _, err) = run(std::process::Command::new(env!("CARGO_BIN_EXE_kine-rs")).args([
        "--endpoint",
        &db_endpoint(dir.path()),
        "--listen-address",
        "127.0.0.1:0",
        "--server-cert-file",
        &p("server.crt"),
        "--server-key-file",
        &p("client.key"),
    ]));
    assert!(!ok);
    assert!(err.contains("--server-key-file is not the key of --server-cert-file"), "{err}");
    let (ok, _, err) = run(std::process::Command::new(env!("CARGO_BIN_EXE_kine-rs")).args([
        "--endpoint",
        &db_endpoint(dir.path()),
        "--listen-address",
        "127.0.0.1:0",
        "--server-cert-file",
        &p("server.key"),
        "--server-key-file",
        &p("server.key"),
    ]));
    assert!(!ok);
    assert!(err.contains("--server-cert-file") && err.contains("holds no certificate"), "{err}");
}
