//! Applying the segments shipped after a position, in order, to one store or several at once
//! (a follower's copy and its local database share each segment fetched): what a restore does
//! after its checkpoint, what a follower does with the segments shipped since it last looked,
//! and what a takeover does with the segments its local database does not hold yet.
//!
//! Every revision must follow the one before and every segment number the one before it (from
//! 1 in each term): a segment that does not (a missing object) stops that store's application
//! with what is missing named ([`Unfollowable`]), as does a damaged object. How a store takes
//! a segment that follows on is up to the store (`Target`); where it is, is a [`Restored`].

use crate::segment::{self, Record, Segment};
use futures_util::StreamExt;
use kine_core::Revision;
use kine_objstore::ObjectStore;
use std::collections::HashMap;
use std::sync::Arc;

/// Segments fetched at once by a restore or a follower's catch-up.
const FETCH_AHEAD: usize = 16;

/// The segments cannot be applied after what was applied: one is missing (removed by a
/// checkpoint, or lost), or one repeats revisions already applied. A follower that meets this
/// cannot go on from where it is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unfollowable(pub String);

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
    /// `NextTerms`).
    pub zombies: usize,
}

/// Where segments are applied, and how: a store being restored, each segment as one import
/// (`restore.rs`); a follower's local database, each segment as one import except the ones it
/// holds already, which are compared with its history instead, the marker moved on as it goes
/// (`standby_apply.rs`); a follower's copy, each revision as committed (`copy.rs`).
#[async_trait::async_trait]
pub(crate) trait Target: Send {
    /// Applies the records of segment `object` (revisions `first..=end`; the versions after
    /// `end` are left out already) to the store; returns the versions applied.
    async fn apply(
        &mut self,
        object: &str,
        records: Vec<Record>,
        first: Revision,
        end: Revision,
    ) -> anyhow::Result<usize>;

    /// The segment whose ETag is `etag` was applied, and took the store to `done`.
    async fn applied(&mut self, _done: &Restored, _etag: &str) -> anyhow::Result<()> {
        Ok(())
    }
}

/// One store the segments go to, with where it is.
pub(crate) struct Sink<'a> {
    pub target: &'a mut dyn Target,
    pub done: &'a mut Restored,
    /// Revisions after this one are not applied (point in time).
    pub until: Revision,
    /// Why this store stopped taking segments, if it did: the others go on.
    pub failed: Option<anyhow::Error>,
    next_terms: NextTerms,
}

impl<'a> Sink<'a> {
    pub fn new(target: &'a mut dyn Target, done: &'a mut Restored, until: Revision) -> Sink<'a> {
        Sink { target, done, until, failed: None, next_terms: NextTerms::default() }
    }

    fn wants(&self, name: (u64, u64)) -> bool {
        self.failed.is_none() && self.done.revision < self.until && name > self.done.last_segment
    }
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

/// A segment fetched and decoded, with its ETag.
pub(crate) type Decoded = Arc<(Segment, String)>;

/// Segments fetched already (by an earlier application), by name: not fetched again.
pub(crate) type Given = HashMap<(u64, u64), Decoded>;

type Fetched = (usize, (u64, u64), String, anyhow::Result<Decoded>);

/// Segment `name` (the `i`th to apply), decoded, and its object name.
fn fetch<'a>(
    store: &'a dyn ObjectStore,
    given: &'a Given,
    i: usize,
    name: (u64, u64),
) -> std::pin::Pin<Box<dyn Future<Output = Fetched> + Send + 'a>> {
    Box::pin(async move {
        let object = segment::object_name(name.0, name.1);
        if let Some(decoded) = given.get(&name) {
            return (i, name, object, Ok(decoded.clone()));
        }
        let decoded = match store.get(&object).await {
            Ok(Some(body)) => Segment::decode(&body.body)
                .map(|segment| Arc::new((segment, body.etag)))
                .map_err(|err| anyhow::anyhow!("{object}: {err}")),
            Ok(None) => Err(anyhow::anyhow!("{object} vanished while it was read")),
            Err(err) => Err(err),
        };
        (i, name, object, decoded)
    })
}

/// Applies the segments `names` (sorted) to each sink in order, each from after its own
/// position, up to its `until`. A sink that fails keeps the error in `failed` and takes no more
/// segments; the others go on. Each segment is fetched once (`FETCH_AHEAD` at a time: a
/// restore of many small segments, one per upload under --s3-sync, waits for S3 once per
/// batch, not once per segment), unless `given`. With `keep`, returns the segments fetched (for
/// another store to apply later without fetching them again).
pub(crate) async fn apply_segments(
    store: &dyn ObjectStore,
    names: &[(u64, u64)],
    given: &Given,
    sinks: &mut [Sink<'_>],
    keep: bool,
) -> Vec<((u64, u64), Decoded)> {
    let mut kept = Vec::new();
    let mut fetched = futures_util::stream::iter(names.iter().copied().enumerate())
        .map(|(i, name)| fetch(store, given, i, name))
        .buffered(FETCH_AHEAD);
    while let Some((i, name, object, decoded)) = fetched.next().await {
        if !sinks.iter().any(|s| s.failed.is_none() && s.done.revision < s.until) {
            break;
        }
        if let (true, Ok(decoded)) = (keep, &decoded) {
            kept.push((name, decoded.clone()));
        }
        for sink in sinks.iter_mut().filter(|s| s.wants(name)) {
            if let Err(err) = offer(store, sink, &names[i..], &object, &decoded).await {
                sink.failed = Some(err);
            }
        }
    }
    kept
}

/// [`apply_segments`] to one store; its error, if it failed.
pub(crate) async fn apply_to(
    store: &dyn ObjectStore,
    names: &[(u64, u64)],
    done: &mut Restored,
    until: Revision,
    target: &mut dyn Target,
) -> anyhow::Result<()> {
    let mut sinks = [Sink::new(target, done, until)];
    apply_segments(store, names, &Given::new(), &mut sinks, false).await;
    match sinks[0].failed.take() {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Applies `segment`, the first of `names`, to `sink` after checking it follows on.
async fn offer(
    store: &dyn ObjectStore,
    sink: &mut Sink<'_>,
    names: &[(u64, u64)],
    object: &str,
    decoded: &anyhow::Result<Decoded>,
) -> anyhow::Result<()> {
    let name = names[0];
    let done = &mut *sink.done;
    if sink.next_terms.superseded(store, names, done.revision + 1).await? {
        let empty = |d: &Decoded| {
            let s = &d.0;
            matches!(s.records.last(), Some(Record::Committed { revision }) if *revision < s.first_revision)
        };
        if decoded.as_ref().is_ok_and(empty) {
            // No revision in it: its lease, user and compaction changes are in the next term's
            // first segment, which carries them whole. Late or not, nothing is lost.
            tracing::debug!(object = %object, "skipped a segment without revisions before the next term's first");
        } else {
            // Uploaded by a writer that had lost the lock (its upload reached S3 only after
            // the next writer had started from what was there): nothing in it was acknowledged.
            tracing::warn!(object = %object, "skipped a segment its writer uploaded after losing the writer lock");
            done.zombies += 1;
        }
        return Ok(());
    }
    let (segment, etag) = &**decoded.as_ref().map_err(|err| anyhow::anyhow!("{err:#}"))?;
    let Some(Record::Committed { revision: last }) = segment.records.last().cloned() else {
        anyhow::bail!("{object} does not end with its commit record: damaged");
    };
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
    let end = last.min(sink.until);
    let records: Vec<Record> = segment
        .records
        .iter()
        .filter(|r| !matches!(r, Record::Version { revision, .. } if *revision > end))
        .cloned()
        .collect();
    done.versions += sink.target.apply(object, records, segment.first_revision, end).await?;
    (done.revision, done.last_segment) = (end, name);
    done.segments += 1;
    sink.target.applied(done, etag).await?;
    Ok(())
}
