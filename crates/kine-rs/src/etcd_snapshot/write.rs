//! Writing a snapshot as etcd's bbolt file. The keys arrive in key order but etcd's `key`
//! bucket is ordered by revision: each key's record goes to a spill file first, a small index
//! (revision, offset, length) is sorted, and the records are then put in revision order, which
//! fills bbolt's pages completely. Memory stays at about 24 bytes per key.

use super::{BUCKETS, FINISHED_COMPACT, KEY, LEASE, Lease, META, SCHEDULED_COMPACT, revision_key};
use kine_core::snapshot::{Format, Head};
use kine_core::types::KeyValue;
use kine_core::{Error, Result};
use kine_nats_embed::bolt::{Batch, Db};
use prost::Message;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The bbolt transaction size while writing.
const BATCH_BYTES: usize = 8 << 20;
/// The schema version written: etcd 3.6 and 3.7 both start on it (3.7 migrates it on start;
/// 3.6 refuses a backend that says 3.7.0).
const STORAGE_VERSION: &[u8] = b"3.6.0";

/// etcd's snapshot format.
#[derive(Debug, Default)]
pub struct Etcd;

/// The writer's working files next to the output; removed when done, whatever happened.
struct Work {
    bolt: PathBuf,
    spill: PathBuf,
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.bolt);
        let _ = std::fs::remove_file(&self.spill);
    }
}

fn fail(what: &'static str) -> impl Fn(String) -> Error {
    move |e| Error::Backend(anyhow::anyhow!("etcd-format snapshot: {what}: {e}"))
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Backend(anyhow::anyhow!("etcd-format snapshot: {what}: {e}"))
}

impl Format for Etcd {
    fn write(
        &self,
        head: &Head,
        next_page: &mut dyn FnMut() -> Result<Option<Vec<KeyValue>>>,
        out: &Path,
    ) -> Result<()> {
        let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let work =
            Work { bolt: out.with_file_name(format!("{name}.bolt")), spill: out.with_file_name(format!("{name}.kvs")) };
        let spill = File::create_new(&work.spill).map_err(io("create the spill file"))?;
        let mut index = spill_keys(&spill, next_page)?;
        // Stable: keys written by one Txn keep key order, which numbers their sub revisions.
        index.sort_by_key(|&(rev, _, _)| rev);

        let mut db = Db::create(&work.bolt).map_err(fail("create the bbolt file"))?;
        db.put(&header(head)).map_err(fail("write the buckets"))?;
        let mut batch = Batch::default();
        let (mut prev, mut sub) = (i64::MIN, 0i64);
        let mut record = Vec::new();
        for (rev, offset, len) in index {
            sub = if rev == prev { sub + 1 } else { 0 };
            prev = rev;
            record.resize(len as usize, 0);
            spill.read_exact_at(&mut record, offset).map_err(io("read the spill file"))?;
            batch.put(KEY, &revision_key(rev, sub), &record);
            if batch.len_bytes() >= BATCH_BYTES {
                db.put(&std::mem::take(&mut batch)).map_err(fail("write keys"))?;
            }
        }
        db.put(&batch).map_err(fail("write keys"))?;
        drop(spill);
        let _ = std::fs::remove_file(&work.spill); // no longer needed: at most two copies on disk
        db.write_to(out).map_err(fail("copy the bbolt file"))?;
        Ok(())
    }
}

/// Writes each key's mvccpb.KeyValue to `spill`; returns (mod revision, offset, length) of each.
fn spill_keys(
    spill: &File,
    next_page: &mut dyn FnMut() -> Result<Option<Vec<KeyValue>>>,
) -> Result<Vec<(i64, u64, u32)>> {
    let mut w = BufWriter::with_capacity(1 << 20, spill);
    let mut index = Vec::new();
    let mut offset = 0u64;
    let mut record = Vec::new();
    while let Some(page) = next_page()? {
        for kv in page {
            let (mod_revision, pb) = (kv.mod_revision, kine_server::kv_to_proto(kv));
            record.clear();
            pb.encode(&mut record).map_err(|e| Error::Backend(anyhow::anyhow!("encode a key: {e}")))?;
            w.write_all(&record).map_err(io("write the spill file"))?;
            index.push((mod_revision, offset, record.len() as u32));
            offset += record.len() as u64;
        }
    }
    w.flush().map_err(io("write the spill file"))?;
    Ok(index)
}

/// Every bucket, the `meta` records and the leases.
fn header(head: &Head) -> Batch {
    let mut batch = Batch::default();
    BUCKETS.iter().for_each(|b| batch.bucket(b));
    let revision = head.revision.max(1);
    batch.put(META, b"consistent_index", &(revision as u64).to_be_bytes());
    batch.put(META, b"term", &1u64.to_be_bytes());
    batch.put(META, b"storageVersion", STORAGE_VERSION);
    if revision > 1 {
        batch.put(META, FINISHED_COMPACT, &revision_key(revision, 0));
        batch.put(META, SCHEDULED_COMPACT, &revision_key(revision, 0));
    }
    for &(id, ttl) in &head.leases {
        let lease = Lease { id, ttl, remaining_ttl: 0 };
        batch.put(LEASE, &(id as u64).to_be_bytes(), &lease.encode_to_vec());
    }
    if let Some(auth) = &head.auth {
        super::auth::write(&mut batch, auth);
    }
    batch
}
