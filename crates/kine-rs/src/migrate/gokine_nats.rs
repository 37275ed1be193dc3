//! A bucket Go kine wrote on NATS (an external server or cluster, or Go kine's embedded
//! server's store) as a `kine-rs migrate` source: its messages read in order
//! (`kine_backend_nats::gokine_bucket`) and turned into a kine-rs history with the same revision
//! numbers (a message's sequence is its revision) by the same rules as Go kine's SQL table
//! (`gokine.rs`). A deletion's `DEL` marker, the second revision Go kine spends on a delete,
//! carries no change.
//!
//! Go kine compacts NATS only logically (the apiserver's `compact_rev_key` names the revision)
//! and keeps at most `revHistory` messages per key (10 by default): older ones are removed by
//! JetStream. The copy's history starts where what the bucket holds is complete: at the greatest
//! of Go kine's compact revision, the newest removed sequence, and, for each key whose oldest
//! message left is not its creation (its earlier versions removed), that message; every key's
//! version there is known, and every change after it is in the bucket.

use super::gokine::{Builder, Loaded};
use anyhow::Result;
use kine_backend_nats::gokine_bucket::{self, GoKineChange, GoKineMessage};
use kine_backend_sql::GoKineRow;
use kine_core::Revision;
use std::collections::HashMap;

/// Reads the bucket `config` names (through the server it names, or an embedded one on a
/// stopped node's store) into memory.
pub async fn load(
    config: kine_backend_nats::config::NatsConfig,
    tls: kine_backend_nats::connect::ClientTls,
) -> Result<Loaded> {
    let mut messages: Vec<GoKineMessage> = Vec::new();
    let stream = gokine_bucket::read(&config, &tls, |m| {
        messages.push(m);
        Ok(())
    })
    .await?;
    let start = history_start(&messages, stream.first_seq, stream.last_seq);
    tracing::info!(
        revision = stream.last_seq,
        messages = messages.len(),
        history_from = start,
        "reading Go kine's NATS bucket"
    );
    tokio::task::spawn_blocking(move || {
        let mut build = Builder::new(start);
        for m in messages {
            let seq = m.seq as Revision;
            if seq <= start {
                build.at_compaction(row(m, true));
            } else if !matches!(m.change, GoKineChange::Marker) {
                build.after(&row(m, false))?;
            }
        }
        build.finish(stream.last_seq as Revision)
    })
    .await?
}

/// Where the bucket's history is complete (see the module documentation); below 2, all of it.
fn history_start(messages: &[GoKineMessage], first_seq: u64, last_seq: u64) -> Revision {
    let mut start: u64 = first_seq.saturating_sub(1);
    // Sequences removed from the stream (holes between the messages read).
    let mut expected = first_seq;
    for m in messages {
        if m.seq > expected {
            start = start.max(m.seq - 1);
        }
        expected = m.seq + 1;
    }
    if expected <= last_seq {
        start = start.max(last_seq);
    }
    // Keys whose oldest message left is a version but not their creation.
    let mut first: HashMap<&[u8], &GoKineMessage> = HashMap::new();
    for m in messages {
        first.entry(m.key.as_slice()).or_insert(m);
    }
    for m in first.values() {
        if let GoKineChange::Put { create: false, .. } = m.change {
            start = start.max(m.seq);
        }
    }
    // Go kine's own compact revision, from the apiserver's key (`<version>|<revision>`).
    for m in messages.iter().filter(|m| m.key == b"compact_rev_key_apiserver") {
        if let GoKineChange::Put { value, .. } = &m.change
            && let Some(rev) = std::str::from_utf8(value).ok().and_then(|v| v.rsplit('|').next()?.parse::<u64>().ok())
        {
            start = start.max(rev.min(last_seq));
        }
    }
    if start < 2 { -1 } else { start as Revision }
}

/// A message as a row of Go kine's SQL table; a marker below the history's start is the
/// deletion it ends (its tombstone may be gone).
fn row(m: GoKineMessage, below_start: bool) -> GoKineRow {
    let (deleted, created, create_revision, lease, value) = match m.change {
        GoKineChange::Put { value, create_revision, lease, create } => (false, create, create_revision, lease, value),
        GoKineChange::Delete => (true, false, 0, 0, Vec::new()),
        GoKineChange::Marker => (below_start, false, 0, 0, Vec::new()),
    };
    GoKineRow { id: m.seq as i64, name: m.key, created, deleted, create_revision, prev_revision: 0, lease, value }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(seq: u64, key: &str, create: bool) -> GoKineMessage {
        let change = GoKineChange::Put { value: b"v".to_vec(), create_revision: 0, lease: 0, create };
        GoKineMessage { seq, key: key.as_bytes().to_vec(), change }
    }

    #[test]
    fn the_history_starts_where_the_bucket_is_complete() {
        // Everything there, every key from its creation: all of it.
        let all = [put(1, "/a", true), put(2, "/a", false), put(3, "/b", true)];
        assert_eq!(history_start(&all, 1, 3), -1);
        // Sequence 2 removed: from 2 on.
        let holed = [put(1, "/a", true), put(3, "/a", false), put(4, "/b", true)];
        assert_eq!(history_start(&holed, 1, 4), 2);
        // /a's oldest message left is an update (its creation removed): from it.
        let cut = [put(5, "/a", false), put(6, "/b", true), put(7, "/a", false)];
        assert_eq!(history_start(&cut, 5, 7), 5);
        // The apiserver's compaction.
        let mut compacted = vec![put(1, "/a", true), put(2, "/b", true)];
        let change = GoKineChange::Put { value: b"1|2".to_vec(), create_revision: 0, lease: 0, create: true };
        compacted.push(GoKineMessage { seq: 3, key: b"compact_rev_key_apiserver".to_vec(), change });
        assert_eq!(history_start(&compacted, 1, 3), 2);
    }
}
