//! A node's local database on its way to being the store it writes: a follower keeps it
//! current with the S3 store as it waits for the writer lock (each segment applied to it as to
//! the read-only copy, which it is never served instead of), so that a takeover applies only the
//! segments shipped after the last it holds, whatever the time since the last checkpoint.
//!
//! Such a database holds nothing of its own, only the store's history up to a segment: the
//! marker beside it (`marker.rs`) says so, and which segment. A node that starts on it again goes
//! on from there; one that cannot (the segments after it were removed by later checkpoints, the
//! folder holds another store, it applied a segment its writer uploaded after losing the lock,
//! a restore from the checkpoint did not finish) empties it and fills it from the checkpoint
//! again, which loses nothing. A database without a marker is a writer's (this node's own
//! store, checked as today) or another store's (refused). The marker goes once the node writes
//! the database: from then on it is the store.

use crate::apply::{Decoded, Given, Restored, Sink, Unfollowable, apply_segments, apply_to};
use crate::manifest::{self, Manifest};
use crate::marker::{self, Marker};
use crate::restore::{restore_checkpoint, segments_after};
use crate::segment;
use crate::standby_apply::{Local, Marking};
use kine_core::Revision;
use kine_core::backend::Backend;
use kine_objstore::ObjectStore;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Empties the local database: closes the one given, removes its files, opens a new one.
pub type Reset = Arc<
    dyn Fn(Arc<dyn Backend>) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Arc<dyn Backend>>> + Send>>
        + Send
        + Sync,
>;

/// What the local database holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holds {
    /// Nothing yet.
    Nothing,
    /// This node's own store (the manifest names it, or the prefix is empty): it was the
    /// writer, and may hold revisions not shipped.
    Own,
    /// The S3 store's history up to this position, as a follower applied it.
    Prefix(Restored),
    /// A follower's database that cannot go on from where it is (why): emptied before use.
    Stale(String),
}

/// The segments a follower's round fetched (`copy.rs`), listed after the copy's position `from`,
/// for the local database.
pub(crate) struct Batch {
    pub from: (u64, u64),
    pub names: Vec<(u64, u64)>,
    pub fetched: Vec<((u64, u64), Decoded)>,
}

/// What a catch-up did.
#[derive(Clone, Debug)]
pub struct CaughtUp {
    pub restored: Restored,
    /// Segments applied by this catch-up.
    pub segments: usize,
    /// Whether it started from the checkpoint (the database held nothing it could go on from).
    pub from_checkpoint: bool,
}

pub struct Standby {
    backend: Arc<dyn Backend>,
    reset: Reset,
    marking: Marking,
    holds: Holds,
    examined: bool,
    /// Rounds are failing (said once).
    failing: bool,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

impl Standby {
    /// The local database `backend`, its marker at `marker` (`marker::path_for`), and how to
    /// empty it.
    pub fn new(backend: Arc<dyn Backend>, marker: PathBuf, reset: Reset) -> Standby {
        let marking = Marking::new(marker);
        Standby { backend, reset, marking, holds: Holds::Nothing, examined: false, failing: false }
    }

    /// The local database (another one after it was emptied).
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn holds(&self) -> &Holds {
        &self.holds
    }

    /// Finds what the local database holds of the prefix's store (`manifest`; `None`: the prefix
    /// is empty), once; a follower's database that cannot go on is emptied now. A database of
    /// another store is refused.
    pub async fn examine(&mut self, store: &dyn ObjectStore, manifest: Option<&Manifest>) -> anyhow::Result<()> {
        if self.examined {
            return Ok(());
        }
        let local = self.backend.cluster_id();
        let found = marker::read(&self.marking.path)?;
        let stray = found.is_some();
        let marker = found.filter(|m| m.database == local);
        let empty = self.backend.revisions().await.map_err(e)?.current <= 1;
        self.holds = match (manifest, marker.clone()) {
            (Some(m), _) if m.cluster_id == local => Holds::Own,
            (_, Some(marker)) => match lineage(store, manifest, &marker).await? {
                Ok(at) => Holds::Prefix(at),
                Err(why) => Holds::Stale(why),
            },
            _ if empty => Holds::Nothing,
            (Some(m), None) => anyhow::bail!(
                "the S3 prefix holds another store (cluster id {:x}; the local database is {local:x}): point this \
                 node at its own prefix, or move the local database away to restore it from the prefix",
                m.cluster_id
            ),
            (None, None) => Holds::Own,
        };
        if let (Holds::Prefix(at), Some(marker)) = (&self.holds, marker) {
            self.marking.marker = marker;
            tracing::info!(
                revision = at.revision,
                "the local database holds the S3 store's history up to this revision"
            );
        } else if stray {
            // The marker of another database, or of this one once it became the store.
            marker::remove(&self.marking.path).await?;
        }
        if let Holds::Stale(why) = &self.holds {
            let why = why.clone();
            self.start_afresh(&why).await?;
        }
        self.examined = true;
        Ok(())
    }

    /// Empties the local database.
    async fn start_afresh(&mut self, why: &str) -> anyhow::Result<()> {
        tracing::info!(reason = why, "the local database follows the S3 store no more: emptied, to be filled again");
        self.backend = (self.reset)(self.backend.clone())
            .await
            .map_err(|err| anyhow::anyhow!("cannot empty the local database: {err:#}"))?;
        marker::remove(&self.marking.path).await?;
        (self.holds, self.marking.dirty) = (Holds::Nothing, false);
        Ok(())
    }

    /// Brings the local database up to the prefix's newest segment: from where it is, or (if it
    /// holds nothing it can go on from) from the newest checkpoint, emptied first.
    pub async fn catch_up(&mut self, store: &dyn ObjectStore) -> anyhow::Result<CaughtUp> {
        for attempt in 0.. {
            match &self.holds {
                Holds::Own => anyhow::bail!("the local database is this node's own store, not a follower's"),
                Holds::Stale(why) => {
                    let why = why.clone();
                    self.start_afresh(&why).await?;
                }
                Holds::Nothing | Holds::Prefix(_) => {}
            }
            match self.try_catch_up(store).await {
                Err(err) if attempt == 0 && err.downcast_ref::<Unfollowable>().is_some() => {
                    self.holds = Holds::Stale(format!("{err:#}"));
                }
                done => return done,
            }
        }
        unreachable!()
    }

    async fn try_catch_up(&mut self, store: &dyn ObjectStore) -> anyhow::Result<CaughtUp> {
        let from_checkpoint = self.holds == Holds::Nothing;
        if from_checkpoint {
            let Some((m, _)) = manifest::read(store, None).await? else {
                anyhow::bail!("no kine-rs store here: the prefix holds no {}", manifest::KEY);
            };
            // The marker first: a database left half filled is emptied at the next start.
            self.marking.marker = Marker::new(self.backend.cluster_id(), m.cluster_id);
            self.marking.dirty = true;
            self.marking.flush().await?;
            self.holds = Holds::Stale("its restore from the checkpoint did not finish".into());
            let done = restore_checkpoint(store, self.backend.as_ref(), Revision::MAX).await?;
            let marker = &mut self.marking.marker;
            (marker.segment, marker.etag, marker.revision) = (Some(done.last_segment), None, done.revision);
            self.marking.dirty = true;
            self.marking.flush().await?;
            self.holds = Holds::Prefix(done);
        }
        let Standby { backend, marking, holds: Holds::Prefix(done), .. } = self else { unreachable!() };
        let before = done.segments;
        let names = segments_after(store, done.last_segment).await?;
        let mut local = Local { backend: backend.as_ref(), marking };
        apply_to(store, &names, done, Revision::MAX, &mut local).await?;
        let held = backend.revisions().await.map_err(e)?.current;
        if held != done.revision {
            return Err(Unfollowable(format!(
                "the local database is at revision {held}, the S3 store's history ends at {}: it holds revisions \
                 the store does not",
                done.revision
            ))
            .into());
        }
        marking.flush().await?;
        Ok(CaughtUp { restored: done.clone(), segments: done.segments - before, from_checkpoint })
    }

    /// Where the local database is, if it holds a prefix of the store.
    pub fn position(&self) -> Option<&Restored> {
        match &self.holds {
            Holds::Prefix(at) => Some(at),
            _ => None,
        }
    }

    /// Applies each batch of segments a follower's rounds fetched, in order, until the rounds
    /// stop sending them; returns the database.
    pub(crate) async fn feed(mut self, store: Arc<dyn ObjectStore>, mut batches: mpsc::Receiver<Batch>) -> Standby {
        while let Some(batch) = batches.recv().await {
            self.apply_batch(store.as_ref(), batch).await;
        }
        self
    }

    /// Applies a round's segments; the ones before them it does not hold (a batch left out, an
    /// error) are listed and fetched.
    async fn apply_batch(&mut self, store: &dyn ObjectStore, batch: Batch) {
        let Standby { backend, marking, holds: Holds::Prefix(done), .. } = self else { return };
        let names = if done.last_segment < batch.from {
            match crate::restore::segments_after(store, done.last_segment).await {
                Ok(names) => names,
                Err(err) => return self.after_round(Some(err)),
            }
        } else {
            batch.names
        };
        let given: Given = batch.fetched.into_iter().collect();
        let mut local = Local { backend: &**backend, marking };
        let mut sinks = [Sink::new(&mut local, done, Revision::MAX)];
        apply_segments(store, &names, &given, &mut sinks, false).await;
        let failed = sinks[0].failed.take();
        self.after_round(failed);
    }

    /// After a batch: `failed`, why the local database took no more segments, if it did.
    fn after_round(&mut self, failed: Option<anyhow::Error>) {
        match failed {
            None if self.failing => {
                self.failing = false;
                tracing::info!("the local database follows the S3 store again");
            }
            None => {}
            Some(err) if err.downcast_ref::<Unfollowable>().is_some() => {
                tracing::warn!(
                    error = format!("{err:#}"),
                    "the local database cannot follow the S3 store from where it is: it is filled from the checkpoint \
                     again if this node takes over"
                );
                self.holds = Holds::Stale(format!("{err:#}"));
            }
            Some(err) => {
                if !self.failing {
                    tracing::warn!(
                        error = format!("{err:#}"),
                        "cannot apply the S3 store's segments to the local database; retrying"
                    );
                }
                self.failing = true;
            }
        }
    }

    /// From now on the local database is the store this node writes: the marker goes.
    pub async fn adopt(&mut self) -> anyhow::Result<()> {
        marker::remove(&self.marking.path).await?;
        (self.holds, self.marking.dirty) = (Holds::Own, false);
        Ok(())
    }

    /// Writes the marker where the database is, and closes the database (a node that stops
    /// while following).
    pub async fn close(mut self) {
        if matches!(self.holds, Holds::Prefix(_))
            && let Err(err) = self.marking.flush().await
        {
            tracing::warn!(error = format!("{err:#}"), "cannot write the standby marker");
        }
        self.backend.close().await;
    }
}

/// Whether the database `marker` describes can go on with the prefix's store (`manifest`): from
/// its position, or the reason it cannot.
async fn lineage(
    store: &dyn ObjectStore,
    manifest: Option<&Manifest>,
    marker: &Marker,
) -> anyhow::Result<Result<Restored, String>> {
    let Some(m) = manifest else { return Ok(Err("the S3 prefix holds no store any more".into())) };
    let Some(last) = marker.segment else {
        return Ok(Err("its restore from the checkpoint did not finish".into()));
    };
    let object = segment::object_name(last.0, last.1);
    // Still there and unchanged: the store goes on from it, whatever its cluster id is now
    // (another node may have taken over meanwhile). Gone (removed by a checkpoint): the same
    // store's segments after it may still be there.
    let unchanged = match &marker.etag {
        Some(etag) => store.get(&object).await?.map(|o| o.etag == *etag),
        None => None,
    };
    Ok(match unchanged {
        Some(true) => Ok(Restored { revision: marker.revision, last_segment: last, ..Restored::default() }),
        None if m.cluster_id == marker.store => {
            Ok(Restored { revision: marker.revision, last_segment: last, ..Restored::default() })
        }
        Some(false) => Err(format!("{object} is not the segment it applied: the prefix holds another store")),
        None => Err(format!("the prefix holds another store now and {object}, the last segment it applied, is gone")),
    })
}
