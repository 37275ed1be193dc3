//! [`ObjectStore`] on S3 or any S3-compatible server, with kine's flags: bucket, folder (a key
//! prefix), endpoint (path-style addressing, for MinIO, versitygw, Ceph…), region, static keys.

use crate::{Object, ObjectStore};
use anyhow::Context;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;

/// kine's `--s3-*` flags.
#[derive(Clone, Default)]
pub struct S3Config {
    pub bucket: String,
    /// A prefix for every key (`--s3-folder`), without a trailing slash.
    pub folder: String,
    /// `--s3-endpoint`: an S3-compatible server's URL; addressed path-style.
    pub endpoint: Option<String>,
    pub region: String,
    /// Static keys; `None`: the AWS SDK's default chain (`AWS_*` variables, the shared config
    /// and credentials files and `AWS_PROFILE`, web identity (EKS), ECS, the EC2 instance role).
    pub keys: Option<StaticKeys>,
    /// `--s3-ca-bundle`: PEM certificates, the only roots trusted for HTTPS; `None`: the
    /// system's roots.
    pub ca_bundle: Option<Vec<u8>>,
}

#[derive(Clone)]
pub struct StaticKeys {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
}

impl StaticKeys {
    pub fn new(access_key: &str, secret_key: &str) -> StaticKeys {
        StaticKeys { access_key: access_key.into(), secret_key: secret_key.into(), session_token: None }
    }
}

/// Without the secret.
impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("folder", &self.folder)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key", &self.keys.as_ref().map(|k| &k.access_key))
            .field("ca_bundle", &self.ca_bundle.is_some())
            .finish()
    }
}

/// The trust store of `--s3-ca-bundle`, checked here: the SDK parses it only at the first
/// connection, and panics on what it cannot parse.
fn trust_store(pem: &[u8]) -> anyhow::Result<aws_smithy_http_client::tls::TrustStore> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("not a PEM file of certificates: {e}"))?;
    if certs.is_empty() {
        anyhow::bail!("no certificate in it (PEM, -----BEGIN CERTIFICATE-----)");
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| anyhow::anyhow!("certificate {}: {e}", i + 1))?;
    }
    Ok(aws_smithy_http_client::tls::TrustStore::empty().with_pem_certificate(pem.to_vec()))
}

pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

impl S3Store {
    pub async fn connect(config: &S3Config) -> anyhow::Result<S3Store> {
        let mut tls = aws_smithy_http_client::tls::TlsContext::builder();
        if let Some(pem) = &config.ca_bundle {
            tls = tls.with_trust_store(trust_store(pem).context("--s3-ca-bundle")?);
        }
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .tls_context(tls.build().context("--s3-ca-bundle")?)
            .build_https();
        // A request that hangs must fail, not hold the shipper or the writer lock's renewal.
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .operation_attempt_timeout(std::time::Duration::from_secs(20))
            .operation_timeout(std::time::Duration::from_secs(60))
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(config.region.clone()))
            .timeout_config(timeouts)
            .http_client(http);
        if let Some(keys) = &config.keys {
            loader = loader.credentials_provider(aws_credential_types::Credentials::new(
                &keys.access_key,
                &keys.secret_key,
                keys.session_token.clone(),
                None,
                "kine-rs flags",
            ));
        }
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let shared = loader.load().await;
        if config.keys.is_none() {
            // Found now, so that a node without any says so at start.
            use aws_credential_types::provider::ProvideCredentials;
            let chain = shared.credentials_provider().context("the AWS SDK gave no credentials chain")?;
            chain.provide_credentials().await.map_err(|e| {
                anyhow::anyhow!(
                    "no S3 credentials: give --s3-access-key and --s3-secret-key, set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE, ~/.aws/credentials), or run with an instance role ({})",
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                )
            })?;
        }
        let s3 = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(config.endpoint.is_some())
            // Checksums only where S3 requires them: S3-compatible servers differ in the newer
            // checksum headers.
            .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
            .build();
        let prefix =
            if config.folder.is_empty() { String::new() } else { format!("{}/", config.folder.trim_end_matches('/')) };
        Ok(S3Store { client: aws_sdk_s3::Client::from_conf(s3), bucket: config.bucket.clone(), prefix })
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

/// The HTTP status of a failed request, if the server answered.
fn http_status<E>(e: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Option<u16> {
    match e {
        SdkError::ServiceError(s) => Some(s.raw().status().as_u16()),
        _ => None,
    }
}

/// A failure, with the server's code and message when it gave them.
fn failed<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(
    what: String,
    e: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> anyhow::Error {
    let detail = match (e.code(), e.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_string(),
        _ => format!("{}", aws_sdk_s3::error::DisplayErrorContext(&e)),
    };
    anyhow::anyhow!("{what}: {detail}")
}

impl S3Store {
    /// One LIST (a page per 1,000 keys), from after `after` when given.
    async fn list_from(&self, prefix: &str, after: Option<&str>) -> anyhow::Result<Vec<String>> {
        let full = self.key(prefix);
        let mut keys = Vec::new();
        let request = self.client.list_objects_v2().bucket(&self.bucket).prefix(&full);
        let request = match after {
            Some(after) => request.start_after(self.key(after)),
            None => request,
        };
        let mut pages = request.into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| failed(format!("list s3://{}/{full}", self.bucket), e))?;
            for object in page.contents() {
                if let Some(k) = object.key().and_then(|k| k.strip_prefix(&self.prefix)) {
                    keys.push(k.to_string());
                }
            }
        }
        Ok(keys)
    }
}

#[async_trait::async_trait]
impl ObjectStore for S3Store {
    async fn get(&self, key: &str) -> anyhow::Result<Option<Object>> {
        let key = self.key(key);
        match self.client.get_object().bucket(&self.bucket).key(&key).send().await {
            Ok(out) => {
                let etag = out.e_tag().unwrap_or_default().to_string();
                let body = out.body.collect().await.with_context(|| format!("read s3://{}/{key}", self.bucket))?;
                Ok(Some(Object { body: body.into_bytes(), etag }))
            }
            Err(e) if http_status(&e) == Some(404) => Ok(None),
            Err(e) => Err(failed(format!("get s3://{}/{key}", self.bucket), e)),
        }
    }

    async fn put(&self, key: &str, body: Bytes) -> anyhow::Result<String> {
        let key = self.key(key);
        let out = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| failed(format!("put s3://{}/{key}", self.bucket), e))?;
        Ok(out.e_tag().unwrap_or_default().to_string())
    }

    async fn put_if_absent(&self, key: &str, body: Bytes) -> anyhow::Result<Option<String>> {
        let key = self.key(key);
        let sent = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .if_none_match("*")
            .body(ByteStream::from(body))
            .send()
            .await;
        match sent {
            Ok(out) => Ok(Some(out.e_tag().unwrap_or_default().to_string())),
            // 412: it exists; 409: a concurrent conditional write to it is in progress.
            Err(e) if matches!(http_status(&e), Some(412 | 409)) => Ok(None),
            Err(e) => Err(failed(format!("create s3://{}/{key}", self.bucket), e)),
        }
    }

    async fn put_if_match(&self, key: &str, body: Bytes, etag: &str) -> anyhow::Result<Option<String>> {
        let key = self.key(key);
        let sent = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .if_match(etag)
            .body(ByteStream::from(body))
            .send()
            .await;
        match sent {
            Ok(out) => Ok(Some(out.e_tag().unwrap_or_default().to_string())),
            // 412: another version; 404: gone; 409: a concurrent conditional write.
            Err(e) if matches!(http_status(&e), Some(412 | 404 | 409)) => Ok(None),
            Err(e) => Err(failed(format!("replace s3://{}/{key}", self.bucket), e)),
        }
    }

    async fn list(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        self.list_from(prefix, None).await
    }

    async fn list_after(&self, prefix: &str, after: &str) -> anyhow::Result<Vec<String>> {
        self.list_from(prefix, Some(after)).await
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        let key = self.key(key);
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| failed(format!("delete s3://{}/{key}", self.bucket), e))?;
        Ok(())
    }
}
