//! The removal thread of a network database (PostgreSQL, MySQL): a compaction's logical step
//! (`removal.rs`) runs on the node's writer, whose connection is open and warm, like a write;
//! the removal that follows runs here, on a connection of its own, so that writes go on while
//! it runs. The thread resumes a removal that a previous process left unfinished, retries a
//! failed batch every few seconds, and answers a compaction asked for with `physical` once the
//! removal covering it is done.

use crate::removal::{Removal, Waiters};
use crate::writer::Reply;
use kine_core::{Error, Revision};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a failed removal batch waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// One database's SQL for the two steps of a compaction.
pub trait Compaction: Send + 'static {
    type Conn: Send + 'static;
    /// The `kine_backend_connected` label ("postgres", "mysql").
    const LABEL: &'static str;

    fn open(&self) -> anyhow::Result<Self::Conn>;
    /// Whether the connection still works after a failure.
    fn usable(conn: &mut Self::Conn) -> bool;
    /// The removal a previous process left unfinished, if any.
    fn owed(conn: &mut Self::Conn) -> anyhow::Result<Option<Removal>>;
    /// One batch, in a transaction of its own: handles the keys of the next `BATCH_ROWS` log
    /// rows after the cursor and advances it. `false` when no row was left.
    fn remove_batch(conn: &mut Self::Conn, removal: &mut Removal) -> anyhow::Result<bool>;
    /// Records that every version superseded at `to` is gone.
    fn finish(conn: &mut Self::Conn, to: Revision) -> anyhow::Result<()>;
}

/// A compaction asked for with `physical`: its revision, the current revision to answer, and
/// where to answer.
pub type Waiter = (Revision, Revision, Reply<Revision>);

enum Request {
    Remove { removal: Removal, waiter: Option<Waiter> },
    Close(oneshot::Sender<()>),
}

/// After a compaction's logical step on a writer: answers now, or with `physical` once the
/// removal is done, and hands the removal over.
pub fn handover(removals: &Removals, removal: Removal, waiter: Waiter, physical: bool) {
    if physical {
        removals.send(removal, Some(waiter));
    } else {
        let (_, current, reply) = waiter;
        let _ = reply.send(Ok(current));
        removals.send(removal, None);
    }
}

/// The async side's handle on the thread.
pub struct CompactWorker(std::sync::Mutex<Option<mpsc::Sender<Request>>>);

/// The writer's handle: hands each compaction's removal over to the thread.
#[derive(Clone)]
pub struct Removals(mpsc::Sender<Request>);

impl Removals {
    /// Queues `removal` (which replaces any the thread was doing: the database says where
    /// removal stands); `waiter` is answered once it is done. A stopped thread drops the
    /// waiter (its caller gets "server stopped").
    pub fn send(&self, removal: Removal, waiter: Option<Waiter>) {
        let _ = self.0.send(Request::Remove { removal, waiter });
    }
}

impl CompactWorker {
    pub fn spawn<C: Compaction>(name: &str, compaction: C) -> std::io::Result<CompactWorker> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name(name.into()).spawn(move || Thread::new(compaction).run(rx))?;
        Ok(CompactWorker(std::sync::Mutex::new(Some(tx))))
    }

    /// The handle the writer hands removals over with.
    pub fn removals(&self) -> Option<Removals> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone().map(Removals)
    }

    /// Stops the thread between two batches (a removal left unfinished resumes at the next
    /// start).
    pub async fn close(&self) {
        let sender = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(sender) = sender {
            let (done, wait) = oneshot::channel();
            if sender.send(Request::Close(done)).is_ok() {
                let _ = wait.await;
            }
        }
    }
}

struct Thread<C: Compaction> {
    compaction: C,
    conn: Option<C::Conn>,
    /// Whether the removal owed by a previous process was looked for.
    resumed: bool,
    removal: Option<Removal>,
    waiters: Waiters,
    retry_at: Option<Instant>,
    started: Instant,
}

impl<C: Compaction> Thread<C> {
    fn new(compaction: C) -> Self {
        Thread {
            compaction,
            conn: None,
            resumed: false,
            removal: None,
            waiters: Waiters::default(),
            retry_at: None,
            started: Instant::now(),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Request>) {
        // Connected at start, so that an unfinished removal resumes now.
        let _ = self.connection();
        loop {
            let request = if self.removal.is_some() {
                let wait = self.retry_at.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()));
                match rx.recv_timeout(wait) {
                    Ok(request) => Some(request),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match rx.recv() {
                    Ok(request) => Some(request),
                    Err(_) => return,
                }
            };
            match request {
                Some(Request::Close(done)) => {
                    let _ = done.send(());
                    return;
                }
                Some(Request::Remove { removal, waiter }) => self.schedule(removal, waiter),
                None => self.remove_batch(),
            }
        }
    }

    /// The connection, opened if needed (and then the removal a previous process owed).
    fn connection(&mut self) -> anyhow::Result<&mut C::Conn> {
        let connected = kine_core::metrics::metrics().backend_connected.with_label_values(&[C::LABEL, "compactor"]);
        if self.conn.as_mut().is_some_and(|c| !C::usable(c)) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let opened = self.compaction.open().inspect_err(|_| connected.set(0))?;
            connected.set(1);
            self.conn = Some(opened);
        }
        let conn = self.conn.as_mut().expect("connected");
        if !self.resumed {
            if let Some(owed) = C::owed(conn)? {
                tracing::info!(from = owed.from, to = owed.to, "resuming the removal of compacted versions");
                self.removal = Some(owed);
                self.started = Instant::now();
            }
            self.resumed = true;
        }
        Ok(conn)
    }

    fn schedule(&mut self, removal: Removal, waiter: Option<Waiter>) {
        if self.removal.is_none() {
            self.started = Instant::now();
        }
        // Restarts the key scan from where the database says removal stands.
        self.removal = Some(removal);
        self.retry_at = None;
        if let Some((revision, current, reply)) = waiter {
            self.waiters.push(revision, current, reply);
        }
    }

    fn remove_batch(&mut self) {
        let Some(mut removal) = self.removal else { return };
        let outcome = self.connection().and_then(|conn| {
            if C::remove_batch(conn, &mut removal)? {
                return Ok(false);
            }
            C::finish(conn, removal.to)?;
            Ok(true)
        });
        match outcome {
            Ok(false) => self.removal = Some(removal),
            Ok(true) => {
                tracing::debug!(
                    from = removal.from,
                    to = removal.to,
                    seconds = self.started.elapsed().as_secs_f64(),
                    "compacted versions removed"
                );
                self.removal = None;
                self.waiters.finished(removal.to);
            }
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    to = removal.to,
                    "removing compacted versions failed; retrying in 5 s"
                );
                let lost = self.conn.as_mut().is_none_or(|c| !C::usable(c));
                let text = format!("{}: {e:#}", C::LABEL);
                self.waiters.fail(|| {
                    if lost { Error::Unavailable(text.clone()) } else { Error::Backend(anyhow::anyhow!("{text}")) }
                });
                self.removal = Some(removal);
                self.retry_at = Some(Instant::now() + RETRY);
            }
        }
    }
}
