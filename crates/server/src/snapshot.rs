//! Maintenance.Snapshot: the store writes its snapshot to an unlinked temporary file (in etcd's
//! bbolt format when the server has one, kine-rs's own otherwise); the file is then streamed in
//! 32 KiB chunks with the bytes remaining after each, and a last message with the sha256 of
//! everything sent, as etcd does (`etcdctl snapshot save` stores it all).

use crate::Context;
use crate::error::status;
use kine_core::Error;
use kine_core::snapshot::{Format, Part};
use kine_core::types::Revision;
use kine_proto::etcdserverpb as pb;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncSeekExt, BufWriter};
use tokio::sync::mpsc;
use tonic::Status;

const CHUNK: usize = 32 * 1024;

/// Writes the snapshot and returns the receiving end of its message stream.
pub async fn stream(ctx: &Context) -> Result<mpsc::Receiver<Result<pb::SnapshotResponse, Status>>, Status> {
    let (mut file, revision) = match &ctx.config.snapshot_format {
        Some(format) => write_in(format.clone(), ctx).await?,
        None => {
            let mut file = temp_file().await?;
            let mut out = BufWriter::new(&mut file);
            let revision = ctx.store.snapshot(&mut out).await.map_err(status)?;
            drop(out);
            (file, revision)
        }
    };
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

/// A compaction while the history is read makes the snapshot start again, this many times.
const ATTEMPTS: usize = 3;

/// The snapshot in `format` (with history), written by a blocking task that the parts are
/// handed to, in an unlinked file. Started again if a compaction overtakes it.
async fn write_in(format: Arc<dyn Format>, ctx: &Context) -> Result<(tokio::fs::File, Revision), Status> {
    let mut attempt = 1;
    loop {
        match write_once(format.clone(), ctx).await {
            Err(Error::Compacted { .. }) if attempt < ATTEMPTS => {
                tracing::debug!(attempt, "a compaction overtook the snapshot; starting it again");
                attempt += 1;
            }
            Err(Error::Compacted { .. }) => {
                return Err(status(Error::Unavailable(
                    "etcdserver: the store was compacted while the snapshot was taken, every time; try again".into(),
                )));
            }
            other => return other.map_err(status),
        }
    }
}

async fn write_once(format: Arc<dyn Format>, ctx: &Context) -> kine_core::Result<(tokio::fs::File, Revision)> {
    let (head, mut parts) = ctx.store.snapshot_history().await?;
    let revision = head.revision;
    let path = temp_path();
    let (tx, mut rx) = mpsc::channel::<kine_core::Result<Part>>(2);
    let out = path.clone();
    let writer = tokio::task::spawn_blocking(move || {
        let mut next = || rx.blocking_recv().transpose();
        format.write(&head, &mut next, &out)
    });
    let mut read_error = None;
    loop {
        match parts.next().await {
            Ok(Some(part)) => {
                if tx.send(Ok(part)).await.is_err() {
                    break; // the writer stopped, and says why
                }
            }
            Ok(None) => break,
            Err(e) => {
                // The writer gives up on an error; the reader's own is the one to report.
                let _ = tx.send(Err(Error::Backend(anyhow::anyhow!("the snapshot's read failed")))).await;
                read_error = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let written = writer.await.map_err(|e| Error::Backend(anyhow::anyhow!("snapshot writer: {e}")));
    let file = match (read_error, written) {
        (Some(e), _) => Err(e),
        (None, Ok(Ok(()))) => {
            tokio::fs::File::open(&path).await.map_err(|e| Error::Backend(anyhow::anyhow!("snapshot file: {e}")))
        }
        (None, Ok(Err(e)) | Err(e)) => Err(e),
    };
    let _ = tokio::fs::remove_file(&path).await;
    Ok((file?, revision))
}

fn temp_path() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!("kine-rs-snapshot-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

/// A new file in the temporary directory, unlinked at once (it lives while it is open).
async fn temp_file() -> Result<tokio::fs::File, Status> {
    let path = temp_path();
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
