//! The standby marker: a small JSON file next to a follower's local database (`<database>.s3-standby`)
//! saying that the database holds nothing of its own, only the S3 store's history up to a
//! segment, as a follower applied it (`standby.rs`). A node that starts with such a database
//! goes on from that segment instead of refusing it as another store's; one whose marker is
//! missing is a writer's database (or another store's) and is checked as such.
//!
//! The marker is written before the database's first change (`segment: None` while the
//! checkpoint is being restored) and moved on at most once a second as segments are applied, so
//! it may name an older segment than the database holds: the segments in between are checked
//! against the database's history (`apply.rs`). It is written whole to a temporary file, synced
//! and renamed over the old one; it goes once the node writes the database (the takeover).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What `format` holds.
pub const FORMAT: &str = "kine-rs/s3-standby/1";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub format: String,
    /// The local database's cluster id: a marker speaks of that database only.
    pub database: u64,
    /// The cluster id of the S3 store followed (its manifest's when the database was filled).
    pub store: u64,
    /// The last segment applied, whole: (term, number); `None` while the checkpoint is being
    /// restored (a database left so is started afresh).
    pub segment: Option<(u64, u64)>,
    /// The S3 ETag of that segment: the store a later manifest names is this one's successor
    /// if the segment is still there, unchanged.
    #[serde(default)]
    pub etag: Option<String>,
    /// The revision reached with that segment.
    pub revision: i64,
}

impl Marker {
    pub fn new(database: u64, store: u64) -> Marker {
        Marker { format: FORMAT.into(), database, store, segment: None, etag: None, revision: 1 }
    }
}

/// Where the marker of the database at `database` lives.
pub fn path_for(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".s3-standby");
    PathBuf::from(name)
}

/// The marker at `path`, if there is one.
pub fn read(path: &Path) -> anyhow::Result<Option<Marker>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(anyhow::anyhow!("cannot read {}: {err}", path.display())),
    };
    let marker = serde_json::from_slice::<Marker>(&bytes).ok().filter(|m| m.format == FORMAT).ok_or_else(|| {
        anyhow::anyhow!(
            "{} is not a kine-rs standby marker ({FORMAT}): remove it, and the database beside it if it is not this \
             node's own",
            path.display()
        )
    })?;
    Ok(Some(marker))
}

/// Writes `marker` to `path`, durably (temporary file, sync, rename, directory sync).
pub async fn write(path: &Path, marker: &Marker) -> anyhow::Result<()> {
    let (path, body) = (path.to_path_buf(), serde_json::to_vec_pretty(marker).expect("a marker serializes"));
    tokio::task::spawn_blocking(move || write_now(&path, &body)).await?
}

fn write_now(path: &Path, body: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let context = |what: &str, err: std::io::Error| anyhow::anyhow!("cannot {what} {}: {err}", tmp.display());
    let mut file = std::fs::File::create(&tmp).map_err(|err| context("create", err))?;
    file.write_all(body).map_err(|err| context("write", err))?;
    file.sync_all().map_err(|err| context("sync", err))?;
    std::fs::rename(&tmp, path)
        .map_err(|err| anyhow::anyhow!("cannot rename {} over {}: {err}", tmp.display(), path.display()))?;
    sync_dir(path);
    Ok(())
}

/// Removes the marker at `path` (nothing if there is none), durably.
pub async fn remove(path: &Path) -> anyhow::Result<()> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || match std::fs::remove_file(&path) {
        Ok(()) => {
            sync_dir(&path);
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(anyhow::anyhow!("cannot remove {}: {err}", path.display())),
    })
    .await?
}

/// Syncs the directory of `path` (a rename or removal in it survives a crash); best effort.
fn sync_dir(path: &Path) {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_marker_is_written_read_back_and_removed() {
        let dir = std::env::temp_dir().join(format!("kine-marker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = path_for(&dir.join("state.db"));
        assert!(path.ends_with("state.db.s3-standby"), "{}", path.display());
        assert_eq!(read(&path).unwrap(), None);
        let mut marker = Marker::new(7, 9);
        write(&path, &marker).await.unwrap();
        assert_eq!(read(&path).unwrap(), Some(marker.clone()));
        (marker.segment, marker.etag, marker.revision) = (Some((2, 5)), Some("\"abc\"".into()), 40);
        write(&path, &marker).await.unwrap();
        assert_eq!(read(&path).unwrap(), Some(marker));
        remove(&path).await.unwrap();
        remove(&path).await.unwrap();
        assert_eq!(read(&path).unwrap(), None);
        std::fs::write(&path, b"{}").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("not a kine-rs standby marker"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
