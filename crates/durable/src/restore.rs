//! Restore: an empty store rebuilt from object storage — the newest checkpoint, then every
//! segment shipped after it, in order — up to the newest revision shipped or to a chosen one
//! (point in time).
//!
//! Every revision must follow the one before and every segment number the one before it (from
//! 1 in each term): a segment that does not (a missing object) stops the restore with what is
//! missing named, as does a damaged object. The store is written through the core `Backend` API's import (the
//! one `kine-rs migrate` uses), so revisions, sub revisions and the compact revision are kept.

use crate::checkpoint::Parts;
use crate::manifest;
use crate::segment::{self, Record, Segment};
use futures_util::StreamExt;
use kine_core::backend::Backend;
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Event, EventKind, KeyValue, LeaseId, Revision};
use kine_objstore::ObjectStore;

/// What a restore did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// The store's revision afterwards.
    pub revision: Revision,
    /// The checkpoint started from, if any.
    pub checkpoint: Option<Revision>,
    pub segments: usize,
    pub versions: usize,
    /// The last segment applied: (term, number).
    pub last_segment: (u64, u64),
    /// Segments skipped: uploaded by a writer after the next term had started (see
    /// [`NextTerms`]).
    pub zombies: usize,
}

/// Where each term's history starts: the first revision of its segment 1. A writer that lost
/// the lock may still have had an upload in flight, which S3 completed after the next writer
/// had read the prefix and started its term from the revision before it: that segment of the
/// old term starts at or after the new term's first revision, and is not part of the history.
#[derive(Default)]
struct NextTerms {
    /// Term → the first revision of its segment 1 (`None`: no segment 1 listed).
    first: std::collections::HashMap<u64, Option<Revision>>,
}

impl NextTerms {
    /// Whether `names[0]`, next in line and to start at `revision`, belongs to a term a later
    /// one superseded from that revision on (`names`: the segments still to apply, sorted).
    async fn superseded(
        &mut self,
        store: &dyn ObjectStore,
        names: &[(u64, u64)],
        revision: Revision,
    ) -> anyhow::Result<bool> {
        let term = names[0].0;
        let Some(&(later, _)) = names.iter().find(|n| n.0 > term) else { return Ok(false) };
        let first = match self.first.get(&later) {
            Some(first) => *first,
            None => {
                let first = if names.contains(&(later, 1)) {
                    let object = segment::object_name(later, 1);
                    let body = store.get(&object).await?.ok_or_else(|| anyhow::anyhow!("{object} vanished"))?;
                    Some(Segment::decode(&body.body).map_err(|err| anyhow::anyhow!("{object}: {err}"))?.first_revision)
                } else {
                    None
                };
                self.first.insert(later, first);
                first
            }
        };
        Ok(first.is_some_and(|first| revision >= first))
    }
}

type Fetched = (usize, (u64, u64), String, anyhow::Result<Option<kine_objstore::Object>>);

/// Segment `name` (the `i`th to apply) and its object name.
fn fetch(
    store: &dyn ObjectStore,
    i: usize,
    name: (u64, u64),
) -> std::pin::Pin<Box<dyn Future<Output = Fetched> + Send + '_>> {
    Box::pin(async move {
        let object = segment::object_name(name.0, name.1);
        let body = store.get(&object).await;
        (i, name, object, body)
    })
}

/// Segments fetched at once by a restore or a follower's catch-up.
const FETCH_AHEAD: usize = 16;

/// Where segments are applied.
pub(crate) enum Target<'a> {
    /// A store being restored: each segment as one import.
    Import(&'a dyn Backend),
    /// A follower's copy: each revision as committed (see `copy`).
    Copy(&'a kine_core::memory::MemoryBackend, &'a tokio::sync::broadcast::Sender<kine_core::backend::LeaseUpdate>),
}

/// The segments cannot be applied after what was applied: one is missing (removed by a
/// checkpoint, or lost), or one repeats revisions already applied. A follower that meets this
/// cannot go on from where it is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unfollowable(pub String);

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
async fn apply(target: &dyn Backend, records: Vec<Record>, revision: Revision) -> anyhow::Result<usize> {
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
    apply_segments(store, &names, &mut done, until, Target::Import(target)).await?;
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
pub(crate) async fn segments_after(store: &dyn ObjectStore, after: (u64, u64)) -> anyhow::Result<Vec<(u64, u64)>> {
    let listed = store.list_after("wal/", &segment::object_name(after.0, after.1)).await?;
    let mut names: Vec<(u64, u64)> =
        listed.iter().filter_map(|n| segment::parse_name(n)).filter(|n| *n > after).collect();
    names.sort();
    Ok(names)
}

/// Applies the segments `names` (sorted, all after `done.last_segment`) to `target` in order,
/// up to revision `until`, advancing `done`: what a restore does after its checkpoint, and what
/// a follower does with the segments shipped since it last looked.
pub(crate) async fn apply_segments(
    store: &dyn ObjectStore,
    names: &[(u64, u64)],
    done: &mut Restored,
    until: Revision,
    target: Target<'_>,
) -> anyhow::Result<()> {
    let mut next_terms = NextTerms::default();
    // Fetched FETCH_AHEAD at a time, applied in order: a restore of many small segments (one
    // per upload under --s3-sync) waits for S3 once per batch, not once per segment.
    let mut fetched = futures_util::stream::iter(names.iter().copied().enumerate())
        .map(|(i, name)| fetch(store, i, name))
        .buffered(FETCH_AHEAD);
    while let Some((i, name, object, body)) = fetched.next().await {
        if done.revision >= until {
            break;
        }
        if next_terms.superseded(store, &names[i..], done.revision + 1).await? {
            // Uploaded by a writer that had lost the lock (its upload reached S3 only after the
            // next writer had started from what was there): nothing in it was acknowledged.
            tracing::warn!(object = %object, "skipped a segment its writer uploaded after losing the writer lock");
            done.zombies += 1;
            continue;
        }
        // Numbers run from 1 in each term without a gap: a missing segment that carried no
        // revision (a lease or auth change) is found too.
        let expected = if name.0 == done.last_segment.0 { done.last_segment.1 + 1 } else { 1 };
        if name.1 != expected {
            return Err(Unfollowable(format!(
                "{} is missing (the segments of term {} go on with {object}): revisions or lease changes are missing",
                segment::object_name(name.0, expected),
                name.0
            ))
            .into());
        }
        let body = body?.ok_or_else(|| anyhow::anyhow!("{object} vanished during the restore"))?;
        let segment = Segment::decode(&body.body).map_err(|err| anyhow::anyhow!("{object}: {err}"))?;
        if segment.term != name.0 {
            anyhow::bail!("{object} says it is of term {}: damaged or misplaced", segment.term);
        }
        if segment.first_revision <= done.revision {
            return Err(Unfollowable(format!(
                "{object} starts at revision {}, which the store holds already (up to {}): a segment its writer \
                 uploaded after losing the writer lock was applied before the next term's first segment was seen",
                segment.first_revision, done.revision
            ))
            .into());
        }
        if segment.first_revision != done.revision + 1 {
            return Err(Unfollowable(format!(
                "{object} starts at revision {}, the revisions before it end at {}: revisions {}..{} are missing",
                segment.first_revision,
                done.revision,
                done.revision + 1,
                segment.first_revision - 1
            ))
            .into());
        }
        let Some(Record::Committed { revision: last }) = segment.records.last().cloned() else {
            anyhow::bail!("{object} does not end with its commit record: damaged");
        };
        let end = last.min(until);
        let records = segment
            .records
            .into_iter()
            .filter(|r| !matches!(r, Record::Version { revision, .. } if *revision > end))
            .collect();
        done.versions += match &target {
            Target::Import(backend) => apply(*backend, records, end).await?,
            Target::Copy(replica, leases) => crate::copy::apply_committed(replica, leases, records, end).await?,
        };
        (done.revision, done.last_segment) = (end, name);
        done.segments += 1;
    }
    Ok(())
}
