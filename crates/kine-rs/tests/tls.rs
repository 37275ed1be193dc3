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
    let (server, _dir) = sqlite_server(&[
        "--server-cert-file",
        &p("server.crt"),
        "--server-key-file",
        &p("server.key"),
        "--trusted-ca-file",
        &p("ca.crt"),
    ]);
    assert!(server.url.starts_with("https://127.0.0.1:"), "{}", server.url);
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
