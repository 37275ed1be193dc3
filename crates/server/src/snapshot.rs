//! Maintenance.Snapshot: the store writes its snapshot to an unlinked temporary file; the file is
//! then streamed in 32 KiB chunks with the bytes remaining after each, and a last message with
//! the sha256 of everything sent, as etcd does (`etcdctl snapshot save` stores it all).

use crate::Context;
use crate::error::status;
use kine_core::Error;
use kine_proto::etcdserverpb as pb;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncSeekExt, BufWriter};
use tokio::sync::mpsc;
use tonic::Status;

const CHUNK: usize = 32 * 1024;

/// Writes the snapshot and returns the receiving end of its message stream.
pub async fn stream(ctx: &Context) -> Result<mpsc::Receiver<Result<pb::SnapshotResponse, Status>>, Status> {
    let mut file = temp_file().await?;
    let mut out = BufWriter::new(&mut file);
    let revision = ctx.store.snapshot(&mut out).await.map_err(status)?;
    drop(out);
    let total = file.seek(std::io::SeekFrom::End(0)).await.map_err(io)?;
    file.rewind().await.map_err(io)?;
    tracing::info!(revision, bytes = total, "sending a snapshot");
    let version = ctx.config.emulated_version.clone();
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut sha = Sha256::new();
        let mut sent = 0u64;
        while sent < total {
            let mut blob = vec![0u8; CHUNK.min((total - sent) as usize)];
            if let Err(e) = file.read_exact(&mut blob).await {
                let _ = tx.send(Err(io(e))).await;
                return;
            }
            sent += blob.len() as u64;
            sha.update(&blob);
            let msg =
                pb::SnapshotResponse { header: None, remaining_bytes: total - sent, blob, version: version.clone() };
            if tx.send(Ok(msg)).await.is_err() {
                return; // the client went away
            }
        }
        let sum = sha.finalize().to_vec();
        let _ = tx.send(Ok(pb::SnapshotResponse { header: None, remaining_bytes: 0, blob: sum, version })).await;
    });
    Ok(rx)
}

/// A new file in the temporary directory, unlinked at once (it lives while it is open).
async fn temp_file() -> Result<tokio::fs::File, Status> {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "kine-rs-snapshot-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let file =
        tokio::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).await.map_err(|e| {
            status(Error::Backend(anyhow::anyhow!("cannot create the snapshot file {}: {e}", path.display())))
        })?;
    let _ = tokio::fs::remove_file(&path).await;
    Ok(file)
}

fn io(e: std::io::Error) -> Status {
    status(Error::Backend(anyhow::anyhow!("snapshot file: {e}")))
}
