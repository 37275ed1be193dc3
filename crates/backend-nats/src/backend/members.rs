//! The member registry of the nodes sharing one bucket: the keys `member.<id>` (decimal) of
//! `<bucket>-meta`, one per node, holding its opaque record. Outside the key space (no
//! revision, no event), and followed by nobody: read when asked for. A copy lists its mirror of
//! the origin's meta bucket and stores nothing (its origin's nodes are the members).

use super::{Inner, NATS_TIMEOUT, timed, unavailable};
use async_nats::jetstream::kv;
use futures_util::StreamExt;
use kine_core::Result;

/// The prefix of member record keys.
pub(super) const MEMBER_PREFIX: &str = "member.";

/// Whether a meta key is a member record.
pub(super) fn is_member(key: &str) -> bool {
    key.starts_with(MEMBER_PREFIX)
}

impl Inner {
    pub(super) async fn member_put(&self, id: u64, record: Vec<u8>) -> Result<()> {
        self.check_open()?;
        if self.role().refusal().is_some() {
            return Ok(());
        }
        timed("store the member record", self.meta.put(format!("{MEMBER_PREFIX}{id}"), record.into())).await?;
        Ok(())
    }

    /// Asks the server which member keys the meta bucket holds (a subject filter on the stream's
    /// info: the lease records beside them are not listed) and reads each.
    pub(super) async fn member_records(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        self.check_open()?;
        let read = async {
            let mut records = Vec::new();
            let filter = format!("{}{MEMBER_PREFIX}>", self.meta.prefix);
            let mut subjects = self.meta.stream.info_with_subjects(&filter).await.map_err(|e| e.to_string())?;
            let mut keys = Vec::new();
            while let Some(subject) = subjects.next().await {
                let (subject, _) = subject.map_err(|e| e.to_string())?;
                if let Some(key) = subject.strip_prefix(self.meta.prefix.as_str()) {
                    keys.push(key.to_string());
                }
            }
            for key in keys {
                let Some(id) = key.strip_prefix(MEMBER_PREFIX).and_then(|s| s.parse::<u64>().ok()) else { continue };
                match self.meta.entry(key).await.map_err(|e| e.to_string())? {
                    Some(e) if e.operation == kv::Operation::Put => records.push((id, e.value.to_vec())),
                    _ => {} // deleted
                }
            }
            records.sort_unstable_by_key(|(id, _)| *id);
            Ok::<_, String>(records)
        };
        match tokio::time::timeout(NATS_TIMEOUT, read).await {
            Ok(Ok(records)) => Ok(records),
            Ok(Err(e)) => Err(unavailable(format!("read the member records: {e}"))),
            Err(_) => Err(unavailable(format!("read the member records: timed out after {NATS_TIMEOUT:?}"))),
        }
    }

    pub(super) async fn member_delete(&self, id: u64) -> Result<()> {
        self.check_open()?;
        if self.role().refusal().is_some() {
            return Ok(());
        }
        timed("delete the member record", self.meta.purge(format!("{MEMBER_PREFIX}{id}"))).await
    }
}
