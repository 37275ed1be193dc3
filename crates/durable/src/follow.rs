//! A node starting while another holds the S3 writer lock: it serves a read-only copy of the
//! store ([`Following`]) brought up to date every ship interval, keeps its local database
//! current with it (`standby.rs`: filled from the checkpoint in the background first, then
//! each round's segments), asks for the lock every quarter of its lease, and once it has the
//! lock applies the segments its local database does not hold yet, switches the server to it
//! and ships from then on.

use crate::apply::Unfollowable;
use crate::backend::Durable;
use crate::copy::Copy;
use crate::following::{Following, origin};
use crate::lock::{Contender, Status};
use crate::manifest;
use crate::node::{self, Started};
use crate::options::Options;
use crate::runner::Runner;
use crate::standby::{Holds, Standby};
use kine_core::backend::Backend;
use kine_objstore::ObjectStore;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How a node begins.
pub enum Begun {
    /// It holds the writer lock: serve `Started::handle`'s store and run its runner.
    Writer(Started),
    /// Another node does: serve the wrapper and run the follower, which takes over later.
    Following(Arc<Following>, Follower),
}

pub struct Follower {
    store: Arc<dyn ObjectStore>,
    local: Local,
    following: Arc<Following>,
    copy: Arc<Copy>,
    lock: Contender,
    options: Options,
    sync: bool,
}

/// Where the local database is while the node follows.
enum Local {
    /// Not kept current: this node's own store (it ships from it once it holds the lock).
    Idle(Box<Standby>),
    /// Being filled from the checkpoint and the segments since; `stop` ends the task after the
    /// attempt under way.
    Filling { task: JoinHandle<Standby>, stop: watch::Sender<bool> },
    /// Kept current by the copy's rounds.
    Attached,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// Takes the writer lock if it is free ([`node::start_held`]); else opens a copy of the store
/// to serve until it is. `local` is the database this node writes once it holds the lock; a
/// follower keeps it current with the store meanwhile (unless it is this node's own store).
pub async fn begin(
    store: Arc<dyn ObjectStore>,
    mut local: Standby,
    options: &Options,
    sync: bool,
) -> anyhow::Result<Begun> {
    let mut lock = Contender::new(store.clone(), &options.node, &options.address, options.lease);
    let mut told = false;
    loop {
        let holder = match lock.tick().await? {
            Status::Writer { term, until } => {
                let started = node::start_held(store, local, options, lock, term, until).await?;
                return Ok(Begun::Writer(started));
            }
            Status::Follower { holder } => holder,
        };
        let Some(holder) = holder else {
            tokio::time::sleep(options.lease / 4).await;
            continue;
        };
        // The local database is not served while following; one of another store is refused now
        // rather than at the takeover, and a follower's that cannot go on is emptied.
        if let Some((m, _)) = manifest::read(store.as_ref(), None).await? {
            local.examine(store.as_ref(), Some(&m)).await?;
        }
        let leases = tokio::sync::broadcast::channel(kine_core::backend::FEED_CAPACITY).0;
        match Copy::open(store.clone(), leases.clone()).await? {
            Some(copy) => {
                let copy = Arc::new(copy);
                let (revision, _) = copy.position().await;
                let cluster_id = copy.cluster_id();
                let origin = origin(&holder.node, &holder.address);
                let backend = local.backend();
                let following =
                    Following::new(copy.clone(), backend.as_ref(), cluster_id, origin, leases).await.map_err(e)?;
                tracing::info!(
                    writer = %holder.node,
                    address = %holder.address,
                    term = holder.term,
                    revision,
                    "another kine-rs holds the S3 writer lock; serving a read-only copy of the store until its lease runs out"
                );
                let local = match local.holds() {
                    Holds::Own => Local::Idle(Box::new(local)),
                    _ => {
                        let stop = watch::channel(false).0;
                        let task = tokio::spawn(fill(local, store.clone(), stop.subscribe(), options.ship_interval));
                        Local::Filling { task, stop }
                    }
                };
                let follower =
                    Follower { store, local, following: following.clone(), copy, lock, options: options.clone(), sync };
                return Ok(Begun::Following(following, follower));
            }
            None if !told => {
                tracing::info!(writer = %holder.node, "the S3 writer has not stored the store's manifest yet; waiting");
                told = true;
            }
            None => {}
        }
        tokio::time::sleep(options.lease / 4).await;
    }
}

impl Follower {
    /// Follows until this node holds the writer lock, then switches the server to the local
    /// database and returns the runner that ships it; `None` if `stop` came first.
    pub async fn run(mut self, stop: &mut (impl Future<Output = ()> + Unpin)) -> anyhow::Result<Option<Runner>> {
        let result = self.follow(stop).await;
        match result {
            Ok(Some((term, until))) => self.take_over(term, until).await.map(Some),
            other => {
                if let Some(standby) = self.local().await {
                    standby.close().await;
                }
                other.map(|_| None)
            }
        }
    }

    /// Follows until this node holds the writer lock (as `term`, until `until`); `None` if
    /// `stop` came first.
    async fn follow(
        &mut self,
        stop: &mut (impl Future<Output = ()> + Unpin),
    ) -> anyhow::Result<Option<(u64, Instant)>> {
        let poll = self.options.ship_interval.min(self.options.lease / 4);
        let mut ticked = Instant::now();
        let mut failing = false;
        loop {
            tokio::select! {
                _ = &mut *stop => return Ok(None),
                _ = tokio::time::sleep(poll) => {}
            }
            if ticked.elapsed() >= self.options.lease / 4 {
                ticked = Instant::now();
                match self.lock.tick().await {
                    Ok(Status::Writer { term, until }) => return Ok(Some((term, until))),
                    Ok(Status::Follower { holder: Some(h) }) => self.following.set_origin(origin(&h.node, &h.address)),
                    Ok(Status::Follower { holder: None }) => {}
                    Err(err) => tracing::debug!(error = format!("{err:#}"), "cannot read the S3 writer lock"),
                }
            }
            if let Local::Filling { task, .. } = &mut self.local
                && task.is_finished()
            {
                let standby = task.await?;
                if let Some(at) = standby.position() {
                    tracing::info!(
                        revision = at.revision,
                        "the local database holds the S3 store: it is kept current, and a takeover applies only the \
                         segments after it"
                    );
                }
                self.copy.attach(standby);
                self.local = Local::Attached;
            }
            match self.copy.catch_up().await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("following the S3 store again");
                }
                Ok(_) => {}
                Err(err) if err.downcast_ref::<Unfollowable>().is_some() => {
                    anyhow::bail!(
                        "the read-only copy cannot follow the S3 store any more: {err:#}; restart to rebuild it"
                    )
                }
                Err(err) => {
                    if !failing {
                        tracing::warn!(error = format!("{err:#}"), "cannot follow the S3 store; retrying");
                    }
                    failing = true;
                }
            }
        }
    }

    /// The local database, taken from whatever kept it (a fill still running stops where it is).
    async fn local(&mut self) -> Option<Standby> {
        match std::mem::replace(&mut self.local, Local::Attached) {
            Local::Idle(standby) => Some(*standby),
            Local::Filling { task, stop } => {
                // The attempt under way ends first (a takeover would make the same one).
                stop.send_replace(true);
                task.await.ok()
            }
            Local::Attached => self.copy.detach().await,
        }
    }

    async fn take_over(mut self, term: u64, until: Instant) -> anyhow::Result<Runner> {
        let began = Instant::now();
        let local = self.local().await.ok_or_else(|| anyhow::anyhow!("the local database's keeper ended"))?;
        let started = node::start_held(self.store, local, &self.options, self.lock, term, until).await?;
        let writer: Arc<dyn Backend> =
            Arc::new(Durable::new(started.backend.clone(), started.handle.clone(), self.sync, self.options.read_wait));
        self.following.take_over(writer).await;
        tracing::info!(
            term,
            revision = *started.handle.shipped.borrow(),
            elapsed_ms = began.elapsed().as_millis() as u64,
            "took the S3 writer lock: this node now writes"
        );
        Ok(started.runner)
    }
}

/// Fills the local database from the checkpoint and the segments since (in the background,
/// while the copy is served), retrying after errors, until it is done or `stop` says so. An
/// attempt is never cut short (a write to the database would go on without it): `stop` is
/// looked at between attempts.
async fn fill(
    mut standby: Standby,
    store: Arc<dyn ObjectStore>,
    mut stop: watch::Receiver<bool>,
    pause: std::time::Duration,
) -> Standby {
    let mut told = false;
    loop {
        match standby.catch_up(store.as_ref()).await {
            Err(err) => {
                if !told {
                    tracing::warn!(error = format!("{err:#}"), "cannot fill the local database from S3; retrying");
                    told = true;
                }
            }
            Ok(_) => return standby,
        }
        if *stop.borrow() {
            return standby;
        }
        let stopped = tokio::select! {
            _ = tokio::time::sleep(pause) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopped {
            return standby;
        }
    }
}
