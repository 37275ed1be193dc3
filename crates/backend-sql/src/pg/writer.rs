//! The PostgreSQL writer thread of this node, with group commit: every queued request (up to
//! `MAX_BATCH`) in one transaction (in a savepoint each only after one failed in the database). The
//! transaction first locks the revision counter (`SELECT … FOR UPDATE` on `meta.revision`), so
//! the writers of all nodes on one database take turns: revisions are gap-free and committed in
//! order. The commit notifies every node's feed (`NOTIFY kine_rs`), which publishes the events;
//! this node's own are published by the writer after the commit, before the replies, when
//! nothing before them is still unpublished (`Shared::publish_own`). Begin and lock, and
//! advance, notify and commit, are one round trip each (several statements in one simple query).

use super::compact;
use super::conn::{Conn, Sql};
use super::view::PgView;
use super::{Connector, Shared};
use crate::compact_worker::{Removals, handover};
use crate::writer::{Job, Reply, Results, collect_batch, failed_in_database, no_space_if, with_savepoints_if_needed};
use anyhow::Context;
use kine_core::request::Revisioned;
use kine_core::txn::{self, WriteOp, WriteResponse};
use kine_core::{Error, Revision};
use postgres::SimpleQueryMessage;
use postgres::types::Type;
use std::sync::{Arc, mpsc};

pub fn spawn(connector: Connector, shared: Arc<Shared>, removals: Removals) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new().name("pg-writer".into()).spawn(move || run(connector, shared, removals, rx))?;
    Ok(tx)
}

fn run(connector: Connector, shared: Arc<Shared>, removals: Removals, rx: mpsc::Receiver<Job>) {
    // Connected before the first write arrives, so that it does not wait for the connection
    // (and PostgreSQL's loading of a new session), measured at ~90 ms; a failure here is
    // retried at the first job.
    let mut client: Option<Conn> = connector.open().ok();
    if client.is_some() {
        kine_core::metrics::metrics().backend_connected.with_label_values(&["postgres", "writer"]).set(1);
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
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            let connected = kine_core::metrics::metrics().backend_connected.with_label_values(&["postgres", "writer"]);
            client = match connector.open() {
                Ok(c) => {
                    connected.set(1);
                    Some(c)
                }
                Err(e) => {
                    connected.set(0);
                    let err = || Error::Unavailable(format!("PostgreSQL: {e:#}"));
                    job.fail(err());
                    while let Ok(job) = rx.try_recv() {
                        job.fail(err());
                    }
                    continue;
                }
            };
        }
        let conn = client.as_mut().expect("connected");
        match job {
            Job::Write(op, reply) => {
                let batch = collect_batch((op, reply), &rx, &mut held);
                write_batch(conn, &shared, batch);
            }
            // The logical step here; the removal on the compactor's connection.
            Job::Compact { revision, physical, reply } => match compact::schedule(conn, revision) {
                Ok((current, removal)) => handover(&removals, removal, (revision, current, reply), physical),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Job::Defragment(reply) => {
                let result = conn.client().batch_execute("VACUUM kv, lease").context("VACUUM").map_err(Error::Backend);
                let _ = reply.send(result);
            }
            Job::Close(_) => unreachable!("handled above"),
        }
    }
}

fn write_batch(conn: &mut Conn, shared: &Shared, batch: Vec<(WriteOp, Reply<Revisioned<WriteResponse>>)>) {
    let ops: Vec<&WriteOp> = batch.iter().map(|(op, _)| op).collect();
    let outcome = with_savepoints_if_needed(|savepoints| attempt(conn, shared, &ops, savepoints));
    match outcome {
        Ok(results) => {
            // The events are published (`attempt`, or this node's feed, which publishes every
            // node's in revision order).
            for ((_, reply), result) in batch.into_iter().zip(results) {
                let _ = reply.send(result.map_err(|e| no_space_if(e, disk_full)));
            }
        }
        Err(e) => {
            let text = format!("{e:#}");
            let closed = conn.is_closed();
            let full = disk_full(&e);
            if !closed {
                tracing::error!(error = %text, "PostgreSQL write batch failed; nothing was written");
                // Leaves no transaction open (after a failed COMMIT there is none: a warning).
                let _ = conn.client().batch_execute("ROLLBACK");
            }
            for (_, reply) in batch {
                let _ = reply.send(Err(if closed {
                    Error::Unavailable(format!("PostgreSQL: {text}"))
                } else if full {
                    Error::NoSpace
                } else {
                    Error::Backend(anyhow::anyhow!("{text}"))
                }));
            }
        }
    }
}

/// PostgreSQL's `disk_full` (SQLSTATE 53100): the disk holding the tables (or their tablespace)
/// is full. (A full WAL disk is not an error a request sees: PostgreSQL stops.)
fn disk_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<postgres::Error>().and_then(|p| p.code()) == Some(&postgres::error::SqlState::DISK_FULL)
    })
}

/// Runs `ops` in one transaction and commits it. With `savepoints`, each request runs in a
/// savepoint of its own; without, a request that fails in the database (and so aborts the
/// transaction) rolls everything back and the answer is `None`. etcd's refusals (a missing
/// lease, …) are decided before a request writes anything, so they need no savepoint.
fn attempt(conn: &mut Conn, shared: &Shared, ops: &[&WriteOp], savepoints: bool) -> anyhow::Result<Option<Results>> {
    let (base, compacted) = begin(conn)?;
    let mut results = Vec::with_capacity(ops.len());
    let mut events = Vec::new();
    let mut view = PgView { client: &mut *conn, revision: base, compacted, appended: 0 };
    for op in ops {
        if let WriteOp::LeaseRevoke { id, expired: true } = op
            && renewed_elsewhere(view.client, shared, *id)?
        {
            // Another node renewed it since this node last heard: not ours to revoke.
            results.push(Err(Error::LeaseNotFound));
            continue;
        }
        if savepoints {
            view.client.client().batch_execute("SAVEPOINT op").context("open savepoint")?;
        }
        let appended = view.appended;
        match txn::apply(&mut view, op) {
            Ok(applied) => {
                if savepoints {
                    view.client.client().batch_execute("RELEASE SAVEPOINT op").context("release savepoint")?;
                }
                announce_lease(view.client, op)?;
                if let Some(ev) = applied.events {
                    view.revision = ev.revision;
                    events.push(ev);
                }
                results.push(Ok(Revisioned { revision: view.revision, value: applied.response }));
            }
            Err(e) if savepoints => {
                view.client
                    .client()
                    .batch_execute("ROLLBACK TO SAVEPOINT op; RELEASE SAVEPOINT op")
                    .context("roll back savepoint")?;
                view.appended = appended;
                results.push(Err(e));
            }
            Err(e) if view.appended == appended && !failed_in_database(&e) => results.push(Err(e)),
            Err(_) => {
                view.client.client().batch_execute("ROLLBACK").context("roll back write transaction")?;
                return Ok(None);
            }
        }
    }
    let revision = view.revision;
    // If a statement failed unnoticed, the transaction is aborted and the UPDATE fails with it
    // (a COMMIT alone would roll back without an error): nothing is acknowledged then.
    let end = if revision != base {
        // An integer: nothing to quote.
        format!("UPDATE meta SET value = {revision} WHERE name = 'revision'; NOTIFY kine_rs; COMMIT")
    } else {
        "COMMIT".to_string()
    };
    conn.client().batch_execute(&end).context("advance the revision, notify the other nodes and commit")?;
    shared.publish_own(base, compacted, events);
    Ok(Some(results))
}

/// Begins the write transaction and locks the revision counter, in one round trip: the current
/// and the compact revision.
fn begin(conn: &mut Conn) -> anyhow::Result<(Revision, Revision)> {
    let messages = conn
        .client()
        .simple_query(
            "BEGIN; SELECT r.value, c.value FROM meta r, meta c
             WHERE r.name = 'revision' AND c.name = 'compact_revision' FOR UPDATE OF r",
        )
        .context("begin write transaction and lock the revision counter")?;
    let row = messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .context("meta rows revision and compact_revision are missing")?;
    let number = |i: usize| -> anyhow::Result<Revision> {
        row.get(i).context("meta value is NULL")?.parse().context("meta value is not a number")
    };
    Ok((number(0)?, number(1)?))
}

/// Whether the lease's renewal count differs from the one this node last heard of.
fn renewed_elsewhere(tx: &mut impl Sql, shared: &Shared, id: i64) -> anyhow::Result<bool> {
    let row = tx
        .query_maybe("SELECT renewals FROM lease WHERE id = $1 FOR UPDATE", &[(&id, Type::INT8)])
        .context("read lease renewals")?;
    let Some(row) = row else { return Ok(false) };
    let renewals: i64 = row.get(0);
    Ok(shared.seen().get(&id).is_some_and(|seen| *seen != renewals))
}

/// Tells every node's lessor about a granted or revoked lease (delivered at commit).
fn announce_lease(tx: &mut impl Sql, op: &WriteOp) -> anyhow::Result<()> {
    let payload = match op {
        WriteOp::LeaseGrant { id, ttl } => format!("renew {id} {ttl} 0"),
        WriteOp::LeaseRevoke { id, .. } => format!("revoke {id}"),
        WriteOp::Txn(_) | WriteOp::Import(_) => return Ok(()),
    };
    tx.execute_sql("SELECT pg_notify('kine_rs_lease', $1)", &[(&payload, Type::TEXT)])
        .context("announce lease change")?;
    Ok(())
}
