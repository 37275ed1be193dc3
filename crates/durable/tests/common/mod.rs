//! What the object-storage tests share: a store on a folder of the test server's `kine` bucket,
//! and a node's local SQLite database with its standby marker.
#![allow(dead_code)]

use kine_backend_sql::{SqliteBackend, SqliteOptions};
use kine_core::backend::Backend;
use kine_durable::standby::{Reset, Standby};
use kine_objstore::{ObjectStore, S3Config, S3Store, StaticKeys};
use kine_testkit::s3::{ACCESS_KEY, REGION, S3Server, SECRET_KEY};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub async fn store(server: &S3Server, folder: &str) -> Arc<dyn ObjectStore> {
    let config = S3Config {
        bucket: "kine".into(),
        folder: folder.into(),
        endpoint: Some(server.endpoint()),
        region: REGION.into(),
        keys: Some(StaticKeys::new(ACCESS_KEY, SECRET_KEY)),
        ca_bundle: None,
    };
    Arc::new(S3Store::connect(&config).await.unwrap())
}

/// The SQLite database `<dir>/state.db`, opened (created if missing).
pub fn database(dir: &Path) -> Arc<dyn Backend> {
    let path = dir.join("state.db");
    Arc::new(SqliteBackend::open(SqliteOptions { path }).expect("open the SQLite database"))
}

/// The local database of a node in `dir` (`<dir>/state.db`), as kine-rs hands it to
/// kine-durable: its marker beside it, emptied by removing its files.
pub fn local(dir: &Path) -> Standby {
    std::fs::create_dir_all(dir).unwrap();
    let path: PathBuf = dir.join("state.db");
    let reset: Reset = Arc::new({
        let dir = dir.to_path_buf();
        move |old: Arc<dyn Backend>| {
            let dir = dir.clone();
            Box::pin(async move {
                old.close().await;
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", dir.join("state.db").display()));
                }
                Ok(database(&dir))
            })
        }
    });
    Standby::new(database(dir), kine_durable::marker::path_for(&path), reset)
}
