//! Before a compaction purges: one read of a message in every stretch of the stream it will
//! purge from, so that nats-server has those message blocks loaded before the first purge.
//!
//! A subject-filtered purge (`PurgeEx`) walks every message block between the subject's first
//! and last message, and needs each block's per-subject index, loading it from disk if it is
//! not in memory (nats-server drops an index two minutes after its block was last used) — all
//! under the stream's lock, which every write to the stream waits for. A key updated all along
//! the history (a node lease, a busy object) has messages in nearly every block, so the first
//! purge loaded the index of nearly every block in one hold of the lock: with 1.1 M messages
//! the writes waited 0.2–0.5 s (docs/BENCHMARKS.md, "Compaction without stalls"). A read of one
//! message by its sequence loads its block and that index without the stream's lock (only the
//! block's), one block at a time, so the writes go on while this runs. Best effort: a read that
//! fails is skipped (the purge loads what is missing, as before).

use super::{Inner, timed};
use kine_core::Revision;
use std::time::Instant;

/// nats-server's message block size for a KV-style stream (`defaultKVBlockSize`, 4 MiB).
const BLOCK_BYTES: u64 = 4 << 20;

/// Reads per block: more than one, since blocks do not start where a stride does.
const READS_PER_BLOCK: u64 = 2;

impl Inner {
    /// Reads a stored message about every half block in `(previous, revision]`.
    pub(super) async fn warm(&self, previous: Revision, revision: Revision) {
        let started = Instant::now();
        let Ok(info) = timed("read the stream state", self.stream.get_info()).await else { return };
        let stride = stride(info.state.bytes, info.state.messages);
        let samples = self.table().log_samples(previous.max(0), revision, stride as Revision);
        let (mut read, total) = (0, samples.len());
        for (key, rev) in samples {
            let seq = self.seqs().get(&key, rev);
            if self.stream.get_raw_message(seq as u64).await.is_ok() {
                read += 1;
            }
        }
        tracing::debug!(
            previous,
            revision,
            stride,
            read,
            total,
            ms = started.elapsed().as_millis() as u64,
            "read the history to be purged"
        );
    }
}

/// Sequences between two reads: half a block's worth of messages of the stream's mean size.
fn stride(bytes: u64, messages: u64) -> u64 {
    let mean = bytes.checked_div(messages).unwrap_or(0).max(1);
    (BLOCK_BYTES / mean / READS_PER_BLOCK).max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stride_is_half_a_block_of_messages() {
        // 1.1 M messages of ~330 bytes: ~12,700 a block, a read every ~6,350.
        assert_eq!(super::stride(363_000_000, 1_100_000), 6355);
        // Values larger than a block: every message.
        assert_eq!(super::stride(10 << 30, 1000), 1);
        // An empty stream does not divide by zero.
        assert_eq!(super::stride(0, 0), 2 << 20);
    }
}
