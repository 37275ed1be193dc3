//! SQLite's compaction (`removal.rs`: a short logical step, then removal in small batches), on
//! the writer thread: SQLite has one writer, so the removal takes turns with the writes, one
//! batch between two write batches and as many as it likes while no write waits. A write waits
//! for one batch at most, so batches are kept short: their size follows how long the last one
//! took (a batch of log rows deletes every superseded version of their keys, many rows for keys
//! with a long history).

use crate::removal::{BATCH_ROWS, REMOVED, Removal, Waiters};
use crate::schema;
use anyhow::Context;
use kine_core::{Error, Revision, txn};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a failed removal batch waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// A batch taking longer halves the next one; one taking less than a quarter of it doubles it.
const BATCH_TIME: Duration = Duration::from_millis(4);
/// Log rows of the first batch (small: a write may be waiting for it).
const START_ROWS: i64 = 64;
/// Log rows per batch: the bounds of the adaptation.
const BATCH_RANGE: std::ops::RangeInclusive<i64> = 8..=8 * BATCH_ROWS;

/// The writer thread's compaction in progress.
pub struct Compacting {
    removal: Option<Removal>,
    waiters: Waiters,
    retry_at: Option<Instant>,
    started: Option<Instant>,
    /// Log rows of the next batch.
    rows: i64,
}

impl Default for Compacting {
    fn default() -> Self {
        Compacting { removal: None, waiters: Waiters::default(), retry_at: None, started: None, rows: START_ROWS }
    }
}

impl Compacting {
    /// The removal the previous process left unfinished, if any.
    pub fn resume(conn: &Connection) -> Compacting {
        let owed = (|| -> anyhow::Result<Option<Removal>> {
            let (_, compacted) = schema::revisions(conn)?;
            Ok(Removal::owed(schema::get(conn, REMOVED)?, compacted))
        })();
        let removal = match owed {
            Ok(Some(owed)) => {
                tracing::info!(from = owed.from, to = owed.to, "resuming the removal of compacted versions");
                Some(owed)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "cannot read how far compaction removal came");
                None
            }
        };
        Compacting { removal, started: Some(Instant::now()), ..Compacting::default() }
    }

    /// How long until the next batch is due; `None` when no removal is owed.
    pub fn due(&self) -> Option<Duration> {
        self.removal?;
        Some(self.retry_at.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now())))
    }

    /// The logical step: records `revision` as the compact revision; the reply comes now, or
    /// with `physical` once the removal covering it is done.
    pub fn schedule(
        &mut self,
        conn: &mut Connection,
        current: Revision,
        compacted: &AtomicI64,
        revision: Revision,
        physical: bool,
        reply: oneshot::Sender<kine_core::Result<Revision>>,
    ) {
        let previous = compacted.load(Ordering::SeqCst);
        let scheduled = txn::check_compact(revision, current, previous)
            .and_then(|()| record(conn, revision, previous).context("compact").map_err(Error::Backend));
        match scheduled {
            Ok(removed) => {
                compacted.store(revision, Ordering::SeqCst);
                if self.removal.is_none() {
                    self.started = Some(Instant::now());
                }
                self.removal = Some(Removal::new(removed, revision));
                self.retry_at = None;
                if physical {
                    self.waiters.push(revision, current, reply);
                } else {
                    let _ = reply.send(Ok(current));
                }
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// One removal batch, in a transaction of its own.
    pub fn step(&mut self, conn: &mut Connection) {
        let Some(mut removal) = self.removal else { return };
        let started = Instant::now();
        let outcome = remove_batch(conn, &mut removal, self.rows);
        let took = started.elapsed();
        if took > BATCH_TIME {
            self.rows = (self.rows / 2).max(*BATCH_RANGE.start());
        } else if took < BATCH_TIME / 4 {
            self.rows = (self.rows * 2).min(*BATCH_RANGE.end());
        }
        match outcome {
            Ok(true) => self.removal = Some(removal),
            Ok(false) => {
                tracing::debug!(
                    from = removal.from,
                    to = removal.to,
                    seconds = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64()),
                    "compacted versions removed"
                );
                self.removal = None;
                self.waiters.finished(removal.to);
            }
            Err(e) => {
                let text = format!("{e:#}");
                tracing::warn!(error = %text, to = removal.to, "removing compacted versions failed; retrying in 5 s");
                self.waiters.fail(|| Error::Backend(anyhow::anyhow!("{text}")));
                self.retry_at = Some(Instant::now() + RETRY);
            }
        }
    }
}

/// Records the compact revision (and, if the row is missing, that removal stands at the
/// previous one); returns where removal stands.
fn record(conn: &mut Connection, revision: Revision, previous: Revision) -> anyhow::Result<Revision> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let removed = schema::get(&tx, REMOVED)?.unwrap_or(previous);
    schema::set(&tx, "compact_revision", revision)?;
    schema::set(&tx, REMOVED, removed)?;
    tx.commit()?;
    Ok(removed)
}

/// Deletes the superseded versions of the keys of the next `rows` log rows after the cursor,
/// and advances it; at the end records the removal done. `false` when done.
fn remove_batch(conn: &mut Connection, removal: &mut Removal, rows: i64) -> anyhow::Result<bool> {
    // A removal batch needs no fsync of its own: the WAL is written in order, so a crash loses
    // only batches after the last synced commit (a write's), and those are done again (the
    // compact revision was synced first; `compact_removed` advances only with the last batch).
    conn.pragma_update(None, "synchronous", "NORMAL").context("set synchronous=NORMAL for removal")?;
    let result = remove_batch_in(conn, removal, rows);
    conn.pragma_update(None, "synchronous", "FULL").context("set synchronous=FULL after removal")?;
    result
}

fn remove_batch_in(conn: &mut Connection, removal: &mut Removal, rows: i64) -> anyhow::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).context("begin removal")?;
    let (after, sub) = removal.cursor;
    let last: Option<(i64, i64)> = tx
        .prepare_cached(
            "SELECT mod_revision, sub FROM
               (SELECT mod_revision, sub FROM kv WHERE (mod_revision, sub) > (?1, ?2) AND mod_revision <= ?3
                ORDER BY mod_revision, sub LIMIT ?4)
             ORDER BY mod_revision DESC, sub DESC LIMIT 1",
        )?
        .query_row(params![after, sub, removal.to, rows], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .context("find the batch's end")?;
    let Some(last) = last else {
        tx.execute("UPDATE meta SET value = ?1 WHERE name = ?2 AND value < ?1", params![removal.to, REMOVED])
            .context("record the removal of compacted versions")?;
        tx.commit().context("commit removal")?;
        return Ok(false);
    };
    tx.prepare_cached(
        "DELETE FROM kv WHERE mod_revision <= ?5
           AND key IN (SELECT key FROM kv WHERE (mod_revision, sub) > (?1, ?2) AND (mod_revision, sub) <= (?3, ?4))
           AND ((deleted = 1 AND mod_revision < ?5)
                OR EXISTS (SELECT 1 FROM kv n WHERE n.key = kv.key AND n.mod_revision <= ?5
                           AND (n.mod_revision, n.sub) > (kv.mod_revision, kv.sub)))",
    )?
    .execute(params![after, sub, last.0, last.1, removal.to])
    .context("delete superseded versions")?;
    tx.commit().context("commit removal")?;
    removal.cursor = last;
    Ok(true)
}
