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

use super::leader::{self, StreamState};
use async_nats::jetstream;
use kine_core::{Error, Result};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

type Answer = std::result::Result<StreamState, String>;

pub(super) struct Rounds {
    shared: Arc<Shared>,
}

struct Shared {
    js: jetstream::Context,
    /// The bucket's stream.
    name: String,
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
    pub fn new(js: jetstream::Context, name: String) -> Rounds {
        let answers = watch::channel((0, Err("no answer yet".to_string()))).0;
        let state = Mutex::new(State { next: 1, ..State::default() });
        Rounds { shared: Arc::new(Shared { js, name, state, answers }) }
    }

    /// The stream's state, from a request sent after this call began.
    pub async fn stream_state(&self) -> Result<StreamState> {
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
            let answer = leader::stream_state(&self.shared.js, &self.shared.name).await.map_err(|e| e.to_string());
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
        let answer = leader::stream_state(&shared.js, &shared.name).await.map_err(|e| e.to_string());
        shared.answers.send_modify(|a| *a = (round, answer));
    }
}
