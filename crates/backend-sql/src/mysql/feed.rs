//! This node's event feed on a shared MySQL database: a thread that reads, in one consistent
//! snapshot, the revision counter and lease epoch, every revision after the last one it
//! published (in order), and the lease table when the epoch moved; then publishes them. MySQL
//! has no LISTEN/NOTIFY: the feed polls every `POLL`, and is woken at once by this node's
//! writer after each commit and by `revisions()`, so this node's watchers see its own writes
//! without delay and other nodes' writes within `POLL`.

use super::{Connector, Role, schema, view};
use anyhow::Context;
use kine_core::backend::LeaseUpdate;
use kine_core::{KeyRange, LeaseId};
use mysql::prelude::Queryable;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use crate::remote::Shared;

pub const POLL: Duration = Duration::from_millis(100);

/// Wakes the feed (cheap; wake-ups coalesce).
#[derive(Clone)]
pub struct Nudge(mpsc::SyncSender<()>);

impl Nudge {
    /// Wakes nothing (a read-only open has no feed).
    pub fn none() -> Nudge {
        Nudge(mpsc::sync_channel(1).0)
    }

    pub fn wake(&self) {
        let _ = self.0.try_send(());
    }
}

pub fn spawn(connector: Connector, shared: Arc<Shared>) -> std::io::Result<Nudge> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new().name("mysql-feed".into()).spawn(move || run(connector, shared, rx))?;
    Ok(Nudge(tx))
}

/// The lease table as this feed last read it: id → (ttl, renewals).
type Leases = HashMap<LeaseId, (i64, i64)>;

fn run(connector: Connector, shared: Arc<Shared>, wake: mpsc::Receiver<()>) {
    let mut conn: Option<mysql::Conn> = None;
    let mut failing = false;
    // `None`: lease table not read on this connection yet (changes may have been missed).
    let mut epoch: Option<i64> = None;
    let mut leases = Leases::new();
    while !shared.closed.load(Ordering::SeqCst) {
        if conn.is_none() {
            match connector.connect(Role::Pool) {
                Ok(c) => {
                    conn = Some(c);
                    epoch = None;
                }
                Err(e) => {
                    kine_core::metrics::metrics().backend_connected.with_label_values(&["mysql", "feed"]).set(0);
                    if !failing {
                        tracing::warn!(error = format!("{e:#}"), "MySQL event feed cannot connect; retrying");
                        failing = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected");
        match catch_up(c, &shared, &mut epoch, &mut leases) {
            Ok(()) => {
                kine_core::metrics::metrics().backend_connected.with_label_values(&["mysql", "feed"]).set(1);
                if failing {
                    tracing::info!("MySQL event feed connected again");
                    failing = false;
                }
            }
            Err(e) => {
                kine_core::metrics::metrics().backend_connected.with_label_values(&["mysql", "feed"]).set(0);
                if !failing {
                    tracing::warn!(error = format!("{e:#}"), "MySQL event feed failed; retrying");
                    failing = true;
                }
                conn = None;
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        match wake.recv_timeout(POLL) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => while wake.try_recv().is_ok() {},
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Publishes every revision after the published one, up to the database's current revision,
/// and announces lease changes.
fn catch_up(c: &mut mysql::Conn, shared: &Shared, epoch: &mut Option<i64>, leases: &mut Leases) -> anyhow::Result<()> {
    let published = shared.current.load(Ordering::SeqCst);
    c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").context("begin feed transaction")?;
    let (current, compacted, now_epoch) = schema::revisions(c)?;
    let events = if current > published {
        view::events(c, &KeyRange::all(), published, current, &mut Default::default())?
    } else {
        Vec::new()
    };
    let table: Option<Vec<(i64, i64, i64)>> = if *epoch != Some(now_epoch) {
        Some(c.query("SELECT id, ttl, renewals FROM lease").context("read leases")?)
    } else {
        None
    };
    c.query_drop("COMMIT").context("end feed transaction")?;
    shared.publish(published, current, compacted, events);
    if let Some(table) = table {
        announce_leases(shared, leases, table, epoch.is_none());
        *epoch = Some(now_epoch);
    }
    Ok(())
}

/// Tells this node's lessor what changed in the lease table since the last read: a new lease
/// or a renewal restarts its TTL here, a vanished one is revoked. After (re)connecting
/// (`fresh`) every lease starts its TTL again, as etcd does on a leader change.
fn announce_leases(shared: &Shared, known: &mut Leases, table: Vec<(i64, i64, i64)>, fresh: bool) {
    let now: Leases = table.into_iter().map(|(id, ttl, renewals)| (id, (ttl, renewals))).collect();
    for (id, (ttl, renewals)) in &now {
        if fresh || known.get(id).is_none_or(|(_, r)| r != renewals) {
            shared.seen().insert(*id, *renewals);
            let _ = shared.lease_updates.send(LeaseUpdate::Renewed { id: *id, ttl: *ttl });
        }
    }
    for id in known.keys().filter(|id| !now.contains_key(id)) {
        shared.seen().remove(id);
        let _ = shared.lease_updates.send(LeaseUpdate::Revoked { id: *id });
    }
    *known = now;
}
