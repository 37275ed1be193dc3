//! `kine-rs snapshot restore FILE`: a snapshot into a new SQLite datastore. The file is etcd's
//! (a bbolt file, as etcd and kine-rs save it; every version it holds is restored) or kine-rs's
//! own earlier format (each key's newest version).

use crate::endpoint::{self, Endpoint};
use anyhow::{Result, bail};
use std::path::Path;

pub fn run(endpoint: &str, file: &Path) -> Result<()> {
    let path = match endpoint::parse(endpoint).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } => path,
        _ => bail!(
            "--endpoint: snapshot restore writes a new SQLite database (sqlite://PATH); to move data into another \
             datastore, restore into SQLite, serve it, and copy the keys with an etcd client"
        ),
    };
    let mut head = [0u8; 32];
    let n = std::io::Read::read(
        &mut std::fs::File::open(file).map_err(|e| anyhow::anyhow!("snapshot {}: {e}", file.display()))?,
        &mut head,
    )
    .map_err(|e| anyhow::anyhow!("snapshot {}: {e}", file.display()))?;
    if !head[..n].starts_with(kine_core::snapshot::MAGIC) {
        return restore_etcd(file, &path);
    }
    let bytes = std::fs::read(file).map_err(|e| anyhow::anyhow!("snapshot {}: {e}", file.display()))?;
    let snap = kine_core::snapshot::decode(&bytes).map_err(|e| anyhow::anyhow!("snapshot {}: {e}", file.display()))?;
    let (revision, live) = kine_backend_sql::restore_sqlite(&path, &snap)?;
    tracing::info!(
        snapshot = %file.display(),
        database = %path.display(),
        format = "kine-rs",
        revision,
        keys = live,
        leases = snap.leases.len(),
        "snapshot restored"
    );
    Ok(())
}

#[cfg(feature = "embedded-nats")]
fn restore_etcd(file: &Path, path: &Path) -> Result<()> {
    let s = crate::etcd_snapshot::restore(file, path)?;
    tracing::info!(
        snapshot = %file.display(),
        database = %path.display(),
        format = "etcd",
        revision = s.revision,
        compact_revision = s.compact_revision,
        versions = s.versions,
        keys = s.live,
        leases = s.leases,
        "snapshot restored"
    );
    Ok(())
}

#[cfg(not(feature = "embedded-nats"))]
fn restore_etcd(file: &Path, _: &Path) -> Result<()> {
    bail!(
        "snapshot {}: not a kine-rs snapshot; etcd's snapshots (bbolt files) are read by the Go shim, which this \
         kine-rs was built without (cargo feature embedded-nats): restore it with a default build",
        file.display()
    )
}
