//! Who sent a request: its token (gRPC metadata `token`, else `authorization`, as etcd reads
//! them), else the common name of its verified client certificate.

use crate::Context;
use crate::error::status;
use kine_core::auth::Caller;
use tonic::{Request, Status};
use x509_cert::der::Decode as _;

/// The caller of a request, or etcd's error for a bad token.
pub(crate) fn caller<T>(ctx: &Context, request: &Request<T>) -> Result<Caller, Status> {
    if !ctx.store.auth().enabled() {
        return Ok(Caller::Anyone);
    }
    Credentials::of(ctx, request).caller(ctx)
}

/// What a request presents; a watch stream keeps it to identify each watch it creates.
#[derive(Clone, Debug, Default)]
pub(crate) struct Credentials {
    token: Option<String>,
    common_name: Option<String>,
}

impl Credentials {
    pub(crate) fn of<T>(ctx: &Context, request: &Request<T>) -> Credentials {
        let metadata = request.metadata();
        let token = metadata
            .get("token")
            .or_else(|| metadata.get("authorization"))
            // A value that is not text cannot be a token kine-rs issued.
            .map(|v| v.to_str().unwrap_or("\u{0}"))
            .map(|t| t.strip_prefix("Bearer ").unwrap_or(t).to_string());
        let common_name = match token {
            None if ctx.config.client_cert_auth => request.peer_certs().and_then(|certs| common_name(certs.first()?)),
            _ => None,
        };
        Credentials { token, common_name }
    }

    pub(crate) fn caller(&self, ctx: &Context) -> Result<Caller, Status> {
        ctx.store.auth().identify(self.token.as_deref(), self.common_name.as_deref()).map_err(status)
    }
}

/// The subject's common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    const CN: x509_cert::der::asn1::ObjectIdentifier = x509_cert::der::asn1::ObjectIdentifier::new_unwrap("2.5.4.3");
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let name = cert.tbs_certificate.subject.0.iter().flat_map(|rdn| rdn.0.iter()).find(|atv| atv.oid == CN)?;
    let value = &name.value;
    let text = x509_cert::der::asn1::Utf8StringRef::try_from(value)
        .map(|s| s.as_str().to_string())
        .or_else(|_| x509_cert::der::asn1::PrintableStringRef::try_from(value).map(|s| s.as_str().to_string()))
        .ok()?;
    (!text.is_empty()).then_some(text)
}

/// etcd's admin-only RPCs: the caller must hold role `root`.
pub(crate) fn require_admin<T>(ctx: &Context, request: &Request<T>) -> Result<(), Status> {
    let who = caller(ctx, request)?;
    ctx.store.auth().admin(&who).map_err(status)
}

/// RPCs for any authenticated user (etcd's `requireAuthInfo`).
pub(crate) fn require_user<T>(ctx: &Context, request: &Request<T>) -> Result<Caller, Status> {
    let who = caller(ctx, request)?;
    ctx.store.auth().authenticated(&who).map_err(status)?;
    Ok(who)
}

/// The Lock and Election services (etcd runs their recipes with the caller's credentials):
/// read and write on every key of `name`'s waiters or candidates (`name/…`). etcd needs write
/// only on the caller's own key, `name/LEASE`, which is not known before a request without a
/// lease gets one; kine-rs asks for the whole prefix.
pub(crate) fn require_recipe<T>(ctx: &Context, request: &Request<T>, name: &[u8], write: bool) -> Result<(), Status> {
    let who = require_user(ctx, request)?;
    if who == Caller::Anyone {
        return Ok(());
    }
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    let range = kine_core::lock::prefix_range(prefix);
    let kind = if write { kine_core::auth::PermKind::ReadWrite } else { kine_core::auth::PermKind::Read };
    ctx.store.auth().permitted(&who, kind, &range).map_err(status)
}

/// Unlock, Proclaim and Resign: write on the key held (and read, for the recipe's compare).
pub(crate) fn require_key<T>(ctx: &Context, request: &Request<T>, key: &[u8]) -> Result<(), Status> {
    let who = require_user(ctx, request)?;
    let range = kine_core::KeyRange::single(key.to_vec());
    ctx.store.auth().permitted(&who, kine_core::auth::PermKind::ReadWrite, &range).map_err(status)
}
