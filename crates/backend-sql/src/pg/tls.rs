//! TLS to PostgreSQL with rustls, from kine's flags: `--ca-file` (verify the server against it),
//! `--cert-file`/`--key-file` (a client certificate), `--skip-verify` (no verification). With
//! none of them, the URL's `sslmode` decides as libpq does: `require` encrypts without
//! verifying; `verify-ca`/`verify-full` need `--ca-file`.

use anyhow::{Context, Result, bail};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// kine's datastore TLS flags.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub skip_verify: bool,
}

impl TlsFiles {
    fn any(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some() || self.skip_verify
    }
}

/// The TLS connector for this endpoint, or `None` for a plain connection. `sslmode` is the
/// URL's (`None` when absent).
pub fn connector(files: &TlsFiles, sslmode: Option<&str>) -> Result<Option<MakeRustlsConnect>> {
    let verify = match (sslmode, files.any()) {
        (Some("disable"), true) => {
            bail!("--ca-file/--cert-file/--key-file/--skip-verify: the URL says sslmode=disable")
        }
        (Some("disable") | Some("allow") | Some("prefer") | None, false) => return Ok(None),
        (Some("require"), false) => false,
        (Some("verify-ca") | Some("verify-full"), false) => {
            bail!("sslmode={}: give the server's CA with --ca-file", sslmode.unwrap_or_default())
        }
        (Some(other), false) => {
            bail!("sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full")
        }
        (_, true) => !files.skip_verify,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match (&files.ca_file, verify) {
        (Some(ca), true) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).with_context(|| format!("--ca-file {}", ca.display()))? {
                roots.add(cert.with_context(|| format!("--ca-file {}", ca.display()))?)?;
            }
            builder.with_root_certificates(roots)
        }
        (None, true) => bail!("--cert-file/--key-file: give the server's CA with --ca-file too (or --skip-verify)"),
        (_, false) => builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerification(provider))),
    };
    let config = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("--cert-file {}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("--cert-file {}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("--key-file {}", key.display()))?;
            builder.with_client_auth_cert(chain, key).context("--cert-file/--key-file")?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => bail!("--cert-file and --key-file go together"),
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// `--skip-verify` / `sslmode=require`: encrypted, not authenticated.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
