//! The MySQL writer thread of this node, with group commit: every queued request (up to
//! `MAX_BATCH`) in one transaction (in a savepoint each only when the batch runs again after a
//! request failed in the database). The transaction first locks the revision counter
//! (`SELECT … FOR UPDATE` on `meta.revision`), so the writers of all nodes on one database take
//! turns: revisions are gap-free and committed in order. The connection runs at READ
//! COMMITTED, so each statement sees every commit made before the lock was granted. Begin and
//! lock, and advance and commit, are one round trip each (several statements in one query).
//! After the commit the writer publishes this node's events when nothing before them is still
//! unpublished (`Shared::publish_own`), otherwise the feed does, woken; then the replies go out.

use super::compact;
use super::feed::Nudge;
use super::view::MyView;
use super::{Connector, Role, connection_lost, unavailable};
use crate::compact_worker::{Removals, handover};
use crate::remote::Shared;
use crate::writer::{Job, Reply, Results, collect_batch, failed_in_database, no_space_if, with_savepoints_if_needed};
use anyhow::Context;
use kine_core::request::Revisioned;
use kine_core::txn::{self, WriteOp, WriteResponse};
use kine_core::{Error, Revision};
use mysql::prelude::Queryable;
use std::sync::{Arc, mpsc};

pub fn spawn(
    connector: Connector,
    shared: Arc<Shared>,
    nudge: Nudge,
    removals: Removals,
) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("mysql-writer".into())
        .spawn(move || run(connector, shared, nudge, removals, rx))?;
    Ok(tx)
}

/// `kine_backend_connected` of this writer's connection.
fn connected() -> kine_core::metrics::IntGauge {
    kine_core::metrics::metrics().backend_connected.with_label_values(&["mysql", "writer"])
}

fn run(connector: Connector, shared: Arc<Shared>, nudge: Nudge, removals: Removals, rx: mpsc::Receiver<Job>) {
    // Connected before the first write arrives, so that it does not wait for the connection;
    // a failure here is retried at the first job.
    let mut conn: Option<mysql::Conn> = connector.connect(Role::Writer).ok();
    if conn.is_some() {
        connected().set(1);
    }
    let mut held: Option<Job> = None;
    loop {
        let job = match held.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        if let Job::Close(done) = job {
            let _ = done.send(());
            return;
        }
        // A lost connection is replaced at the next job; meanwhile requests fail fast.
        if conn.is_none() {
            conn = match connector.connect(Role::Writer) {
                Ok(c) => {
                    connected().set(1);
                    Some(c)
                }
                Err(e) => {
                    connected().set(0);
                    let err = || unavailable(&e);
                    job.fail(err());
                    while let Ok(job) = rx.try_recv() {
                        job.fail(err());
                    }
                    continue;
                }
            };
        }
        let c = conn.as_mut().expect("connected");
        let lost = match job {
            Job::Write(op, reply) => {
                let batch = collect_batch((op, reply), &rx, &mut held);
                write_batch(c, &shared, &nudge, batch)
            }
            // The logical step here; the removal on the compactor's connection.
            Job::Compact { revision, physical, reply } => match compact::schedule(c, revision) {
                Ok((current, removal)) => {
                    handover(&removals, removal, (revision, current, reply), physical);
                    false
                }
                Err(e) => {
                    let lost = matches!(e, Error::Unavailable(_));
                    let _ = reply.send(Err(e));
                    lost
                }
            },
            Job::Defragment(reply) => {
                let result = c.query_drop("OPTIMIZE TABLE kv, lease").context("OPTIMIZE TABLE");
                let lost = result.as_ref().is_err_and(connection_lost);
                let _ = reply.send(result.map_err(|e| if lost { unavailable(&e) } else { Error::Backend(e) }));
                lost
            }
            Job::Close(_) => unreachable!("handled above"),
        };
        if lost {
            connected().set(0);
            conn = None;
        }
    }
}

/// Runs one batch. Returns whether the connection was lost.
fn write_batch(
    c: &mut mysql::Conn,
    shared: &Shared,
    nudge: &Nudge,
    batch: Vec<(WriteOp, Reply<Revisioned<WriteResponse>>)>,
) -> bool {
    let ops: Vec<&WriteOp> = batch.iter().map(|(op, _)| op).collect();
    let outcome = with_savepoints_if_needed(|savepoints| attempt(c, shared, &ops, savepoints));
    match outcome {
        Ok(results) => {
            // Published (`attempt`), or this node's feed publishes them (every node's, in
            // revision order).
            nudge.wake();
            for ((_, reply), result) in batch.into_iter().zip(results) {
                let _ = reply.send(result.map_err(|e| no_space_if(e, disk_full)));
            }
            false
        }
        Err(e) => {
            let lost = connection_lost(&e);
            let full = disk_full(&e);
            if !lost {
                let _ = c.query_drop("ROLLBACK");
                tracing::error!(error = format!("{e:#}"), "MySQL write batch failed; nothing was written");
            }
            let text = format!("{e:#}");
            for (_, reply) in batch {
                let _ = reply.send(Err(if lost {
                    Error::Unavailable(format!("MySQL: {text}"))
                } else if full {
                    Error::NoSpace
                } else {
                    Error::Backend(anyhow::anyhow!("{text}"))
                }));
            }
            lost
        }
    }
}

/// MySQL's and MariaDB's "out of disk space": the table is full (1114, InnoDB could not extend
/// its file), disk full (1021), or the storage engine's errno 28, ENOSPC (1030).
fn disk_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| match c.downcast_ref::<mysql::Error>() {
        Some(mysql::Error::MySqlError(m)) => {
            matches!(m.code, 1114 | 1021) || (m.code == 1030 && m.message.contains("error 28 "))
        }
        _ => false,
    })
}

/// Runs `ops` in one transaction and commits it. With `savepoints`, each request runs in a
/// savepoint of its own; without, a request that fails in the database (where it may have
/// written part of itself) rolls everything back and the answer is `None`. etcd's refusals (a
/// missing lease, …) are decided before a request writes anything, so they need no savepoint.
fn attempt(
    c: &mut mysql::Conn,
    shared: &Shared,
    ops: &[&WriteOp],
    savepoints: bool,
) -> anyhow::Result<Option<Results>> {
    let (base, compacted) = begin(c)?;
    let mut results = Vec::with_capacity(ops.len());
    let mut events = Vec::new();
    let mut view = MyView { conn: &mut *c, revision: base, compacted, appended: 0 };
    let mut lease_changes = false;
    for op in ops {
        if let WriteOp::LeaseRevoke { id, expired: true } = op
            && renewed_elsewhere(view.conn, shared, *id)?
        {
            // Another node renewed it since this node last heard: not ours to revoke.
            results.push(Err(Error::LeaseNotFound));
            continue;
        }
        if savepoints {
            view.conn.query_drop("SAVEPOINT op").context("open savepoint")?;
        }
        let appended = view.appended;
        match txn::apply(&mut view, op) {
            Ok(applied) => {
                if savepoints {
                    view.conn.query_drop("RELEASE SAVEPOINT op").context("release savepoint")?;
                }
                lease_changes |= !matches!(op, WriteOp::Txn(_));
                if let Some(ev) = applied.events {
                    view.revision = ev.revision;
                    events.push(ev);
                }
                results.push(Ok(Revisioned { revision: view.revision, value: applied.response }));
            }
            // The connection broke under the request: the whole batch fails as an outage.
            Err(Error::Backend(inner)) if connection_lost(&inner) => return Err(inner),
            Err(e) if savepoints => {
                view.conn.query_drop("ROLLBACK TO SAVEPOINT op").context("roll back savepoint")?;
                view.conn.query_drop("RELEASE SAVEPOINT op").context("release savepoint")?;
                view.appended = appended;
                results.push(Err(e));
            }
            Err(e) if view.appended == appended && !failed_in_database(&e) => results.push(Err(e)),
            Err(_) => {
                view.conn.query_drop("ROLLBACK").context("roll back write transaction")?;
                return Ok(None);
            }
        }
    }
    let revision = view.revision;
    let mut end = String::new();
    if revision != base {
        // An integer: nothing to quote.
        end += &format!("UPDATE meta SET value = {revision} WHERE name = 'revision'; ");
    }
    if lease_changes {
        end += LEASE_EPOCH_BUMP;
        end += "; ";
    }
    end += "COMMIT";
    statements(c, &end).context("advance the revision and commit")?;
    shared.publish_own(base, compacted, events);
    Ok(Some(results))
}

/// Begins the write transaction and locks the revision counter, in one round trip: the current
/// and the compact revision.
fn begin(c: &mut mysql::Conn) -> anyhow::Result<(Revision, Revision)> {
    let sets = statements(
        c,
        "START TRANSACTION; SELECT value FROM meta WHERE name = 'revision' FOR UPDATE;
         SELECT value FROM meta WHERE name = 'compact_revision'",
    )
    .context("begin write transaction and lock the revision counter")?;
    let value = |set: usize, name: &str| -> anyhow::Result<Revision> {
        let row = sets.get(set).and_then(|rows| rows.first()).with_context(|| format!("meta row {name} is missing"))?;
        row.get_opt::<i64, _>(0)
            .with_context(|| format!("meta row {name} has no value"))?
            .with_context(|| format!("meta value {name} is not a number"))
    };
    Ok((value(1, "revision")?, value(2, "compact_revision")?))
}

/// Runs several statements in one round trip; the rows of each, in order. An error in any of
/// them is returned (dropping the result would hide errors after the first statement).
fn statements(c: &mut mysql::Conn, sql: &str) -> anyhow::Result<Vec<Vec<mysql::Row>>> {
    let mut result = c.query_iter(sql)?;
    let mut sets = Vec::new();
    while let Some(set) = result.iter() {
        sets.push(set.collect::<std::result::Result<Vec<_>, _>>()?);
    }
    Ok(sets)
}

/// Counts a lease change, for every node's feed to notice.
pub fn bump_lease_epoch(c: &mut impl Queryable) -> anyhow::Result<()> {
    c.query_drop(LEASE_EPOCH_BUMP).context("count a lease change")
}

const LEASE_EPOCH_BUMP: &str = "UPDATE meta SET value = value + 1 WHERE name = 'lease_epoch'";

/// Whether the lease's renewal count differs from the one this node last heard of.
fn renewed_elsewhere(c: &mut impl Queryable, shared: &Shared, id: i64) -> anyhow::Result<bool> {
    let renewals: Option<i64> =
        c.exec_first("SELECT renewals FROM lease WHERE id = ? FOR UPDATE", (id,)).context("read lease renewals")?;
    let Some(renewals) = renewals else { return Ok(false) };
    Ok(shared.seen().get(&id).is_some_and(|seen| *seen != renewals))
}
