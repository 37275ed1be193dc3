//! The read barrier: a read waits until the replica holds every message that any node may have
//! served before the read began, which is at least every write acknowledged before it.
//!
//! The question "how far must the replica be?" is asked of the stream leader once for every
//! read waiting at that moment. A read may only use an answer to a request sent after it
//! arrived. Requests go out in rounds (`kine_core::rounds`), one at a time: a read that arrives
//! while a round is in flight waits for the next one (a read that finds none in flight sends
//! its own, without a task hop). Under load every read waits at most two round trips, and NATS
//! answers one request per round trip, whatever the number of readers.
//!
//! A replicated stream's followers store a committed entry as soon as they learn of the
//! commit, possibly before the leader's own apply stores it, and another node may read them
//! (its consumer is served by a follower) and serve it. So the leader's stored last sequence is
//! not enough: the answer is the newest sequence the leader accepted (`proposed`), or, from the
//! server in this process when it leads, its stored last sequence once it has applied
//! everything committed when the question began (`local`).
//!
//! A replicated stream's leader may be cut off from the other replicas and not know it yet
//! while they elect another leader and take writes, or be a deposed leader whose link came back
//! before the news of its deposition: its answer counts only if it heard from a quorum of the
//! replicas within [`leader::LEASE`] (etcd's leader lease). A read-only copy takes any answer:
//! it serves as of what its mirror holds.
//!
//! A primary connected to a standalone nats-server that holds the stream (no other replica)
//! asks a cheaper question of the stream itself: see `direct`.

use super::direct::Direct;
use super::leader::{self, LEASE};
use super::local::LocalStream;
use super::proposed::{self, Proposed};
use super::{Inner, NATS_TIMEOUT};
use async_nats::jetstream;
use kine_core::rounds::{self, Failed};
use kine_core::{Error, Result, Revision};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A barrier's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Head {
    /// The leader's stored last sequence: messages up to it exist (the replica's gap checks
    /// may count on it).
    pub stored: Revision,
    /// What the replica must reach before the read is served (at least `stored`; above it by
    /// the leader's proposals in flight, which may not exist yet).
    pub bound: Revision,
}

impl Head {
    fn stored(last: Revision) -> Head {
        Head { stored: last, bound: last }
    }
}

pub(super) struct Rounds {
    /// The stream on the NATS server in this process, which answers while it leads.
    local: Option<LocalStream>,
    /// This node serves a read-only copy (see the module documentation).
    copy: Arc<AtomicBool>,
    /// The requests to the stream leader (a failed one fails the reads that waited for it:
    /// during an outage NATS gets one request per round, not one per read).
    rounds: rounds::Rounds<Head>,
}

/// What a round needs to ask.
struct Asker {
    js: jetstream::Context,
    /// The stream's name.
    name: String,
    /// A subject the stream takes, for the proposal question.
    subject: String,
    copy: Arc<AtomicBool>,
    direct: Direct,
    /// The stream had other replicas at the last answer (so the proposal question goes out
    /// beside STREAM.INFO); true until an answer says otherwise.
    replicated: AtomicBool,
}

impl Rounds {
    pub fn new(
        js: jetstream::Context,
        name: String,
        subject: String,
        local: Option<LocalStream>,
        copy: bool,
    ) -> Rounds {
        let copy = Arc::new(AtomicBool::new(copy));
        let direct = Direct::new(js.client(), &name);
        let asker =
            Arc::new(Asker { js, name, subject, copy: copy.clone(), direct, replicated: AtomicBool::new(true) });
        let rounds = rounds::Rounds::new(Failed::Unavailable, move || {
            let asker = asker.clone();
            async move { asker.ask().await }
        });
        Rounds { local, copy, rounds }
    }

    /// The copy was promoted: its stream leader's answers need the lease from now on.
    pub fn promoted(&self) {
        self.copy.store(false, Ordering::Relaxed);
    }

    /// The barrier's answer from the server in this process without any request, if it leads
    /// the stream (with the lease, if the stream is replicated).
    pub async fn local(&self) -> Option<Head> {
        let (last, contact) = self.local.as_ref()?.head().await?;
        let leased = contact.is_none_or(|c: Duration| c <= LEASE) || self.copy.load(Ordering::Relaxed);
        leased.then_some(Head::stored(last))
    }

    /// The barrier's answer, from a leader asked after this call began.
    pub async fn ask(&self) -> Result<Head> {
        self.rounds.get().await
    }
}

impl Asker {
    /// One round: the stream itself over NATS if `direct` may ask, else its leader (the server
    /// in this process was asked first, by `local`); an answer without the lease is asked for
    /// again meanwhile.
    async fn ask(&self) -> Result<Head> {
        let down = |e: Error| Error::Unavailable(e.to_string());
        if self.copy.load(Ordering::Relaxed) {
            return leader::stream_state(&self.js, &self.name).await.map(|s| Head::stored(s.last)).map_err(down);
        }
        if let Some(last) = self.direct.last().await {
            return Ok(Head::stored(last));
        }
        let replicated = self.replicated.load(Ordering::Relaxed);
        let proposal = async { if replicated { Some(self.proposed().await) } else { None } };
        let (state, proposal) = tokio::join!(leader::leading_state(&self.js, &self.name), proposal);
        let state = state.map_err(down)?;
        self.direct.confirm(state.here);
        self.replicated.store(state.contact.is_some(), Ordering::Relaxed);
        let proposal = match proposal {
            Some(p) => p,
            // Replicated since the last answer: asked now, after.
            None if state.contact.is_some() => self.proposed().await,
            None => return Ok(Head::stored(state.last)),
        };
        let proposed = match proposal? {
            Proposed::Last(n) => n,
            Proposed::Unknown(why) => {
                // Only the stored sequence to go by: a full stream, say, refuses every publish
                // before the expectation is looked at.
                tracing::debug!(
                    why,
                    "the stream leader named no proposal bound; the read barrier takes its stored sequence"
                );
                state.last
            }
        };
        if proposed > state.last {
            kine_core::metrics::metrics().barrier_waits.with_label_values(&["proposals"]).inc();
        }
        Ok(Head { stored: state.last, bound: proposed.max(state.last) })
    }

    /// The leader's newest accepted sequence (asked while the cluster elects a leader, as the
    /// leader's other questions are).
    async fn proposed(&self) -> Result<Proposed> {
        proposed::ask(&self.js.client(), &self.subject).await.map_err(|e| Error::Unavailable(e.to_string()))
    }
}

/// How long a read waits for the replica to reach a round's bound before it asks again: a
/// proposal the bound counted may never be stored (its leader lost office, or its apply failed),
/// and a newer answer leaves it out.
const ASK_AGAIN: Duration = Duration::from_millis(500);

impl Inner {
    /// Linearizability: waits until the replica holds everything any node may have served
    /// before this call, every acknowledged write included. Costs one shared request to the
    /// leader (see the module documentation), whatever the bucket holds, or none when the
    /// leader is the server in this process. A copy serves as of the newest revision its
    /// mirror holds completely (a batch the mirror has only part of is not waited for).
    pub(super) async fn barrier(&self) -> Result<()> {
        self.check_open()?;
        let started = Instant::now();
        let reached = if self.is_copy() { &self.delivered } else { &self.applied };
        loop {
            let head = match self.rounds.local().await {
                Some(head) => head,
                None => self.rounds.ask().await?,
            };
            self.target.send_if_modified(|t| {
                let newer = head.stored > *t;
                *t = (*t).max(head.stored);
                newer
            });
            let remaining = NATS_TIMEOUT.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
            let step = if head.bound > head.stored { remaining.min(ASK_AGAIN) } else { remaining };
            match Self::wait_for(reached, head.bound, step).await {
                Ok(()) => break,
                Err(_) if step < remaining => {
                    tracing::debug!(
                        bound = head.bound,
                        stored = head.stored,
                        "the replica has not reached the barrier's bound; asking again"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let elapsed = started.elapsed();
        if elapsed >= self.slow {
            tracing::warn!(elapsed_ms = elapsed.as_millis() as u64, "slow NATS read barrier");
        }
        Ok(())
    }
}
