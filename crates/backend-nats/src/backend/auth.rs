//! The auth record (etcd's users, roles and auth settings; opaque bytes here): the key `auth`
//! of `<bucket>-meta`, outside the key space (no revision, no event). Its version is the KV
//! entry's revision; a replacement is a KV create or an update expecting that revision, so
//! every node on the bucket sees one record and of concurrent writers exactly one wins. A copy
//! reads its mirror of the origin's meta bucket and refuses replacements.

use super::{Inner, NATS_TIMEOUT, unavailable};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::kv;
use kine_core::backend::AuthRecord;
use kine_core::{Error, Result};

/// The key of the auth record.
pub(super) const AUTH: &str = "auth";

impl Inner {
    pub(super) async fn auth_record(&self) -> Result<Option<AuthRecord>> {
        self.check_open()?;
        match tokio::time::timeout(NATS_TIMEOUT, self.meta.entry(AUTH)).await {
            Ok(Ok(Some(e))) if e.operation == kv::Operation::Put => {
                Ok(Some(AuthRecord { version: e.revision, data: e.value.to_vec() }))
            }
            Ok(Ok(_)) => Ok(None),
            Ok(Err(e)) => Err(unavailable(format!("read the auth record: {e}"))),
            Err(_) => Err(unavailable(format!("read the auth record: timed out after {NATS_TIMEOUT:?}"))),
        }
    }

    pub(super) async fn auth_replace(&self, expected: Option<u64>, data: Vec<u8>) -> Result<bool> {
        self.check_open()?;
        if let Some(refusal) = self.role().refusal() {
            return Err(refusal);
        }
        let written = match expected {
            None => tokio::time::timeout(NATS_TIMEOUT, self.meta.create(AUTH, data.into()))
                .await
                .map(|r| r.map_err(|e| Failed::of(&e, e.kind() == kv::CreateErrorKind::AlreadyExists))),
            // Revision 0 would mean "no record yet" to NATS; no record has that version.
            Some(0) => return Ok(false),
            Some(revision) => tokio::time::timeout(NATS_TIMEOUT, self.meta.update(AUTH, data.into(), revision))
                .await
                .map(|r| r.map_err(|e| Failed::of(&e, e.kind() == kv::UpdateErrorKind::WrongLastRevision))),
        };
        match written {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(Failed::Lost)) => Ok(false),
            Ok(Err(Failed::TooLarge)) => Err(Error::RequestTooLarge),
            Ok(Err(Failed::Other(text))) => Err(unavailable(format!("replace the auth record: {text}"))),
            Err(_) => Err(unavailable(format!("replace the auth record: timed out after {NATS_TIMEOUT:?}"))),
        }
    }
}

/// Why a KV create or update failed.
enum Failed {
    /// Another writer got there first.
    Lost,
    /// Larger than the server's max_payload (1 MiB unless configured): a size error, never an
    /// outage.
    TooLarge,
    Other(String),
}

impl Failed {
    fn of(e: &(dyn std::error::Error + 'static), lost: bool) -> Failed {
        let text = e.to_string();
        // A replicated stream words a lost race differently.
        if lost || text.contains("wrong last sequence") {
            return Failed::Lost;
        }
        let mut cause = Some(e);
        while let Some(c) = cause {
            let kind = c.downcast_ref::<PublishError>().map(|p| p.kind());
            if kind == Some(PublishErrorKind::MaxPayloadExceeded) {
                return Failed::TooLarge;
            }
            cause = c.source();
        }
        Failed::Other(text)
    }
}
