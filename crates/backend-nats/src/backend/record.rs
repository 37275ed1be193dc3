//! The `promoted` record a promoted copy keeps in its meta bucket: the origin it followed and
//! the revision its own history continues after.

use super::meta;
use super::origin::Origin;
use anyhow::anyhow;
use async_nats::jetstream;
use kine_core::Revision;
use std::time::{SystemTime, UNIX_EPOCH};

/// `promoted` in a promoted copy's meta bucket.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Promoted {
    pub origin_stream: String,
    pub origin_api: Option<String>,
    /// The origin's creation time (it is the copy's too): a fence names it.
    #[serde(default)]
    pub origin_birth: i64,
    /// The newest revision the copy had: revisions continue after it.
    pub revision: Revision,
    pub at_unix: u64,
    /// The old origin got its `superseded` record.
    pub fenced: bool,
}

pub(super) fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The origin a promoted copy recorded, if this bucket is one.
pub(super) async fn recorded_origin(meta: &jetstream::kv::Store) -> anyhow::Result<Option<Origin>> {
    Ok(read_record(meta).await?.map(|p| Origin { stream: p.origin_stream, api: p.origin_api }))
}

pub(super) async fn read_record(meta: &jetstream::kv::Store) -> anyhow::Result<Option<Promoted>> {
    match meta.entry(meta::PROMOTED).await {
        Ok(Some(e)) if e.operation == jetstream::kv::Operation::Put => Ok(serde_json::from_slice(&e.value).ok()),
        Ok(_) => Ok(None),
        Err(e) => Err(anyhow!("read the promotion record: {e}")),
    }
}
