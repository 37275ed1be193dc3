//! A follower's local database (`standby.rs`) as the segments are applied to it (`apply.rs`):
//! each segment as one import, except the ones it holds already (a node restarted after
//! applying segments its marker does not name yet), which are compared with its history
//! instead; and the marker (`marker.rs`) moved on as it goes, written at most once a second.

use crate::apply::{Restored, Target, Unfollowable};
use crate::marker::{self, Marker};
use crate::restore::apply;
use crate::segment::Record;
use crate::ship;
use kine_core::backend::Backend;
use kine_core::{KeyRange, Revision};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The marker is moved on at most this often while segments are applied.
const MARK_EVERY: Duration = Duration::from_secs(1);

/// The marker as the segments are applied.
pub(crate) struct Marking {
    pub(crate) path: PathBuf,
    pub(crate) marker: Marker,
    written: Option<Instant>,
    pub(crate) dirty: bool,
}

impl Marking {
    /// The marker at `path`, not read yet (an empty one, not to be written as it is).
    pub(crate) fn new(path: PathBuf) -> Marking {
        Marking { path, marker: Marker::new(0, 0), written: None, dirty: false }
    }

    /// Records that `done` was reached with the segment whose ETag is `etag`; written when due.
    async fn applied(&mut self, done: &Restored, etag: &str) -> anyhow::Result<()> {
        (self.marker.segment, self.marker.etag) = (Some(done.last_segment), Some(etag.to_string()));
        self.marker.revision = done.revision;
        self.dirty = true;
        if self.written.is_none_or(|at| at.elapsed() >= MARK_EVERY) {
            self.flush().await?;
        }
        Ok(())
    }

    /// Writes the marker if it changed since it was last written.
    pub(crate) async fn flush(&mut self) -> anyhow::Result<()> {
        if self.dirty {
            marker::write(&self.path, &self.marker).await?;
            (self.dirty, self.written) = (false, Some(Instant::now()));
        }
        Ok(())
    }
}

/// A follower's local database `backend`, with its marker, as where segments are applied.
pub(crate) struct Local<'a> {
    pub backend: &'a dyn Backend,
    pub marking: &'a mut Marking,
}

#[async_trait::async_trait]
impl Target for Local<'_> {
    async fn apply(
        &mut self,
        object: &str,
        records: Vec<Record>,
        first: Revision,
        end: Revision,
    ) -> anyhow::Result<usize> {
        standby_apply(self.backend, object, records, first, end).await
    }

    async fn applied(&mut self, done: &Restored, etag: &str) -> anyhow::Result<()> {
        self.marking.applied(done, etag).await
    }
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// Applies a segment (revisions `first..=end`) to a follower's local database, which may hold
/// it already: its import (versions and leases) is atomic, and its compaction and users come
/// after it, so a segment the database holds is checked against its history and, if it is the
/// newest it holds, its compaction and users are applied again (both idempotent). A segment
/// without revisions that ends at the newest revision held is applied again whole (its lease
/// changes are idempotent too).
async fn standby_apply(
    local: &dyn Backend,
    object: &str,
    records: Vec<Record>,
    first: Revision,
    end: Revision,
) -> anyhow::Result<usize> {
    let held = local.revisions().await.map_err(e)?.current;
    let advances = end >= first;
    if advances && end <= held {
        same_history(local, object, &records, first, end).await?;
        if end == held {
            let rest = records.into_iter().filter(|r| !matches!(r, Record::Version { .. })).collect();
            apply(local, rest, end).await?;
        }
        return Ok(0);
    }
    if end < held {
        return Ok(0);
    }
    if first <= held && advances {
        return Err(Unfollowable(format!(
            "the local database holds revisions {first}..{held} that {object} (up to {end}) has too: it holds \
             another history"
        ))
        .into());
    }
    apply(local, records, end).await
}

/// Whether `local`'s history of revisions `first..=end` is `records`' versions.
async fn same_history(
    local: &dyn Backend,
    object: &str,
    records: &[Record],
    first: Revision,
    end: Revision,
) -> anyhow::Result<()> {
    let differs = || {
        Unfollowable(format!(
            "the local database's revisions {first}..{end} are not those of {object}: it holds another history"
        ))
    };
    let held = local.events(&KeyRange::all(), first - 1, end).await.map_err(|_| differs())?;
    let held: Vec<Record> = held
        .into_iter()
        .flat_map(|c| c.events.into_iter().enumerate().map(move |(sub, ev)| ship::record(c.revision, sub, ev)))
        .collect();
    let shipped: Vec<&Record> = records.iter().filter(|r| matches!(r, Record::Version { .. })).collect();
    if held.len() != shipped.len() || held.iter().zip(shipped).any(|(a, b)| a != b) {
        return Err(differs().into());
    }
    Ok(())
}
