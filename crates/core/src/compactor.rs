//! Automatic compaction (`--compact-interval`): keeps the newest `min_retain` revisions and
//! compacts everything older, in steps of `batch_size` revisions, at most `timeout` per run.

use crate::backend::Backend;
use crate::shutdown::Shutdown;
use crate::types::Revision;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct CompactOptions {
    /// Zero disables automatic compaction (the apiserver then drives it through `Compact`).
    pub interval: Duration,
    pub min_retain: i64,
    pub batch_size: i64,
    pub timeout: Duration,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions { interval: Duration::ZERO, min_retain: 1000, batch_size: 1000, timeout: Duration::from_secs(5) }
    }
}

pub async fn run(backend: Arc<dyn Backend>, options: CompactOptions, mut shutdown: Shutdown) {
    if options.interval.is_zero() {
        return;
    }
    let mut ticker = tokio::time::interval(options.interval);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = ticker.tick() => {}
        }
        // A read-only copy's origin compacts; the copy follows its compactions.
        if backend.role().refusal().is_some() {
            continue;
        }
        // kine's kine_compact_total: one per run; "error" unless it succeeded or found the
        // revision compacted already (by another node).
        let result = match compact_once(&*backend, &options).await {
            Ok(Some(rev)) => {
                tracing::debug!(revision = rev, "automatic compaction done");
                "success"
            }
            Ok(None) | Err(crate::error::Error::Compacted { .. }) => "success",
            Err(e) => {
                tracing::warn!(error = %e, "automatic compaction failed");
                "error"
            }
        };
        crate::metrics::metrics().compact_total.with_label_values(&[result]).inc();
    }
}

/// One automatic compaction run. Returns the revision compacted to, if any.
pub async fn compact_once(backend: &dyn Backend, options: &CompactOptions) -> crate::error::Result<Option<Revision>> {
    let revs = backend.revisions().await?;
    let target = revs.current - options.min_retain.max(0);
    // -1: never compacted; the first step still starts from revision 0.
    let mut done = revs.compacted.max(0);
    if target <= done {
        return Ok(None);
    }
    let started = Instant::now();
    while done < target {
        let step = (done + options.batch_size.max(1)).min(target);
        backend.compact(step).await?;
        done = step;
        if started.elapsed() >= options.timeout {
            break;
        }
    }
    crate::metrics::metrics().compaction_ms.observe(started.elapsed().as_secs_f64() * 1000.0);
    Ok(Some(done))
}
