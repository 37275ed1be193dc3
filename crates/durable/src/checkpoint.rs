//! Checkpoints: the whole key space at one revision, with the leases and the auth record, as
//! parts in the segment format under `checkpoint/<term:10>/<revision:20>/`. A restore starts
//! from the newest one and applies the segments shipped after it; the segments before it are no
//! longer needed.
//!
//! A part holds version records of the keys in key order (each at its own mod revision, the
//! sub revision its position among the keys, as `kine-rs migrate` copies keys); the last part
//! also holds the leases, the auth record, `Compact` and `Committed` at the checkpoint's
//! revision. The parts' sha256 goes into the manifest.

use crate::manifest::{self, Checkpoint};
use crate::segment::{Record, Segment};
use crate::ship::{self, Position};
use bytes::Bytes;
use kine_core::backend::Backend;
use kine_core::pages::Pager;
use kine_core::{Event, EventKind, KeyRange};
use kine_objstore::ObjectStore;
use sha2::{Digest, Sha256};

/// Bytes of keys and values a part holds at most (about; one key never splits).
pub const PART_BYTES: usize = 32 << 20;

/// Writes a checkpoint of `backend` at `position.revision` (every revision up to it shipped:
/// the segment `position.segment` of `term` is the last before it) with the leases and auth
/// record of `position`. Returns its manifest entry; the manifest is not touched.
pub async fn write(
    store: &dyn ObjectStore,
    backend: &dyn Backend,
    term: u64,
    position: &Position,
) -> anyhow::Result<Checkpoint> {
    let revision = position.revision;
    let folder = manifest::checkpoint_object(term, revision);
    let mut keys = Pager::new(backend, KeyRange::all(), revision);
    let (mut parts, mut sha, mut sub) = (0u32, Sha256::new(), 0usize);
    let mut records = Vec::new();
    let mut bytes = 0;
    loop {
        let next = keys.next().await?;
        let end = next.is_none();
        if let Some(kv) = next {
            bytes += kv.key.len() + kv.value.len();
            let mod_revision = kv.mod_revision;
            records.push(ship::record(mod_revision, sub, Event { kind: EventKind::Put, kv, prev_kv: None }));
            sub += 1;
        }
        if end {
            records.extend(ship::state_changes(&Position::default(), position));
            records.push(Record::Compact { revision });
            records.push(Record::Committed { revision });
        }
        if end || bytes >= PART_BYTES {
            let body = Segment { term, first_revision: revision, records: std::mem::take(&mut records) }.encode();
            sha.update(&body);
            store.put(&manifest::checkpoint_part(&folder, parts), Bytes::from(body)).await?;
            parts += 1;
            bytes = 0;
        }
        if end {
            break;
        }
    }
    Ok(Checkpoint {
        object: folder,
        revision,
        sha256: hex(&sha.finalize()),
        parts,
        after_segment: (term, position.segment),
    })
}

/// A checkpoint's parts, read one at a time and checked against its sha256 after the last.
pub struct Parts<'a> {
    store: &'a dyn ObjectStore,
    checkpoint: &'a Checkpoint,
    next: u32,
    sha: Sha256,
}

impl<'a> Parts<'a> {
    pub fn new(store: &'a dyn ObjectStore, checkpoint: &'a Checkpoint) -> Parts<'a> {
        Parts { store, checkpoint, next: 0, sha: Sha256::new() }
    }

    /// The next part's records; `None` after the last, once the sha256 matched.
    pub async fn next(&mut self) -> anyhow::Result<Option<Vec<Record>>> {
        let checkpoint = self.checkpoint;
        if self.next == checkpoint.parts {
            let sha = hex(&std::mem::take(&mut self.sha).finalize());
            if sha != checkpoint.sha256 {
                anyhow::bail!(
                    "the checkpoint {} does not match its sha256 in the manifest: damaged",
                    checkpoint.object
                );
            }
            self.next += 1;
            return Ok(None);
        }
        if self.next > checkpoint.parts {
            return Ok(None);
        }
        let name = manifest::checkpoint_part(&checkpoint.object, self.next);
        let object = self.store.get(&name).await?.ok_or_else(|| anyhow::anyhow!("{name} is missing"))?;
        self.sha.update(&object.body);
        let segment = Segment::decode(&object.body).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        if segment.first_revision != checkpoint.revision {
            anyhow::bail!("{name} is of revision {}, not {}", segment.first_revision, checkpoint.revision);
        }
        self.next += 1;
        Ok(Some(segment.records))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
