//! The read barrier's question, "what is the stream's last sequence now?", asked of the stream
//! leader once for every read waiting at that moment.
//!
//! A read must see every write acknowledged before it started, so it may only use an answer to a
//! request sent after it arrived. Requests go out in rounds (`kine_core::rounds`), one at a
//! time: a read that arrives while a round is in flight waits for the next one (a read that
//! finds none in flight sends its own, without a task hop). Under load every read waits at most
//! two round trips, and NATS answers one request per round trip, whatever the number of readers.
//! The request costs the same whatever the bucket holds (the stream's state, not a message
//! lookup).
//!
//! When the NATS server in this process leads the stream, it answers without a request. A
//! replicated stream's leader may be cut off from the other replicas and not know it yet while
//! they elect another leader and take writes, or be a deposed leader whose link came back
//! before the news of its deposition: its answer counts only if it heard from a quorum of the
//! replicas within [`leader::LEASE`] (etcd's leader lease). A read-only copy takes any answer:
//! it serves as of what its mirror holds.
//!
//! A primary connected to a standalone nats-server that holds the stream (no other replica)
//! asks a cheaper question of the stream itself: see `direct`.

use super::direct::Direct;
use super::leader::{self, LEASE};
use super::local::LocalStream;
use async_nats::jetstream;
use kine_core::rounds::{self, Failed};
use kine_core::{Error, Result, Revision};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(super) struct Rounds {
    /// The stream on the NATS server in this process, which answers while it leads.
    local: Option<LocalStream>,
    /// This node serves a read-only copy (see the module documentation).
    copy: Arc<AtomicBool>,
    /// The requests to the stream leader (a failed one fails the reads that waited for it:
    /// during an outage NATS gets one request per round, not one per read).
    rounds: rounds::Rounds<Revision>,
}

impl Rounds {
    pub fn new(js: jetstream::Context, name: String, local: Option<LocalStream>, copy: bool) -> Rounds {
        let copy = Arc::new(AtomicBool::new(copy));
        let asking = copy.clone();
        let direct = Arc::new(Direct::new(js.client(), &name));
        let rounds = rounds::Rounds::new(Failed::Unavailable, move || {
            let (js, name, copy, direct) = (js.clone(), name.clone(), asking.load(Ordering::Relaxed), direct.clone());
            async move { ask(&js, &name, copy, &direct).await }
        });
        Rounds { local, copy, rounds }
    }

    /// The copy was promoted: its stream leader's answers need the lease from now on.
    pub fn promoted(&self) {
        self.copy.store(false, Ordering::Relaxed);
    }

    /// The stream's last sequence, answered by the server in this process without any request,
    /// if it leads the stream (with the lease, if the stream is replicated).
    pub fn immediate(&self) -> Option<Revision> {
        let (last, contact) = self.local.as_ref()?.head()?;
        let leased = contact.is_none_or(|c: Duration| c <= LEASE) || self.copy.load(Ordering::Relaxed);
        leased.then_some(last)
    }

    /// The stream's last sequence, from a leader asked after this call began.
    pub async fn last(&self) -> Result<Revision> {
        self.rounds.get().await
    }
}

/// One round: the stream itself over NATS if `direct` may ask, else its leader (the server in
/// this process was asked first, by `immediate`); an answer without the lease is asked for
/// again meanwhile.
async fn ask(js: &jetstream::Context, name: &str, copy: bool, direct: &Direct) -> Result<Revision> {
    if copy {
        return leader::stream_state(js, name).await.map(|s| s.last).map_err(|e| Error::Unavailable(e.to_string()));
    }
    if let Some(last) = direct.last().await {
        return Ok(last);
    }
    let state = leader::leading_state(js, name).await.map_err(|e| Error::Unavailable(e.to_string()))?;
    direct.confirm(state.here);
    Ok(state.last)
}
