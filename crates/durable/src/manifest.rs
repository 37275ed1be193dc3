//! The manifest: the object `manifest`, which says what the prefix holds — whose store it is
//! (the cluster id), the newest checkpoint (its object, revision and sha256), and how far the
//! WAL segments reach. Every change is a conditional write on the ETag read, so two writers
//! never both believe they moved it; a prefix whose manifest is not kine-rs's, or is another
//! store's, is refused rather than written over.

use bytes::Bytes;
use kine_objstore::ObjectStore;
use serde::{Deserialize, Serialize};

pub const KEY: &str = "manifest";
/// What `format` holds in every kine-rs manifest.
pub const FORMAT: &str = "kine-rs/s3/1";

/// A full copy of the key space at one revision (see `checkpoint.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The folder of its parts: `checkpoint/<term:10>/<revision:20>/`.
    pub object: String,
    pub revision: i64,
    /// Of its parts, in order.
    pub sha256: String,
    pub parts: u32,
    /// The term and number of the last WAL segment shipped before it: restore continues with
    /// the segments after that one.
    pub after_segment: (u64, u64),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub cluster_id: u64,
    /// The writer term that wrote this version.
    pub term: u64,
    pub checkpoint: Option<Checkpoint>,
    /// The checkpoint before it, kept with the segments after it for restores to a revision
    /// before the newest checkpoint.
    #[serde(default)]
    pub previous: Option<Checkpoint>,
    /// Every revision up to this one is in the checkpoint or in segments.
    pub shipped: i64,
}

impl Manifest {
    pub fn new(cluster_id: u64, term: u64) -> Manifest {
        Manifest { format: FORMAT.into(), cluster_id, term, checkpoint: None, previous: None, shipped: 1 }
    }
}

/// The folder of the checkpoint of a revision written in a term.
pub fn checkpoint_object(term: u64, revision: i64) -> String {
    format!("checkpoint/{term:010}/{revision:020}/")
}

/// A checkpoint's part `n` (from 0).
pub fn checkpoint_part(folder: &str, n: u32) -> String {
    format!("{folder}{n:06}")
}

/// The manifest with its ETag, or `None` for an empty prefix. `cluster_id`: the store this
/// node holds, if any; a manifest of another store is an error.
pub async fn read(store: &dyn ObjectStore, cluster_id: Option<u64>) -> anyhow::Result<Option<(Manifest, String)>> {
    let Some(object) = store.get(KEY).await? else { return Ok(None) };
    let manifest: Manifest =
        serde_json::from_slice(&object.body).ok().filter(|m: &Manifest| m.format == FORMAT).ok_or_else(|| {
            anyhow::anyhow!("the prefix's {KEY} is not a kine-rs manifest ({FORMAT}): another program's objects?")
        })?;
    if let Some(mine) = cluster_id
        && mine != manifest.cluster_id
    {
        anyhow::bail!(
            "the prefix holds another store (cluster id {:x}, this one is {mine:x}): two clusters on one prefix?",
            manifest.cluster_id
        );
    }
    Ok(Some((manifest, object.etag)))
}

/// Writes `manifest` over the version with `etag` (`None`: only into an empty prefix). The new
/// ETag, or `None` if another writer changed it first.
pub async fn write(store: &dyn ObjectStore, manifest: &Manifest, etag: Option<&str>) -> anyhow::Result<Option<String>> {
    let body = Bytes::from(serde_json::to_vec_pretty(manifest).expect("a manifest serializes"));
    match etag {
        Some(etag) => store.put_if_match(KEY, body, etag).await,
        None => store.put_if_absent(KEY, body).await,
    }
}
