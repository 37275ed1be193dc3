//! The read barrier's question, "what is the stream's last sequence now?", asked of the stream
//! leader once for every read waiting at that moment.
//!
//! A read must see every write acknowledged before it started, so it may only use an answer to a
//! request sent after it arrived. Requests go out in rounds, one at a time: a read that arrives
//! while a round is in flight waits for the next one (a read that finds none in flight sends
//! its own, without a task hop). Under load every read waits at most two
//! round trips, and NATS answers one request per round trip, whatever the number of readers.
//! The request costs the same whatever the bucket holds (the stream's state, not a message
//! lookup).
//!
//! When the NATS server in this process leads the stream, it answers without a request. A
//! replicated stream's leader may be cut off from the other replicas and not know it yet while
//! they elect another leader and take writes, or be a deposed leader whose link came back
//! before the news of its deposition: its answer counts only if it heard from a quorum of the
//! replicas within [`leader::LEASE`] (etcd's leader lease). A read-only copy takes any answer:
//! it serves as of what its mirror holds.

use super::leader::{self, LEASE};
use super::local::LocalStream;
use async_nats::jetstream;
use kine_core::{Error, Result, Revision};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

type Answer = std::result::Result<Revision, String>;

pub(super) struct Rounds {
    shared: Arc<Shared>,
}

struct Shared {
    js: jetstream::Context,
    /// The bucket's stream.
    name: String,
    /// The stream on the NATS server in this process, which answers while it leads.
    local: Option<LocalStream>,
    /// This node serves a read-only copy (see the module documentation).
    copy: AtomicBool,
    state: Mutex<State>,
    /// `(round, answer)` of the newest round answered.
    answers: watch::Sender<(u64, Answer)>,
}

#[derive(Default)]
struct State {
    /// The round that starts next.
    next: u64,
    /// The newest round somebody waits for.
    wanted: Option<u64>,
    /// A task is running rounds.
    running: bool,
}

impl Rounds {
    pub fn new(js: jetstream::Context, name: String, local: Option<LocalStream>, copy: bool) -> Rounds {
        let answers = watch::channel((0, Err("no answer yet".to_string()))).0;
        let state = Mutex::new(State { next: 1, ..State::default() });
        let copy = AtomicBool::new(copy);
        Rounds { shared: Arc::new(Shared { js, name, local, copy, state, answers }) }
    }

    /// The copy was promoted: its stream leader's answers need the lease from now on.
    pub fn promoted(&self) {
        self.shared.copy.store(false, Ordering::Relaxed);
    }

    /// The stream's last sequence, answered by the server in this process without any request,
    /// if it leads the stream (with the lease, if the stream is replicated).
    pub fn immediate(&self) -> Option<Revision> {
        self.shared.local_answer()
    }

    /// The stream's last sequence, from a leader asked after this call began.
    pub async fn last(&self) -> Result<Revision> {
        let mut answers = self.shared.answers.subscribe();
        let (round, drive) = {
            let mut st = self.shared.lock();
            st.wanted = Some(st.next);
            let round = st.next;
            if st.running {
                (round, false)
            } else {
                // Nobody is asking: this read asks itself (no task hop), claiming the round.
                st.running = true;
                st.next += 1;
                (round, true)
            }
        };
        if drive {
            let handoff = Handoff(Some(self.shared.clone()));
            let answer = self.shared.ask().await;
            self.shared.answers.send_modify(|a| *a = (round, answer));
            handoff.finish();
        }
        let answer = answers
            .wait_for(|(r, _)| *r >= round)
            .await
            .map_err(|_| Error::Unavailable("etcdserver: server stopped".into()))?
            .1
            .clone();
        answer.map_err(Error::Unavailable)
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn leased(&self, contact: Option<Duration>) -> bool {
        contact.is_none_or(|c| c <= LEASE) || self.copy.load(Ordering::Relaxed)
    }

    /// The server in this process answers if it leads the stream (with the lease).
    fn local_answer(&self) -> Option<Revision> {
        let (last, contact) = self.local.as_ref()?.head()?;
        self.leased(contact).then_some(last)
    }

    /// One round: the leader over NATS (the server in this process was asked first, by
    /// `immediate`); an answer without the lease is asked for again meanwhile.
    async fn ask(&self) -> Answer {
        let state = if self.copy.load(Ordering::Relaxed) {
            leader::stream_state(&self.js, &self.name).await
        } else {
            leader::leading_state(&self.js, &self.name).await
        };
        state.map(|s| s.last).map_err(|e| e.to_string())
    }
}

/// A read asking for its own round hands further rounds to a task: when reads that arrived
/// meanwhile wait for one, or when the read itself is dropped (a client gone) mid-request.
struct Handoff(Option<Arc<Shared>>);

impl Handoff {
    fn finish(mut self) {
        if let Some(shared) = self.0.take() {
            let mut st = shared.lock();
            if st.wanted.is_some_and(|w| w >= st.next) {
                drop(st);
                tokio::spawn(run(shared));
            } else {
                st.running = false;
            }
        }
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            tokio::spawn(run(shared));
        }
    }
}

/// Runs rounds while somebody waits for one.
async fn run(shared: Arc<Shared>) {
    loop {
        let round = {
            let mut st = shared.lock();
            if st.wanted.is_none_or(|w| w < st.next) {
                st.running = false;
                return;
            }
            st.next += 1;
            st.next - 1
        };
        let answer = shared.ask().await;
        shared.answers.send_modify(|a| *a = (round, answer));
    }
}
