//! The etcd port's TLS from --server-cert-file, --server-key-file and --trusted-ca-file (and the
//! metrics port's, which shares the certificate): read and checked at start-up, every error
//! naming the flag and file at fault.

use anyhow::{Context, Result, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    std::fs::metadata(path).with_context(|| format!("{flag} {}: cannot read", path.display()))?;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("{flag} {}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        bail!("{flag} {}: holds no certificate (a PEM file with BEGIN CERTIFICATE blocks)", path.display());
    }
    Ok(certs)
}

/// The server's configuration without client certificates (the certificate checked against
/// its key).
fn server_builder(
    cert: &Path,
    key: &Path,
    builder: rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>,
) -> Result<rustls::ServerConfig> {
    let chain = certificates("--server-cert-file", cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--server-key-file {}: no PEM private key read", key.display()))?;
    builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => anyhow::anyhow!(
            "--server-key-file is not the key of --server-cert-file {} ({e}): give the key the certificate was \
             issued for",
            cert.display()
        ),
        e => anyhow::anyhow!("--server-cert-file {} / --server-key-file: {e}", cert.display()),
    })
}

/// The etcd port's configuration: client certificates required and checked against
/// `client_ca` when given; ALPN h2 (gRPC) and http/1.1 (the JSON gateway).
pub fn etcd(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<rustls::ServerConfig>> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates("--trusted-ca-file", ca)? {
                roots.add(c).with_context(|| format!("--trusted-ca-file {}: not a CA certificate", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .with_context(|| format!("--trusted-ca-file {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = server_builder(cert, key, builder)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The metrics port's: the same certificate, no client certificates.
pub fn metrics(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth();
    Ok(Arc::new(server_builder(cert, key, builder)?))
}
