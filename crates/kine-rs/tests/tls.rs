//! TLS on the etcd endpoint, with client-certificate authentication. Certificates are made
//! with openssl for each run (X.509 v3, as rustls requires).

mod common;
use common::*;
use etcd_client::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn openssl(dir: &Path, args: &[&str]) {
    let (ok, out, err) = run(Command::new("openssl").current_dir(dir).args(args));
    assert!(ok, "openssl {args:?} failed (is openssl installed?): {out}{err}");
}

fn make_certs(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &ec[..],
            &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=kine-rs test CA"],
        ]
        .concat(),
    );
    for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
        std::fs::write(
            dir.join(format!("{name}.ext")),
            format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        let (key, csr, crt, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("{name}.ext"));
        openssl(dir, &[&["req"], &ec[..], &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={name}")]].concat());
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
}

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
