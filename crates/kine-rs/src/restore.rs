//! `kine-rs snapshot restore FILE`: a snapshot into a new SQLite datastore. The file is etcd's
//! (a bbolt file, as etcd and kine-rs save it) or kine-rs's own earlier format.

use crate::endpoint::{self, Endpoint};
use anyhow::{Result, bail};
use std::path::Path;

pub fn run(endpoint: &str, file: &Path) -> Result<()> {
    let path = match endpoint::parse(endpoint).map_err(|e| anyhow::anyhow!("--endpoint: {e}"))? {
        Endpoint::Sqlite { path } => path,
        _ => bail!(
            "--endpoint: snapshot restore writes a new SQLite database (sqlite://PATH); to move data into another \
             datastore, restore into SQLite, serve it, and copy the keys with an etcd client"
        ),
    };
    let snap = read(file).map_err(|e| anyhow::anyhow!("snapshot {}: {e}", file.display()))?;
    kine_backend_sql::restore_sqlite(&path, &snap)?;
    tracing::info!(
        snapshot = %file.display(),
        database = %path.display(),
        revision = snap.revision,
        keys = snap.kvs.len(),
        leases = snap.leases.len(),
        "snapshot restored"
    );
    Ok(())
}

fn read(file: &Path) -> Result<kine_core::snapshot::Snapshot, String> {
    let mut head = [0u8; 32];
    let n = std::io::Read::read(&mut std::fs::File::open(file).map_err(|e| e.to_string())?, &mut head)
        .map_err(|e| e.to_string())?;
    if !head[..n].starts_with(kine_core::snapshot::MAGIC) {
        return read_etcd(file);
    }
    let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
    kine_core::snapshot::decode(&bytes)
}

#[cfg(feature = "embedded-nats")]
fn read_etcd(file: &Path) -> Result<kine_core::snapshot::Snapshot, String> {
    crate::etcd_snapshot::read(file)
}

#[cfg(not(feature = "embedded-nats"))]
fn read_etcd(_: &Path) -> Result<kine_core::snapshot::Snapshot, String> {
    Err("not a kine-rs snapshot; etcd's snapshots (bbolt files) are read by the Go shim, which this kine-rs \
         was built without (cargo feature embedded-nats): restore it with a default build"
        .into())
}
