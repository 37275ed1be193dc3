//! One question for everybody waiting: callers that each need a fresh answer (the datastore's
//! current revision, asked for every watch progress request) share the requests.
//!
//! A caller may only use an answer to a request sent after it arrived, so that the answer is
//! at least as new as anything committed before the call. Requests go out in rounds, one at a
//! time: a caller that finds no round in flight sends its own (without a task hop); one that
//! arrives while a round is in flight waits for the next, which starts when that one ends. Under
//! load every caller waits at most two round trips, and the datastore answers one request per
//! round trip, whatever the number of callers.
//!
//! The caller that sent a request gets its answer or its error as the request returned it.
//! The others, when a round failed, either ask again alone ([`Failed::AskAlone`]: each gets
//! its own error, with its kind, or its answer if the datastore is back) or take the failure
//! as `Unavailable` with its text ([`Failed::Unavailable`]: one failed request per round
//! during an outage, however many callers wait).

use crate::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

type Ask<T> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<T>> + Send>> + Send + Sync>;

/// What a caller waiting for a round does when the round's request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// It sends a request of its own.
    AskAlone,
    /// It fails with `Error::Unavailable` and the failed request's error text.
    Unavailable,
}

pub struct Rounds<T> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    ask: Ask<T>,
    failed: Failed,
    state: Mutex<State>,
    /// `(round, answer)` of the newest round answered, or the text of its error.
    answers: watch::Sender<(u64, std::result::Result<T, String>)>,
}

#[derive(Default)]
struct State {
    /// The round that starts next.
    next: u64,
    /// The newest round somebody waits for.
    wanted: Option<u64>,
    /// A task (or a caller) is running rounds.
    running: bool,
}

impl<T: Clone + Send + Sync + 'static> Rounds<T> {
    /// Rounds of the request `ask` makes; `failed` says what waiting callers do when one fails.
    pub fn new<F, Fut>(failed: Failed, ask: F) -> Rounds<T>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let ask: Ask<T> = Box::new(move || Box::pin(ask()));
        let state = Mutex::new(State { next: 1, ..State::default() });
        let answers = watch::channel((0, Err("no answer yet".to_string()))).0;
        Rounds { shared: Arc::new(Shared { ask, failed, state, answers }) }
    }

    /// An answer to a request sent after this call began.
    pub async fn get(&self) -> Result<T> {
        let mut answers = self.shared.answers.subscribe();
        let (round, drive) = {
            let mut st = self.shared.lock();
            st.wanted = Some(st.next);
            let round = st.next;
            if st.running {
                (round, false)
            } else {
                st.running = true;
                st.next += 1;
                (round, true)
            }
        };
        if drive {
            let handoff = Handoff(Some(self.shared.clone()));
            let answer = (self.shared.ask)().await;
            let shared = answer.as_ref().cloned().map_err(|e| e.to_string());
            self.shared.answers.send_modify(|a| *a = (round, shared));
            handoff.finish();
            return answer;
        }
        // (The sender lives as long as `self`: waiting ends with an answer.)
        let answered = match answers.wait_for(|(r, _)| *r >= round).await {
            Ok(a) => a.1.clone(),
            Err(_) => Err("no answer".to_string()),
        };
        match (answered, self.shared.failed) {
            (Ok(answer), _) => Ok(answer),
            (Err(_), Failed::AskAlone) => (self.shared.ask)().await,
            (Err(text), Failed::Unavailable) => Err(Error::Unavailable(text)),
        }
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A caller that asked for its own round hands further rounds to a task: when callers that
/// arrived meanwhile wait for one, or when the caller itself is dropped (a client gone)
/// mid-request.
struct Handoff<T: Clone + Send + Sync + 'static>(Option<Arc<Shared<T>>>);

impl<T: Clone + Send + Sync + 'static> Handoff<T> {
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

impl<T: Clone + Send + Sync + 'static> Drop for Handoff<T> {
    fn drop(&mut self) {
        // (No runtime: it is shutting down, and nobody is left to wait.)
        if let (Some(shared), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(run(shared));
        }
    }
}

/// Runs rounds while somebody waits for one.
async fn run<T: Clone + Send + Sync + 'static>(shared: Arc<Shared<T>>) {
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
        let answer = (shared.ask)().await.map_err(|e| e.to_string());
        shared.answers.send_modify(|a| *a = (round, answer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::time::Duration;

    /// A datastore whose revision moves on by one per write; each request takes 20 ms.
    fn store() -> (Arc<AtomicI64>, Arc<AtomicU64>, Rounds<i64>) {
        let (revision, asked) = (Arc::new(AtomicI64::new(1)), Arc::new(AtomicU64::new(0)));
        let (r, a) = (revision.clone(), asked.clone());
        let rounds = Rounds::new(Failed::AskAlone, move || {
            let (r, a) = (r.clone(), a.clone());
            async move {
                a.fetch_add(1, Ordering::SeqCst);
                // The answer is read when the request reaches the datastore, at its start.
                let now = r.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(now)
            }
        });
        (revision, asked, rounds)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_caller_sees_what_was_written_before_it_and_callers_share_requests() {
        let (revision, asked, rounds) = store();
        let rounds = Arc::new(rounds);
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (revision, rounds) = (revision.clone(), rounds.clone());
            tasks.push(tokio::spawn(async move {
                let mut calls = 0;
                for _ in 0..10 {
                    let written = revision.fetch_add(1, Ordering::SeqCst) + 1;
                    let seen = rounds.get().await.unwrap();
                    assert!(seen >= written, "a caller saw {seen} after {written} was written");
                    calls += 1;
                }
                calls
            }));
        }
        let mut calls = 0;
        for t in tasks {
            calls += t.await.unwrap();
        }
        let asked = asked.load(Ordering::SeqCst);
        assert!(asked * 5 < calls, "{asked} requests for {calls} calls: not shared");
    }

    /// Five callers at once on a datastore that times out: the first sends a request, the four
    /// others wait for the next round, which fails too.
    async fn five_callers_on_a_failing_store(failed: Failed) -> (Vec<Result<i64>>, u64) {
        let asked = Arc::new(AtomicU64::new(0));
        let a = asked.clone();
        let rounds: Rounds<i64> = Rounds::new(failed, move || {
            let a = a.clone();
            async move {
                a.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(Error::TimedOut)
            }
        });
        let (r1, r2, r3, r4, r5) = tokio::join!(rounds.get(), rounds.get(), rounds.get(), rounds.get(), rounds.get());
        (vec![r1, r2, r3, r4, r5], asked.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn after_a_failed_round_each_waiting_caller_asks_alone_and_gets_its_own_error() {
        let (results, asked) = five_callers_on_a_failing_store(Failed::AskAlone).await;
        assert!(results.iter().all(|r| matches!(r, Err(Error::TimedOut))), "{results:?}");
        assert_eq!(asked, 6, "two rounds, then the four waiting callers alone");
    }

    #[tokio::test]
    async fn a_failed_round_fails_its_waiting_callers_as_unavailable_without_more_requests() {
        let (results, asked) = five_callers_on_a_failing_store(Failed::Unavailable).await;
        assert!(matches!(results[0], Err(Error::TimedOut)), "the first caller gets its own error");
        for r in &results[1..] {
            assert!(matches!(r, Err(Error::Unavailable(m)) if m == "request timed out"), "{r:?}");
        }
        assert_eq!(asked, 2, "one request per round");
    }
}
