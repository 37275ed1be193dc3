//! The single SQLite writer thread, with group commit (and compaction, `sqlite_compact.rs`).
//!
//! Write requests queue on a channel. The thread takes every request already waiting (up to
//! `MAX_BATCH`), applies each in its own savepoint inside one transaction, commits once (one
//! fsync for the whole batch), then advances the shared revision, publishes the events in
//! revision order, and only then answers the requests. A failed request rolls back to its
//! savepoint and fails alone; a failed commit fails the whole batch and publishes nothing.

use crate::schema;
use crate::sqlite_compact::Compacting;
use crate::view::SqlView;
use anyhow::Context;
use kine_core::request::Revisioned;
use kine_core::txn::{self, WriteOp, WriteResponse};
use kine_core::{Error, Result, Revision, RevisionEvents};
use rusqlite::{Connection, TransactionBehavior};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, mpsc};
use tokio::sync::{broadcast, oneshot};

/// Requests committed together at most (each in its own savepoint).
pub const MAX_BATCH: usize = 256;

pub type Reply<T> = oneshot::Sender<Result<T>>;

pub enum Job {
    Write(WriteOp, Reply<Revisioned<WriteResponse>>),
    /// With `physical`, answered once the superseded versions are deleted, else once reads
    /// below the revision are refused.
    Compact {
        revision: Revision,
        physical: bool,
        reply: Reply<Revision>,
    },
    Defragment(Reply<()>),
    /// Finish queued work, checkpoint the WAL and stop.
    Close(oneshot::Sender<()>),
}

/// The async side's handle on a writer thread: submits jobs, and stops it once.
pub struct Writer(std::sync::Mutex<Option<mpsc::Sender<Job>>>);

/// The answer of a backend that was closed.
pub fn stopped() -> Error {
    Error::Unavailable("etcdserver: server stopped".into())
}

impl Writer {
    pub fn new(sender: mpsc::Sender<Job>) -> Writer {
        Writer(std::sync::Mutex::new(Some(sender)))
    }

    fn sender(&self) -> std::sync::MutexGuard<'_, Option<mpsc::Sender<Job>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No writer thread: every job fails as after a close (a read-only open).
    pub fn none() -> Writer {
        Writer(std::sync::Mutex::new(None))
    }

    pub fn is_stopped(&self) -> bool {
        self.sender().is_none()
    }

    /// Queues a job and waits for its answer (`Unavailable` once stopped).
    pub async fn submit<T>(&self, job: impl FnOnce(oneshot::Sender<Result<T>>) -> Job) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.sender().as_ref().ok_or_else(stopped)?.send(job(tx)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Lets the thread finish what is queued, then stops it; later jobs fail at once.
    pub async fn close(&self) {
        let sender = self.sender().take();
        if let Some(sender) = sender {
            let (tx, rx) = oneshot::channel();
            if sender.send(Job::Close(tx)).is_ok() {
                let _ = rx.await;
            }
        }
    }
}

impl Job {
    /// Answers the job with `e` without running it.
    pub fn fail(self, e: Error) {
        match self {
            Job::Write(_, reply) => {
                let _ = reply.send(Err(e));
            }
            Job::Compact { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Job::Defragment(reply) => {
                let _ = reply.send(Err(e));
            }
            Job::Close(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// A write and every write already queued behind it (up to `MAX_BATCH`): one group commit. A
/// queued job of another kind is kept in `held` for the next round.
pub fn collect_batch(
    first: (WriteOp, Reply<Revisioned<WriteResponse>>),
    rx: &mpsc::Receiver<Job>,
    held: &mut Option<Job>,
) -> Vec<(WriteOp, Reply<Revisioned<WriteResponse>>)> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(Job::Write(op, reply)) => batch.push((op, reply)),
            Ok(other) => {
                *held = Some(other);
                break;
            }
            Err(_) => break,
        }
    }
    batch
}

/// The answers to a batch's requests, in order.
pub type Results = Vec<Result<Revisioned<WriteResponse>>>;

/// How the network databases' writers (PostgreSQL, MySQL) run a batch: `attempt(false)` runs it
/// in one transaction without savepoints and answers `None` when a request failed in the
/// database (a PostgreSQL transaction is then aborted; a MySQL request may be half written),
/// having rolled everything back; the batch then runs again with `attempt(true)`, each request
/// in a savepoint, so that only that request fails.
pub fn with_savepoints_if_needed(
    mut attempt: impl FnMut(bool) -> anyhow::Result<Option<Results>>,
) -> anyhow::Result<Results> {
    match attempt(false)? {
        Some(results) => Ok(results),
        None => attempt(true)?.context("a write batch with savepoints did not complete"),
    }
}

/// An error from the database rather than one of etcd's refusals (which are decided before a
/// request writes anything, so they need no savepoint).
pub fn failed_in_database(e: &Error) -> bool {
    matches!(e, Error::Backend(_) | Error::Unavailable(_) | Error::NoSpace | Error::Corrupt)
}

/// `e` as etcd's NOSPACE when `full` recognises the database's "out of disk space" in it (the
/// store then raises the alarm); any other error unchanged.
pub fn no_space_if(e: Error, full: impl Fn(&anyhow::Error) -> bool) -> Error {
    match e {
        Error::Backend(inner) if full(&inner) => Error::NoSpace,
        other => other,
    }
}

/// State shared between the writer thread and the async side.
pub struct Shared {
    pub current: AtomicI64,
    pub compacted: AtomicI64,
    pub feed: broadcast::Sender<Arc<RevisionEvents>>,
}

pub fn spawn(conn: Connection, shared: Arc<Shared>) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new().name("sqlite-writer".into()).spawn(move || run(conn, shared, rx))?;
    Ok(tx)
}

fn run(mut conn: Connection, shared: Arc<Shared>, rx: mpsc::Receiver<Job>) {
    let mut held: Option<Job> = None;
    let mut compacting = Compacting::resume(&conn);
    loop {
        let job = match (held.take(), compacting.due()) {
            (Some(job), _) => job,
            (None, None) => match rx.recv() {
                Ok(job) => job,
                Err(_) => return, // every sender is gone
            },
            // A removal owed: its batches run while no job waits.
            (None, Some(wait)) => match rx.recv_timeout(wait) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    compacting.step(&mut conn);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        match job {
            Job::Write(op, reply) => {
                let batch = collect_batch((op, reply), &rx, &mut held);
                write_batch(&mut conn, &shared, batch);
            }
            Job::Compact { revision, physical, reply } => {
                let current = shared.current.load(Ordering::SeqCst);
                compacting.schedule(&mut conn, current, &shared.compacted, revision, physical, reply);
            }
            Job::Defragment(reply) => {
                let result = conn
                    .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
                    .context("defragment (VACUUM)")
                    .map_err(Error::Backend);
                let _ = reply.send(result);
            }
            Job::Close(done) => {
                if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
                    tracing::warn!(error = %e, "cannot checkpoint the SQLite WAL at shutdown");
                }
                drop(conn);
                let _ = done.send(());
                // Later requests find the channel closed and fail with Unavailable.
                return;
            }
        }
        // One removal batch between two jobs: a steady stream of writes cannot starve it.
        if compacting.due() == Some(std::time::Duration::ZERO) {
            compacting.step(&mut conn);
        }
    }
}

fn write_batch(conn: &mut Connection, shared: &Shared, batch: Vec<(WriteOp, Reply<Revisioned<WriteResponse>>)>) {
    let base = shared.current.load(Ordering::SeqCst);
    let compacted = shared.compacted.load(Ordering::SeqCst);
    let mut results = Vec::with_capacity(batch.len());
    let mut published = Vec::new();
    let outcome = (|| -> anyhow::Result<Revision> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).context("begin write transaction")?;
        let mut view = SqlView { conn: &tx, revision: base, compacted, appended: 0 };
        for (op, _) in &batch {
            view.conn.execute_batch("SAVEPOINT op").context("open savepoint")?;
            match txn::apply(&mut view, op) {
                Ok(applied) => {
                    view.conn.execute_batch("RELEASE op").context("release savepoint")?;
                    if let Some(ev) = applied.events {
                        view.revision = ev.revision;
                        published.push(ev);
                    }
                    results.push(Ok(Revisioned { revision: view.revision, value: applied.response }));
                }
                Err(e) => {
                    view.conn.execute_batch("ROLLBACK TO op; RELEASE op").context("roll back savepoint")?;
                    results.push(Err(no_space(e)));
                }
            }
        }
        let revision = view.revision;
        if revision != base {
            schema::set(&tx, "revision", revision)?;
        }
        tx.commit().context("commit write transaction")?;
        Ok(revision)
    })();
    match outcome {
        Ok(revision) => {
            // Advance the revision before publishing (see the Backend invariants).
            shared.current.store(revision, Ordering::SeqCst);
            for ev in published {
                let _ = shared.feed.send(Arc::new(ev));
            }
            for ((_, reply), result) in batch.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "SQLite write batch failed; nothing was written");
            let full = disk_full(&e);
            let text = format!("{e:#}");
            for (_, reply) in batch {
                let _ = reply.send(Err(if full { Error::NoSpace } else { Error::Backend(anyhow::anyhow!("{text}")) }));
            }
        }
    }
}

/// SQLite's "database or disk is full" (the disk, or a `max_page_count` limit).
fn disk_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<rusqlite::Error>(),
            Some(rusqlite::Error::SqliteFailure(f, _)) if f.code == rusqlite::ErrorCode::DiskFull
        )
    })
}

fn no_space(e: Error) -> Error {
    no_space_if(e, disk_full)
}
