//! Object storage for kine-rs's S3 durability (issue 23): the few operations the shipper, the
//! restore and the writer lock need — plain and conditional puts, gets, lists, deletes — as a
//! trait, and its implementation on any S3-compatible store through the AWS SDK.
//!
//! Conditional writes are S3's: `If-None-Match: *` (create only) and `If-Match: ETAG` (replace
//! only that version); a lost race is `Ok(None)`, never an error.

mod s3;

pub use s3::{S3Config, S3Store, StaticKeys};

use bytes::Bytes;

/// An object's content and its ETag (quotes kept, as S3 returns it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub body: Bytes,
    pub etag: String,
}

#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// The object, or `None` if there is none.
    async fn get(&self, key: &str) -> anyhow::Result<Option<Object>>;
    /// Writes the object whatever is there; its new ETag.
    async fn put(&self, key: &str, body: Bytes) -> anyhow::Result<String>;
    /// Writes the object only if there is none: its ETag, or `None` if one exists.
    async fn put_if_absent(&self, key: &str, body: Bytes) -> anyhow::Result<Option<String>>;
    /// Replaces the object only if its ETag is still `etag`: the new ETag, or `None` if it
    /// changed (or is gone).
    async fn put_if_match(&self, key: &str, body: Bytes, etag: &str) -> anyhow::Result<Option<String>>;
    /// The keys under `prefix`, in S3's order (bytewise).
    async fn list(&self, prefix: &str) -> anyhow::Result<Vec<String>>;
    /// The keys under `prefix` that sort after `after`, in S3's order: what a reader that
    /// follows a growing list of objects asks for.
    async fn list_after(&self, prefix: &str, after: &str) -> anyhow::Result<Vec<String>> {
        Ok(self.list(prefix).await?.into_iter().filter(|k| k.as_str() > after).collect())
    }
    /// Removes the object (nothing if it is gone).
    async fn delete(&self, key: &str) -> anyhow::Result<()>;
}
