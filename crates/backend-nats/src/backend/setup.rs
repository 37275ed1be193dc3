//! Start-up steps, patient with a NATS cluster that is still forming; reading the meta bucket
//! before anything is served.

use super::{Inner, meta};
use anyhow::{Context as _, anyhow};
use futures_util::StreamExt;
use std::time::{Duration, Instant};

/// How long start-up waits for JetStream to answer (a forming cluster, a leader election)
/// before giving up with the last error.
pub(super) const PATIENCE: Duration = Duration::from_secs(60);
/// A bound on one attempt of a step (each NATS request in it has its own 5 s timeout; loading
/// many leases takes many requests).
const ATTEMPT_LIMIT: Duration = Duration::from_secs(30);

/// An error that no retry can mend, whatever its text says (it may quote a NATS error that is
/// transient elsewhere).
#[derive(Debug)]
pub(super) struct Final(pub String);

impl std::fmt::Display for Final {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Final {}

/// Runs a start-up step until it succeeds, retrying while it fails the way a NATS cluster that is
/// forming or electing a leader fails (no responders, timeouts, "temporarily unavailable", no
/// peers yet), for up to [`PATIENCE`]. Other errors, and the last one after that, fail at once.
pub(super) async fn patiently<T, F, Fut>(what: &str, mut step: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let started = Instant::now();
    let mut warned = started;
    loop {
        let error = match tokio::time::timeout(ATTEMPT_LIMIT, step()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(_) => anyhow!("{what}: timed out after {ATTEMPT_LIMIT:?}"),
        };
        // Data kine-rs does not own stays what it is.
        let last = error.downcast_ref::<Final>().is_some() || kine_core::foreign::Foreign::find(&error).is_some();
        if last || !super::transient(&format!("{error:#}")) || started.elapsed() >= PATIENCE {
            return Err(error);
        }
        tracing::debug!(error = format!("{error:#}"), "{what}: JetStream not ready; retrying");
        if warned.elapsed() >= Duration::from_secs(10) {
            warned = Instant::now();
            tracing::warn!(
                waited_s = started.elapsed().as_secs(),
                error = format!("{error:#}"),
                "{what}: still waiting for JetStream"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Reads the leases, and whether this datastore was superseded, before anything is served.
pub(super) async fn load_meta(inner: &Inner) -> anyhow::Result<()> {
    let mut keys = inner.meta.keys().await.context("list leases")?;
    while let Some(key) = keys.next().await {
        let key = key.context("list leases")?;
        if key == super::auth::AUTH || super::members::is_member(&key) {
            continue; // read when asked for
        }
        if let Some(entry) = inner.meta.entry(&key).await.context("read a lease")? {
            if key == meta::SUPERSEDED {
                inner.on_superseded(&entry.value);
            } else {
                inner.apply_lease(&entry);
            }
        }
    }
    Ok(())
}
