//! Leases: grant, keep-alive, time-to-live, and expiry.
//!
//! A lease's id and TTL live in the backend (they survive a restart; no revision is spent on
//! them). Deadlines live here, in memory: as in etcd, a restart gives every lease its full TTL
//! again. Expiry revokes the lease through the backend, deleting its keys in one revision.

use crate::backend::{Backend, LeaseUpdate};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::txn::WriteOp;
use crate::types::{LeaseId, Revision};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// etcd's smallest TTL with default election settings (ceil(1.5 × 1 s election timeout)).
pub const MIN_TTL: i64 = 2;
/// etcd's largest TTL.
pub const MAX_TTL: i64 = 9_000_000_000;
/// Longest sleep of the expiry loop between checks.
const CHECK_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct LeaseState {
    ttl: i64,
    deadline: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeToLive {
    pub id: LeaseId,
    /// Remaining seconds (truncated).
    pub ttl: i64,
    pub granted_ttl: i64,
    pub keys: Vec<Vec<u8>>,
}

pub struct Lessor {
    backend: Arc<dyn Backend>,
    leases: Mutex<HashMap<LeaseId, LeaseState>>,
    /// Wakes the expiry loop when a lease with an earlier deadline appears.
    changed: Notify,
    /// Wakes time-to-live questions about an expired lease when a lease is gone.
    gone: Notify,
}

impl Lessor {
    /// Loads the persisted leases; each gets its full TTL from now.
    pub async fn load(backend: Arc<dyn Backend>) -> Result<Arc<Lessor>> {
        let now = Instant::now();
        let leases = backend
            .leases()
            .await?
            .into_iter()
            .map(|(id, ttl)| (id, LeaseState { ttl, deadline: now + secs(ttl) }))
            .collect();
        Ok(Arc::new(Lessor { backend, leases: Mutex::new(leases), changed: Notify::new(), gone: Notify::new() }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, LeaseState>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops a lease that was revoked (here or by another node).
    fn forget(&self, id: LeaseId) {
        self.state().remove(&id);
        self.gone.notify_waiters();
    }

    /// Grants a lease; `id` 0 lets the server choose. Returns the id and the granted TTL.
    pub async fn grant(&self, id: LeaseId, ttl: i64) -> Result<(LeaseId, i64)> {
        if ttl > MAX_TTL {
            return Err(Error::LeaseTtlTooLarge);
        }
        if id < 0 {
            return Err(Error::InvalidArgument("etcdserver: lease ID must be positive".into()));
        }
        let ttl = ttl.max(MIN_TTL);
        let id = if id == 0 {
            loop {
                let candidate = crate::id::random_positive_i64();
                if !self.state().contains_key(&candidate) {
                    break candidate;
                }
            }
        } else {
            id
        };
        self.backend.write(WriteOp::LeaseGrant { id, ttl }).await?;
        crate::metrics::metrics().leases_granted.inc();
        self.state().insert(id, LeaseState { ttl, deadline: Instant::now() + secs(ttl) });
        self.changed.notify_one();
        Ok((id, ttl))
    }

    /// Revokes a lease, deleting its keys. Returns the store revision after it.
    pub async fn revoke(&self, id: LeaseId) -> Result<Revision> {
        if !self.state().contains_key(&id) {
            return Err(Error::LeaseNotFound);
        }
        let result = self.backend.write(WriteOp::LeaseRevoke { id, expired: false }).await;
        if result.is_ok() {
            crate::metrics::metrics().leases_revoked.inc();
        }
        if matches!(result, Ok(_) | Err(Error::LeaseNotFound)) {
            self.forget(id);
        }
        Ok(result?.revision)
    }

    /// Renews a lease. Returns its TTL, or `LeaseNotFound` if it is gone or already expired.
    pub async fn keep_alive(&self, id: LeaseId) -> Result<i64> {
        let ttl = {
            let mut leases = self.state();
            let now = Instant::now();
            match leases.get_mut(&id) {
                Some(l) if l.deadline > now => {
                    l.deadline = now + secs(l.ttl);
                    l.ttl
                }
                _ => return Err(Error::LeaseNotFound),
            }
        };
        // Other nodes sharing the datastore extend it too.
        self.backend.lease_renew(id, ttl).await?;
        crate::metrics::metrics().leases_renewed.inc();
        Ok(ttl)
    }

    /// Follows lease changes made by other nodes of a shared datastore, until shutdown.
    pub async fn follow_updates(self: Arc<Self>, mut shutdown: Shutdown) {
        let Some(mut updates) = self.backend.lease_updates() else { return };
        loop {
            let update = tokio::select! {
                _ = shutdown.wait() => return,
                u = updates.recv() => u,
            };
            match update {
                Ok(LeaseUpdate::Renewed { id, ttl }) => {
                    self.state().insert(id, LeaseState { ttl, deadline: Instant::now() + secs(ttl) });
                    self.changed.notify_one();
                }
                Ok(LeaseUpdate::Revoked { id }) => self.forget(id),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "missed lease updates; reloading leases");
                    if let Ok(all) = self.backend.leases().await {
                        let mut state = self.state();
                        let now = Instant::now();
                        state.retain(|id, _| all.iter().any(|(i, _)| i == id));
                        for (id, ttl) in all {
                            state.entry(id).or_insert(LeaseState { ttl, deadline: now + secs(ttl) });
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// `None` when the lease does not exist. A lease past its deadline is being revoked (its
    /// keys deleted, the events sent to watchers): the answer waits for that, up to
    /// [`REVOKE_WAIT`], so that nobody learns of the deletion and then finds the lease alive (in
    /// etcd the revoke deletes both at once). After that it answers TTL 0, as etcd does for an
    /// expired lease not revoked yet.
    pub async fn time_to_live(&self, id: LeaseId, with_keys: bool) -> Result<Option<TimeToLive>> {
        let waited_until = Instant::now() + REVOKE_WAIT;
        let (ttl, granted_ttl) = loop {
            let gone = self.gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            {
                let leases = self.state();
                let Some(l) = leases.get(&id) else { return Ok(None) };
                let now = Instant::now();
                if l.deadline > now || now >= waited_until {
                    break (l.deadline.saturating_duration_since(now).as_secs() as i64, l.ttl);
                }
            }
            let _ = tokio::time::timeout_at(waited_until, gone).await;
        };
        let keys = if with_keys { self.backend.lease_keys(id).await? } else { Vec::new() };
        Ok(Some(TimeToLive { id, ttl, granted_ttl, keys }))
    }

    pub fn list(&self) -> Vec<LeaseId> {
        let mut ids: Vec<LeaseId> = self.state().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Revokes leases as they expire, until shutdown. A node that cannot write (a read-only
    /// copy) revokes nothing: the origin does. When such a node becomes writable (a promoted
    /// copy) every lease gets its full TTL from then on, as etcd's new leader gives them.
    pub async fn run_expiry(self: Arc<Self>, mut shutdown: Shutdown) {
        let mut writable = self.backend.role().refusal().is_none();
        // After a revoke failed (the datastore unreachable): when to try again, and how many
        // attempts failed in a row.
        let mut retry_at: Option<Instant> = None;
        let mut failures = 0u64;
        loop {
            let wake = {
                let leases = self.state();
                // Expired leases wait on a node that cannot revoke them: no busy loop.
                let next = leases.values().map(|l| l.deadline).min().filter(|_| writable);
                let cap = Instant::now() + CHECK_INTERVAL;
                let wake = next.map_or(cap, |d| d.min(cap));
                retry_at.map_or(wake, |r| wake.max(r))
            };
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.changed.notified() => continue,
            }
            let now = Instant::now();
            match (writable, self.backend.role().refusal().is_none()) {
                (_, false) => {
                    writable = false;
                    continue;
                }
                (false, true) => {
                    writable = true;
                    for lease in self.state().values_mut() {
                        lease.deadline = now + secs(lease.ttl);
                    }
                    tracing::info!("this node now writes: every lease's TTL starts again");
                    continue;
                }
                (true, true) => {}
            }
            let expired: Vec<LeaseId> =
                self.state().iter().filter(|(_, l)| l.deadline <= now).map(|(id, _)| *id).collect();
            for id in expired {
                // A keep-alive may have raced in; only revoke what is still expired.
                let still_expired = self.state().get(&id).is_some_and(|l| l.deadline <= Instant::now());
                if !still_expired {
                    continue;
                }
                match self.backend.write(WriteOp::LeaseRevoke { id, expired: true }).await {
                    Ok(r) => {
                        if failures > 0 {
                            tracing::info!(failed_attempts = failures, "expired leases are revoked again");
                            (failures, retry_at) = (0, None);
                        }
                        tracing::debug!(lease = id, revision = r.revision, "lease expired and revoked");
                        crate::metrics::metrics().leases_expired.inc();
                        crate::metrics::metrics().leases_revoked.inc();
                        self.forget(id);
                    }
                    Err(Error::LeaseNotFound) => self.forget(id),
                    Err(e) => {
                        // Once a second, not in a loop; one warning until it works again.
                        if failures == 0 {
                            tracing::warn!(lease = id, error = %e, "cannot revoke an expired lease; retrying every second");
                        } else {
                            tracing::debug!(lease = id, error = %e, "cannot revoke an expired lease");
                        }
                        failures += 1;
                        retry_at = Some(Instant::now() + REVOKE_RETRY);
                        break;
                    }
                }
            }
        }
    }
}

/// How long expiry waits after a revoke failed.
const REVOKE_RETRY: Duration = Duration::from_secs(1);

/// How long a time-to-live question about an expired lease waits for its revoke.
const REVOKE_WAIT: Duration = Duration::from_secs(1);

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}
