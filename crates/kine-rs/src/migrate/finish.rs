//! After the keys: the history since the target's revision, the leases, the auth record,
//! then the verification of the whole copy (any target).

use super::progress::Progress;
use super::{WINDOW, count, digest, e};
use anyhow::{Context, Result, bail};
use kine_core::backend::Backend;
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Event, KeyRange, Revision};
use std::collections::HashMap;

/// The history after the target's revision up to `until`, the leases, the auth record, then
/// the verification.
pub(super) async fn finish(
    source: &dyn Backend,
    target: &dyn Backend,
    until: Revision,
    started: std::time::Instant,
) -> Result<()> {
    copy_history(source, target, until).await?;
    copy_leases(source, target).await?;
    copy_auth(source, target).await?;
    verify(source, target, until, started).await
}

/// Every change after the target's revision up to `until`.
async fn copy_history(source: &dyn Backend, target: &dyn Backend, until: Revision) -> Result<()> {
    let mut after = target.revisions().await.map_err(e)?.current;
    let mut progress = Progress::new("copying the history", "revisions", (until - after).max(0) as u64);
    while after < until {
        let to = (after + WINDOW).min(until);
        let changes = source.events(&KeyRange::all(), after, to).await.map_err(|err| match err {
            kine_core::Error::Compacted { compact_revision } => anyhow::anyhow!(
                "--from was compacted at revision {compact_revision} while its history after {after} was being copied; \
                 run migrate again (an empty --to if the copy cannot continue)"
            ),
            other => e(other),
        })?;
        let versions = changes
            .into_iter()
            .flat_map(|c| {
                c.events.into_iter().enumerate().map(move |(sub, ev)| ImportedVersion {
                    revision: c.revision,
                    sub,
                    event: Event { kind: ev.kind, kv: ev.kv, prev_kv: None },
                })
            })
            .collect();
        let import = Import { versions, revision: to, add_leases: vec![], remove_leases: vec![] };
        target.write(WriteOp::Import(import)).await.map_err(e).context("write into --to")?;
        progress.advance((to - after) as u64);
        after = to;
    }
    progress.finish();
    Ok(())
}

/// The target's leases become the source's (a lease's time left starts again from its TTL
/// when the copy is served, as after any restart).
async fn copy_leases(source: &dyn Backend, target: &dyn Backend) -> Result<()> {
    let want: HashMap<_, _> = source.leases().await.map_err(e)?.into_iter().collect();
    let have: HashMap<_, _> = target.leases().await.map_err(e)?.into_iter().collect();
    let add_leases: Vec<_> = want.iter().filter(|(id, ttl)| have.get(id) != Some(ttl)).map(|(i, t)| (*i, *t)).collect();
    let remove_leases: Vec<_> = have.iter().filter(|(id, ttl)| want.get(id) != Some(ttl)).map(|(i, _)| *i).collect();
    if add_leases.is_empty() && remove_leases.is_empty() {
        return Ok(());
    }
    let revision = target.revisions().await.map_err(e)?.current;
    let import = Import { versions: vec![], revision, add_leases, remove_leases };
    target.write(WriteOp::Import(import)).await.map_err(e).context("write the leases into --to")?;
    Ok(())
}

/// Users, roles and the auth switch.
async fn copy_auth(source: &dyn Backend, target: &dyn Backend) -> Result<()> {
    let Some(record) = source.auth_record().await.map_err(e)? else { return Ok(()) };
    let current = target.auth_record().await.map_err(e)?;
    if current.as_ref().is_some_and(|c| c.data == record.data) {
        return Ok(());
    }
    if !target.auth_replace(current.map(|c| c.version), record.data).await.map_err(e)? {
        bail!("--to's users and roles changed while they were being copied: is a kine-rs serving --to?");
    }
    Ok(())
}

async fn verify(
    source: &dyn Backend,
    target: &dyn Backend,
    revision: Revision,
    started: std::time::Instant,
) -> Result<()> {
    let (s, t) = (source.revisions().await.map_err(e)?, target.revisions().await.map_err(e)?);
    if t.current != revision {
        bail!("--to is at revision {} after the copy, not {revision}: is a kine-rs serving --to?", t.current);
    }
    let from = s.compacted.max(t.compacted);
    if from > revision {
        bail!(
            "--from was compacted past the copied revision {revision} meanwhile: run migrate again to verify the copy"
        );
    }
    let (a, versions) = digest::history(source, &KeyRange::all(), from, revision).await?;
    let (b, _) = digest::history(target, &KeyRange::all(), from, revision).await?;
    if a != b {
        bail!("verification failed: --to's history from revision {from} to {revision} differs from --from's");
    }
    let hash = kine_core::snapshot::hash(source, revision, None).await.map_err(e)?;
    let copied = kine_core::snapshot::hash(target, revision, None).await.map_err(e)?;
    if hash != copied {
        bail!(
            "verification failed: the keys at revision {revision} hash to {hash:08x} on --from, {copied:08x} on --to"
        );
    }
    tracing::info!(
        revision,
        compact_revision = t.compacted,
        versions,
        keys = count(target, revision).await?,
        leases = target.leases().await.map_err(e)?.len(),
        hash = format!("{hash:08x}"),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "copied and verified: --to holds --from's history up to this revision"
    );
    Ok(())
}
