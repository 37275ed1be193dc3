//! A plain HTTP/1.1 (or HTTPS) GET, for `/metrics` and `/health`.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET `path` over plain HTTP/1.1 (or TLS with `tls`); returns the status code and the body.
pub async fn http_get(port: u16, path: &str, tls: Option<&std::path::Path>) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect to the metrics port");
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut raw = Vec::new();
    match tls {
        None => {
            let mut s = stream;
            s.write_all(request.as_bytes()).await.unwrap();
            s.read_to_end(&mut raw).await.unwrap();
        }
        Some(ca) => {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(cert.unwrap()).unwrap();
            }
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut s = connector.connect(name, stream).await.expect("TLS to the metrics port");
            s.write_all(request.as_bytes()).await.unwrap();
            let _ = s.read_to_end(&mut raw).await;
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status code");
    (status, body.to_string())
}
