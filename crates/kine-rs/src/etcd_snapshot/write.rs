//! Writing a snapshot as etcd's bbolt file, with the history etcd would hold: the key space at
//! the compact revision, then every revision since (puts, and deletes as etcd's tombstones).
//! The keys arrive in key order but etcd's `key` bucket is ordered by revision: each key's
//! record goes to a spill file first, a small index (revision, offset, length) is sorted, and
//! the records are put in revision order, which fills bbolt's pages completely; the events
//! follow, already in revision order. Memory stays at about 24 bytes per key.

use super::{BUCKETS, FINISHED_COMPACT, KEY, LEASE, Lease, META, SCHEDULED_COMPACT, revision_key};
use kine_core::snapshot::{Format, Head, Part};
use kine_core::types::{EventKind, KeyValue};
use kine_core::{Error, Result};
use kine_nats_embed::bolt::{Batch, Db};
use kine_proto::mvccpb;
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
    fn write(&self, head: &Head, next: &mut dyn FnMut() -> Result<Option<Part>>, out: &Path) -> Result<()> {
        let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let work =
            Work { bolt: out.with_file_name(format!("{name}.bolt")), spill: out.with_file_name(format!("{name}.kvs")) };
        let mut db = Db::create(&work.bolt).map_err(fail("create the bbolt file"))?;
        db.put(&header(head)).map_err(fail("write the buckets"))?;
        let mut keys = Some(Spill::new(File::create_new(&work.spill).map_err(io("create the spill file"))?));
        let mut batch = Batch::default();
        let mut record = Vec::new();
        while let Some(part) = next()? {
            match part {
                Part::Keys(kvs) => match &mut keys {
                    Some(spill) => spill.add(kvs)?,
                    None => return Err(Error::Backend(anyhow::anyhow!("etcd-format snapshot: keys after events"))),
                },
                Part::Events(revisions) => {
                    if let Some(spill) = keys.take() {
                        spill.put(&mut db, &mut batch)?;
                        let _ = std::fs::remove_file(&work.spill);
                    }
                    for rev in revisions {
                        for (sub, event) in rev.events.into_iter().enumerate() {
                            let key = revision_key(rev.revision, sub as i64);
                            record.clear();
                            if event.kind == EventKind::Delete {
                                // etcd's tombstone: the revision marked `t`, the key alone.
                                let mut tombstone = key.to_vec();
                                tombstone.push(b't');
                                let kv = mvccpb::KeyValue { key: event.kv.key, ..Default::default() };
                                kv.encode(&mut record).map_err(encode)?;
                                batch.put(KEY, &tombstone, &record);
                            } else {
                                kine_server::kv_to_proto(event.kv).encode(&mut record).map_err(encode)?;
                                batch.put(KEY, &key, &record);
                            }
                        }
                        if batch.len_bytes() >= BATCH_BYTES {
                            db.put(&std::mem::take(&mut batch)).map_err(fail("write events"))?;
                        }
                    }
                }
            }
        }
        if let Some(spill) = keys.take() {
            spill.put(&mut db, &mut batch)?;
        }
        db.put(&batch).map_err(fail("write events"))?;
        let _ = std::fs::remove_file(&work.spill); // no longer needed: at most two copies on disk
        db.write_to(out).map_err(fail("copy the bbolt file"))?;
        Ok(())
    }
}

fn encode(e: prost::EncodeError) -> Error {
    Error::Backend(anyhow::anyhow!("etcd-format snapshot: encode a key: {e}"))
}

/// The key space at the base revision: each key's mvccpb.KeyValue in the spill file, and its
/// (mod revision, offset, length) in the index.
struct Spill {
    file: BufWriter<File>,
    index: Vec<(i64, u64, u32)>,
    offset: u64,
    record: Vec<u8>,
}

impl Spill {
    fn new(file: File) -> Spill {
        Spill { file: BufWriter::with_capacity(1 << 20, file), index: Vec::new(), offset: 0, record: Vec::new() }
    }

    fn add(&mut self, kvs: Vec<KeyValue>) -> Result<()> {
        for kv in kvs {
            let mod_revision = kv.mod_revision;
            self.record.clear();
            kine_server::kv_to_proto(kv).encode(&mut self.record).map_err(encode)?;
            self.file.write_all(&self.record).map_err(io("write the spill file"))?;
            self.index.push((mod_revision, self.offset, self.record.len() as u32));
            self.offset += self.record.len() as u64;
        }
        Ok(())
    }

    /// Puts the keys into `db` in revision order (keys written by one Txn share a revision and
    /// keep key order, which numbers their sub revisions: the sort is stable).
    fn put(self, db: &mut Db, batch: &mut Batch) -> Result<()> {
        let file = self.file.into_inner().map_err(|e| io("write the spill file")(e.into_error()))?;
        let mut index = self.index;
        index.sort_by_key(|&(rev, _, _)| rev);
        let (mut prev, mut sub) = (i64::MIN, 0i64);
        let mut record = Vec::new();
        for (rev, offset, len) in index {
            sub = if rev == prev { sub + 1 } else { 0 };
            prev = rev;
            record.resize(len as usize, 0);
            file.read_exact_at(&mut record, offset).map_err(io("read the spill file"))?;
            batch.put(KEY, &revision_key(rev, sub), &record);
            if batch.len_bytes() >= BATCH_BYTES {
                db.put(&std::mem::take(batch)).map_err(fail("write keys"))?;
            }
        }
        Ok(())
    }
}

/// Every bucket, the `meta` records and the leases.
fn header(head: &Head) -> Batch {
    let mut batch = Batch::default();
    BUCKETS.iter().for_each(|b| batch.bucket(b));
    batch.put(META, b"consistent_index", &(head.revision.max(1) as u64).to_be_bytes());
    batch.put(META, b"term", &1u64.to_be_bytes());
    batch.put(META, b"storageVersion", STORAGE_VERSION);
    if head.base_revision > 1 {
        // Compacted there, as the store was: older revisions are gone, as in etcd.
        batch.put(META, FINISHED_COMPACT, &revision_key(head.base_revision, 0));
        batch.put(META, SCHEDULED_COMPACT, &revision_key(head.base_revision, 0));
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
