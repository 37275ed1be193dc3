//! The writer lock: the object `leader-lock`, holding the writer's name, address, term and a
//! nonce. Only S3's conditional writes change it, so of any number of nodes at most one holds
//! it:
//! - no lock yet: create it (`If-None-Match: *`), term 1;
//! - the holder renews it every tick (`If-Match` its ETag, a new nonce), and stops writing once
//!   `lease - MARGIN` has passed since the start of its last successful renewal;
//! - another node takes it over (`If-Match` the ETag it saw, term + 1) only when that ETag has
//!   not changed for a whole `lease` by its own monotonic clock — never by comparing wall
//!   clocks across nodes. Since it first saw that ETag after the holder's renewal began, the
//!   holder has stopped writing before the takeover can succeed (clock rates aside, which
//!   `MARGIN` covers).
//!
//! A lost conditional write means another node got there first: the caller stops writing at
//! once. The term fences what the old writer may still upload (segment names carry it).

use bytes::Bytes;
use kine_objstore::ObjectStore;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const KEY: &str = "leader-lock";
/// The part of the lease a holder gives up to cover clock rate differences and the renewal's
/// own latency.
pub const MARGIN: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    pub address: String,
    pub term: u64,
    pub nonce: u64,
    /// The holder stopped and gave the lock up: the next node may take it at once.
    #[serde(default)]
    pub released: bool,
    /// Random per process: the holder's own record (its renewal may have been stored although
    /// its answer was lost).
    #[serde(default)]
    pub owner: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// This node may write, as `term`, until `until`.
    Writer { term: u64, until: Instant },
    /// Another node holds the lock (or nobody could be read).
    Follower { holder: Option<Holder> },
}

struct Held {
    etag: String,
    term: u64,
    until: Instant,
}

/// One node's side of the lock; `tick` it well within the lease (a third of it).
pub struct Contender {
    store: Arc<dyn ObjectStore>,
    node: String,
    address: String,
    lease: Duration,
    held: Option<Held>,
    /// The lock's ETag as last seen, and since when it has been that.
    seen: Option<(String, Instant)>,
    owner: u64,
}

fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish()
}

impl Contender {
    pub fn new(store: Arc<dyn ObjectStore>, node: &str, address: &str, lease: Duration) -> Contender {
        assert!(lease > MARGIN * 2, "a lease shorter than twice the margin cannot be held");
        Contender { store, node: node.into(), address: address.into(), lease, held: None, seen: None, owner: nonce() }
    }

    fn record(&self, term: u64) -> Bytes {
        self.record_of(term, false)
    }

    fn record_of(&self, term: u64, released: bool) -> Bytes {
        let holder = Holder {
            node: self.node.clone(),
            address: self.address.clone(),
            term,
            nonce: nonce(),
            released,
            owner: self.owner,
        };
        Bytes::from(serde_json::to_vec(&holder).expect("a holder serializes"))
    }

    /// Gives the lock up (at a clean stop), if this node still holds it: the next node takes
    /// it without waiting for the lease to run out.
    pub async fn release(&mut self) -> anyhow::Result<()> {
        if let Some(held) = self.held.take() {
            self.store.put_if_match(KEY, self.record_of(held.term, true), &held.etag).await?;
        }
        Ok(())
    }

    /// Renews, acquires or takes over the lock as the rules allow; what this node may do now.
    pub async fn tick(&mut self) -> anyhow::Result<Status> {
        // `held` stays as it is until an answer says otherwise: a renewal cancelled midway (a
        // caller's timeout) changes nothing.
        if let Some((etag, term, until)) = self.held.as_ref().map(|h| (h.etag.clone(), h.term, h.until)) {
            let started = Instant::now();
            match self.store.put_if_match(KEY, self.record(term), &etag).await {
                Ok(Some(etag)) => {
                    let until = started + self.lease - MARGIN;
                    self.held = Some(Held { etag, term, until });
                    return Ok(Status::Writer { term, until });
                }
                Ok(None) => {
                    // Taken over, unless the lock holds this process's own record: a renewal
                    // stored although its answer never came.
                    let current = self.store.get(KEY).await?;
                    let mine = current.as_ref().and_then(|c| {
                        let h: Holder = serde_json::from_slice(&c.body).ok()?;
                        (h.owner == self.owner && h.term == term && !h.released).then(|| c.etag.clone())
                    });
                    match mine {
                        Some(etag) => {
                            self.held = Some(Held { etag, term, until });
                            return Ok(Status::Writer { term, until });
                        }
                        // Taken over: stop at once.
                        None => self.held = None,
                    }
                }
                // S3 unreachable: still the writer until the lease runs out.
                Err(e) if Instant::now() < until => {
                    tracing::warn!(error = format!("{e:#}"), "cannot renew the writer lock; retrying");
                    return Ok(Status::Writer { term, until });
                }
                Err(e) => {
                    self.held = None;
                    return Err(e.context("renew the writer lock: the lease ran out"));
                }
            }
        }
        let started = Instant::now();
        let Some(current) = self.store.get(KEY).await? else {
            return Ok(match self.store.put_if_absent(KEY, self.record(1)).await? {
                Some(etag) => self.hold(etag, 1, started),
                None => Status::Follower { holder: None },
            });
        };
        let holder: Option<Holder> = serde_json::from_slice(&current.body).ok();
        let Some(holder) = holder else {
            anyhow::bail!("{KEY} holds something that is not a kine-rs writer lock: another program's object?");
        };
        let unchanged_since = match &self.seen {
            Some((etag, since)) if *etag == current.etag => *since,
            _ => {
                self.seen = Some((current.etag.clone(), started));
                started
            }
        };
        if unchanged_since.elapsed() < self.lease && !holder.released {
            return Ok(Status::Follower { holder: Some(holder) });
        }
        // The holder has not renewed for a whole lease, or gave the lock up: take over with the
        // next term.
        let term = holder.term + 1;
        let started = Instant::now();
        Ok(match self.store.put_if_match(KEY, self.record(term), &current.etag).await? {
            Some(etag) => self.hold(etag, term, started),
            None => Status::Follower { holder: Some(holder) },
        })
    }

    fn hold(&mut self, etag: String, term: u64, started: Instant) -> Status {
        let until = started + self.lease - MARGIN;
        self.seen = None;
        self.held = Some(Held { etag, term, until });
        Status::Writer { term, until }
    }
}
