//! Restore: an empty store rebuilt from object storage — the newest checkpoint, then every
//! segment shipped after it, in order (`apply.rs`) — up to the newest revision shipped or to a
//! chosen one (point in time).
//!
//! A missing or damaged object stops the restore with its name. The store is written through
//! the core `Backend` API's import (the one `kine-rs migrate` uses), so revisions, sub
//! revisions and the compact revision are kept.

pub use crate::apply::Restored;
use crate::apply::{Target, apply_to};
use crate::checkpoint::Parts;
use crate::manifest;
use crate::segment::{self, Record};
use kine_core::backend::Backend;
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Event, EventKind, KeyValue, LeaseId, Revision};
use kine_objstore::ObjectStore;

/// A store being restored: each segment as one import.
struct Importing<'a>(&'a dyn Backend);

#[async_trait::async_trait]
impl Target for Importing<'_> {
    async fn apply(
        &mut self,
        _object: &str,
        records: Vec<Record>,
        _first: Revision,
        end: Revision,
    ) -> anyhow::Result<usize> {
        apply(self.0, records, end).await
    }
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// A version record as an imported version; other records are `None`.
fn imported(record: Record) -> Option<ImportedVersion> {
    let Record::Version { revision, sub, deleted, key, create_revision, version, lease, value } = record else {
        return None;
    };
    let kind = if deleted { EventKind::Delete } else { EventKind::Put };
    let kv = KeyValue { key, create_revision, mod_revision: revision, version, value, lease };
    Some(ImportedVersion { revision, sub: sub as usize, event: Event { kind, kv, prev_kv: None } })
}

/// Applies `records` to `target` as one import ending at `revision`.
pub(crate) async fn apply(target: &dyn Backend, records: Vec<Record>, revision: Revision) -> anyhow::Result<usize> {
    let (mut versions, mut add_leases, mut remove_leases) = (Vec::new(), Vec::<(LeaseId, i64)>::new(), Vec::new());
    let (mut compact, mut auth) = (None, None);
    for record in records {
        match record {
            Record::Version { .. } => versions.extend(imported(record)),
            Record::LeaseGrant { id, ttl } => {
                remove_leases.retain(|r| *r != id);
                add_leases.push((id, ttl));
            }
            Record::LeaseRevoke { id } => {
                add_leases.retain(|(a, _)| *a != id);
                remove_leases.push(id);
            }
            Record::LeasesReset => {
                add_leases.clear();
                remove_leases = target.leases().await.map_err(e)?.into_iter().map(|(id, _)| id).collect();
            }
            Record::Compact { revision } => compact = Some(revision),
            Record::Auth { data } => auth = Some(data),
            Record::Committed { .. } => {}
        }
    }
    let n = versions.len();
    let import = Import { versions, revision, add_leases, remove_leases };
    target.write(WriteOp::Import(import)).await.map_err(e)?;
    if let Some(c) = compact.filter(|c| *c <= revision) {
        // A checkpoint restored is compacted at its revision already.
        if target.revisions().await.map_err(e)?.compacted < c {
            target.compact(c).await.map_err(e)?;
        }
    }
    if let Some(data) = auth {
        let current = target.auth_record().await.map_err(e)?;
        if !target.auth_replace(current.map(|c| c.version), data).await.map_err(e)? {
            anyhow::bail!("the restored store's users and roles changed during the restore: is it served?");
        }
    }
    Ok(n)
}

/// Rebuilds the empty store `target` from `store`, up to revision `until` (`None`: all of it).
pub async fn restore(
    store: &dyn ObjectStore,
    target: &dyn Backend,
    until: Option<Revision>,
) -> anyhow::Result<Restored> {
    let until = until.unwrap_or(Revision::MAX);
    let mut done = restore_checkpoint(store, target, until).await?;
    let names = segments_after(store, done.last_segment).await?;
    apply_to(store, &names, &mut done, until, &mut Importing(target)).await?;
    if until != Revision::MAX && done.revision < until {
        anyhow::bail!("revision {until} was never shipped: the newest is {}", done.revision);
    }
    Ok(done)
}

/// The first step of a restore into the empty store `target`: the newest checkpoint at or
/// before `until`, if the prefix holds one.
pub(crate) async fn restore_checkpoint(
    store: &dyn ObjectStore,
    target: &dyn Backend,
    until: Revision,
) -> anyhow::Result<Restored> {
    let revisions = target.revisions().await.map_err(e)?;
    if revisions.current > 1 {
        anyhow::bail!("the store to restore into is at revision {}: it must be empty", revisions.current);
    }
    let Some((manifest, _)) = manifest::read(store, None).await? else {
        anyhow::bail!("no kine-rs store here: the prefix holds no {}", manifest::KEY);
    };
    let mut done = Restored { revision: 1, ..Restored::default() };
    // The newest checkpoint at or before `until`.
    let kept = [&manifest.checkpoint, &manifest.previous];
    let chosen = kept.iter().filter_map(|c| c.as_ref()).find(|c| c.revision <= until);
    if chosen.is_none()
        && let Some(oldest) = kept.iter().filter_map(|c| c.as_ref()).map(|c| c.revision).min()
    {
        anyhow::bail!("revision {until} is before the oldest checkpoint kept ({oldest}): it cannot be restored");
    }
    if let Some(checkpoint) = chosen {
        let mut parts = Parts::new(store, checkpoint);
        while let Some(records) = parts.next().await? {
            done.versions += apply(target, records, checkpoint.revision).await?;
        }
        (done.revision, done.checkpoint, done.last_segment) =
            (checkpoint.revision, Some(checkpoint.revision), checkpoint.after_segment);
    }
    Ok(done)
}

/// The segments after `after` (term, number), sorted.
///
/// A listing may leave out an object written while it ran and show one written after it (an
/// S3-compatible server that lists a directory as it changes: versitygw did, under a follower
/// listing every ship interval beside a `--s3-sync` writer). A writer creates the segments of
/// its term one after the other, so one missing before a later one of its term that is listed
/// is looked up by name; only one that is not there is missing (removed by a checkpoint, or
/// lost), and the application names it.
pub(crate) async fn segments_after(store: &dyn ObjectStore, after: (u64, u64)) -> anyhow::Result<Vec<(u64, u64)>> {
    let listed = store.list_after("wal/", &segment::object_name(after.0, after.1)).await?;
    let mut names: Vec<(u64, u64)> =
        listed.iter().filter_map(|n| segment::parse_name(n)).filter(|n| *n > after).collect();
    names.sort();
    let mut whole = Vec::with_capacity(names.len());
    let mut previous = after;
    for name in names {
        if name.0 == previous.0 {
            for n in previous.1 + 1..name.1 {
                if store.get(&segment::object_name(name.0, n)).await?.is_none() {
                    break;
                }
                whole.push((name.0, n));
            }
        }
        whole.push(name);
        previous = name;
    }
    Ok(whole)
}
