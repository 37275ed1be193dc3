//! This node's event feed on a shared PostgreSQL database: a thread that LISTENs for commits
//! of any node (`NOTIFY kine_rs`), reads every revision after the last one it published, in
//! order, from one snapshot, and publishes them. It also polls once a second, in case a
//! notification is lost with a connection.

use super::conn::Conn;
use super::view;
use super::{Connector, Shared};
use anyhow::Context;
use kine_core::KeyRange;
use kine_core::backend::LeaseUpdate;
use postgres::fallible_iterator::FallibleIterator;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

const POLL: Duration = Duration::from_secs(1);

pub fn spawn(connector: Connector, shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new().name("pg-feed".into()).spawn(move || run(connector, shared))?;
    Ok(())
}

fn run(connector: Connector, shared: Arc<Shared>) {
    let mut client: Option<Conn> = None;
    let mut failing = false;
    while !shared.closed.load(Ordering::SeqCst) {
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = match connector.open().and_then(|mut c| {
                c.client().batch_execute("LISTEN kine_rs; LISTEN kine_rs_lease").context("LISTEN")?;
                refresh_leases(c.client(), &shared)?;
                Ok(c)
            }) {
                Ok(c) => Some(c),
                Err(e) => {
                    kine_core::metrics::metrics().backend_connected.with_label_values(&["postgres", "feed"]).set(0);
                    if !failing {
                        tracing::warn!(error = format!("{e:#}"), "PostgreSQL event feed cannot connect; retrying");
                        failing = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
            };
        }
        let conn = client.as_mut().expect("connected");
        match catch_up(conn, &shared) {
            Ok(()) => {
                kine_core::metrics::metrics().backend_connected.with_label_values(&["postgres", "feed"]).set(1);
                if failing {
                    tracing::info!("PostgreSQL event feed connected again");
                    failing = false;
                }
            }
            Err(e) => {
                kine_core::metrics::metrics().backend_connected.with_label_values(&["postgres", "feed"]).set(0);
                if !failing {
                    tracing::warn!(error = format!("{e:#}"), "PostgreSQL event feed failed; retrying");
                    failing = true;
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        // Wait for a commit (of any node), then take every notification already there.
        let mut notes = conn.client().notifications();
        if let Ok(Some(n)) = notes.timeout_iter(POLL).next() {
            lease_note(&shared, n.channel(), n.payload());
        }
        while let Ok(Some(n)) = notes.iter().next() {
            lease_note(&shared, n.channel(), n.payload());
        }
    }
}

/// Publishes every revision after the published one, up to the database's current revision.
fn catch_up(conn: &mut Conn, shared: &Shared) -> anyhow::Result<()> {
    let published = shared.current.load(Ordering::SeqCst);
    conn.client()
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .context("begin feed transaction")?;
    let read = (|| -> anyhow::Result<_> {
        let (current, compacted) = super::schema::revisions(conn)?;
        let events =
            if current > published { view::events(conn, &KeyRange::all(), published, current)? } else { Vec::new() };
        Ok((current, compacted, events))
    })();
    // A failed read must not leave its transaction open on this connection.
    let end = if read.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.client().batch_execute(end).context("end feed transaction");
    let (current, compacted, events) = read?;
    ended?;
    shared.publish(published, current, compacted, events);
    Ok(())
}

/// A lease change announced by a node (`renew ID TTL RENEWALS` or `revoke ID`).
fn lease_note(shared: &Shared, channel: &str, payload: &str) {
    if channel != "kine_rs_lease" {
        return;
    }
    let parts: Vec<&str> = payload.split(' ').collect();
    let num = |i: usize| parts.get(i).and_then(|p| p.parse::<i64>().ok());
    match (parts.first().copied(), num(1), num(2), num(3)) {
        (Some("renew"), Some(id), Some(ttl), Some(renewals)) => {
            shared.seen().insert(id, renewals);
            let _ = shared.lease_updates.send(LeaseUpdate::Renewed { id, ttl });
        }
        (Some("revoke"), Some(id), _, _) => {
            shared.seen().remove(&id);
            let _ = shared.lease_updates.send(LeaseUpdate::Revoked { id });
        }
        _ => tracing::warn!(payload, "unknown lease notification"),
    }
}

/// After (re)connecting: notifications may have been lost, so every lease starts its TTL again
/// on this node (as etcd does on a leader change) with its current renewal count.
fn refresh_leases(conn: &mut postgres::Client, shared: &Shared) -> anyhow::Result<()> {
    let rows = conn.query_typed("SELECT id, ttl, renewals FROM lease", &[]).context("read leases")?;
    for row in rows {
        let (id, ttl, renewals): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        shared.seen().insert(id, renewals);
        let _ = shared.lease_updates.send(LeaseUpdate::Renewed { id, ttl });
    }
    Ok(())
}
