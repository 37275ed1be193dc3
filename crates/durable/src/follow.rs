//! A node starting while another holds the S3 writer lock: it serves a read-only copy of the
//! store ([`Following`]) brought up to date every ship interval, asks for the lock every quarter
//! of its lease, and once it has the lock restores the store into its local database (as any
//! standby does), switches the server to it and ships from then on.

use crate::backend::Durable;
use crate::copy::Copy;
use crate::following::{Following, origin};
use crate::lock::{Contender, Status};
use crate::manifest;
use crate::node::{self, Options, Runner, Started};
use crate::restore::Unfollowable;
use kine_core::backend::Backend;
use kine_objstore::ObjectStore;
use std::sync::Arc;
use std::time::Instant;

/// How a node begins.
pub enum Begun {
    /// It holds the writer lock: serve `Started::handle`'s store and run its runner.
    Writer(Started),
    /// Another node does: serve the wrapper and run the follower, which takes over later.
    Following(Arc<Following>, Follower),
}

pub struct Follower {
    store: Arc<dyn ObjectStore>,
    local: Arc<dyn Backend>,
    following: Arc<Following>,
    copy: Arc<Copy>,
    lock: Contender,
    options: Options,
    sync: bool,
}

fn e(err: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// Takes the writer lock if it is free ([`node::start_held`]); else opens a copy of the store
/// to serve until it is. `local` is the database this node writes once it holds the lock; a
/// follower keeps it untouched meanwhile.
pub async fn begin(
    store: Arc<dyn ObjectStore>,
    local: Arc<dyn Backend>,
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
        // rather than at the takeover.
        if local.revisions().await.map_err(e)?.current > 1
            && let Some((m, _)) = manifest::read(store.as_ref(), None).await?
            && m.cluster_id != local.cluster_id()
        {
            anyhow::bail!(
                "the S3 prefix holds another store (cluster id {:x}; the local database is {:x}): point this node at \
                 its own prefix, or move the local database away to follow and restore from the prefix",
                m.cluster_id,
                local.cluster_id()
            );
        }
        let leases = tokio::sync::broadcast::channel(kine_core::backend::FEED_CAPACITY).0;
        match Copy::open(store.clone(), leases.clone()).await? {
            Some(copy) => {
                let copy = Arc::new(copy);
                let (revision, _) = copy.position().await;
                let cluster_id = copy.cluster_id();
                let origin = origin(&holder.node, &holder.address);
                let following =
                    Following::new(copy.clone(), local.as_ref(), cluster_id, origin, leases).await.map_err(e)?;
                tracing::info!(
                    writer = %holder.node,
                    address = %holder.address,
                    term = holder.term,
                    revision,
                    "another kine-rs holds the S3 writer lock; serving a read-only copy of the store until its lease runs out"
                );
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
                    Ok(Status::Writer { term, until }) => return self.take_over(term, until).await.map(Some),
                    Ok(Status::Follower { holder: Some(h) }) => self.following.set_origin(origin(&h.node, &h.address)),
                    Ok(Status::Follower { holder: None }) => {}
                    Err(err) => tracing::debug!(error = format!("{err:#}"), "cannot read the S3 writer lock"),
                }
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

    async fn take_over(self, term: u64, until: Instant) -> anyhow::Result<Runner> {
        let began = Instant::now();
        let started = node::start_held(self.store, self.local.clone(), &self.options, self.lock, term, until).await?;
        let writer: Arc<dyn Backend> =
            Arc::new(Durable::new(self.local, started.handle.clone(), self.sync, self.options.read_wait));
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
