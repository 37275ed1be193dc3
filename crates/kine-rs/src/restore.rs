//! `kine-rs snapshot restore FILE`: a snapshot into a new SQLite datastore.

use crate::endpoint::{self, Endpoint};
use anyhow::{Context, Result, bail};
use std::path::Path;

pub fn run(endpoint: &str, file: &Path) -> Result<()> {
    let path = match endpoint::parse(endpoint).map_err(|e| anyhow::anyhow!("--endpoint: {e}"))? {
        Endpoint::Sqlite { path } => path,
        _ => bail!(
            "--endpoint: snapshot restore writes a new SQLite database (sqlite://PATH); to move data into another \
             datastore, restore into SQLite, serve it, and copy the keys with an etcd client"
        ),
    };
    let bytes = std::fs::read(file).with_context(|| format!("read snapshot {}", file.display()))?;
    let snap = kine_core::snapshot::decode(&bytes).map_err(|e| anyhow::anyhow!("snapshot {}: {e}", file.display()))?;
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
