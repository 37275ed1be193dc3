//! The read barrier's question, "what is the stream's last sequence now?", asked of the stream
//! leader once for every read waiting at that moment.
//!
//! A read must see every write acknowledged before it started, so it may only use an answer to a
//! request sent after it arrived. Requests go out in rounds, one at a time: a read that arrives
//! while a round is in flight waits for the next one. Under load every read waits at most two
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
        let round = {
            let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            st.wanted = Some(st.next);
            if !st.running {
                st.running = true;
                tokio::spawn(run(self.shared.clone()));
            }
            st.next
        };
        let answer = answers
            .wait_for(|(r, _)| *r >= round)
            .await
            .map_err(|_| Error::Unavailable("etcdserver: server stopped".into()))?
            .1
            .clone();
        answer.map_err(Error::Unavailable)
    }
}

/// Runs rounds while somebody waits for one.
async fn run(shared: Arc<Shared>) {
    loop {
        let round = {
            let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
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
