//! Where a [`MemTable`](super::MemTable) keeps its values: in memory (`memory://`), or in a
//! local file (a NATS replica, which holds a whole bucket: etcd keeps its values in a file too,
//! whose pages the kernel can drop, rather than in the process's own memory).
//!
//! The file is a cache of what the table holds, never the only copy of anything durable: it is
//! unlinked as soon as it is created (nothing is left behind by a crash) and rebuilt with the
//! table. Values are appended; the space of versions compaction removed is reclaimed by
//! rewriting the file once most of it is dead. A value that cannot be written (a full disk) is
//! kept in memory instead, so a write never fails because of the file.

use super::value_file::ValueFile;
use crate::error::{Error, Result};
use std::path::Path;

/// Values this long or shorter stay in memory: a file offset would save nothing.
const INLINE_MAX: usize = 24;
/// The file is rewritten when at least this much of it is dead, and more than is live.
#[cfg(not(test))]
const REWRITE_MIN_DEAD: u64 = 64 << 20;
#[cfg(test)]
const REWRITE_MIN_DEAD: u64 = 4 << 10;
/// A rewrite reads and writes this much at a time (less in tests, to cross the boundaries).
#[cfg(not(test))]
const COPY_BYTES: usize = 4 << 20;
#[cfg(test)]
const COPY_BYTES: usize = 300;

/// One value: its bytes, or where they are in the file.
#[derive(Debug)]
pub(super) enum Value {
    Inline(Box<[u8]>),
    File { offset: u64, len: u32 },
}

impl Value {
    pub(super) fn len(&self) -> usize {
        match self {
            Value::Inline(v) => v.len(),
            Value::File { len, .. } => *len as usize,
        }
    }
}

/// The values of one table.
#[derive(Debug, Default)]
pub(super) struct Values {
    file: Option<ValueFile>,
    /// Set while a write is evaluated and then undone: its values stay in memory.
    pub(super) inline_only: bool,
}

impl Values {
    /// Values kept in a file created (and at once unlinked) in `dir`. If the file cannot be
    /// created, they are kept in memory, and the reason is logged.
    pub(super) fn in_file(dir: &Path) -> Values {
        match ValueFile::create(dir) {
            Ok(file) => Values { file: Some(file), inline_only: false },
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot create a file for the replica's values; keeping them in memory");
                Values::default()
            }
        }
    }

    pub(super) fn store(&mut self, bytes: &[u8]) -> Value {
        let fits = bytes.len() > INLINE_MAX && bytes.len() <= u32::MAX as usize && !self.inline_only;
        if fits && let Some(f) = self.file.as_mut().filter(|f| !f.failed) {
            let (offset, written) = f.append(bytes);
            if let Err(e) = written {
                tracing::warn!(error = %e, "cannot write to the replica's value file; keeping new values in memory");
                f.failed = true;
            }
            return Value::File { offset, len: bytes.len() as u32 };
        }
        Value::Inline(bytes.into())
    }

    pub(super) fn load(&self, value: &Value) -> Result<Vec<u8>> {
        match value {
            Value::Inline(v) => Ok(v.to_vec()),
            Value::File { offset, len } => {
                let f = self.file.as_ref().ok_or_else(|| Error::Backend(anyhow::anyhow!("value file missing")))?;
                let mut buf = vec![0; *len as usize];
                f.read_at(&mut buf, *offset)
                    .map_err(|e| Error::Backend(anyhow::anyhow!("read the replica's value file: {e}")))?;
                Ok(buf)
            }
        }
    }

    /// A value no version refers to any more.
    pub(super) fn release(&mut self, value: &Value) {
        if let (Value::File { len, .. }, Some(f)) = (value, self.file.as_mut()) {
            f.dead += u64::from(*len);
        }
    }

    /// Whether most of the file is dead space worth reclaiming.
    pub(super) fn wants_rewrite(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.dead >= REWRITE_MIN_DEAD && f.dead * 2 > f.end)
    }

    /// Reclaims the dead space: copies `live` (every value of the table kept in the file) to a
    /// new file in the order of their offsets, reading the old file in large sequential pieces,
    /// then points them there and serves from the new file. If that fails, nothing changed.
    pub(super) fn rewrite(&mut self, live: &mut [&mut Value]) -> Result<()> {
        let Some(old) = self.file.as_ref() else { return Ok(()) };
        let mut new = ValueFile::create(&old.dir).map_err(rewrite_error)?;
        live.sort_unstable_by_key(|v| extent(v).0);
        let mut moved_to = Vec::with_capacity(live.len());
        let (mut window, mut out) = (Vec::new(), Vec::with_capacity(COPY_BYTES));
        let mut i = 0;
        while i < live.len() {
            // One read: the values from the ith on that lie within COPY_BYTES of it (at least one).
            let start = extent(live[i]).0;
            let mut end = start;
            let mut j = i;
            while j < live.len() {
                let (offset, len) = extent(live[j]);
                let value_end = offset + u64::from(len);
                if j > i && value_end - start > COPY_BYTES as u64 {
                    break;
                }
                end = end.max(value_end);
                j += 1;
            }
            window.resize((end - start) as usize, 0);
            old.read_at(&mut window, start).map_err(rewrite_error)?;
            for v in &live[i..j] {
                let (offset, len) = extent(v);
                let at = (offset - start) as usize;
                moved_to.push(new.end + out.len() as u64);
                out.extend_from_slice(&window[at..at + len as usize]);
                if out.len() >= COPY_BYTES {
                    new.append(&out).1.map_err(rewrite_error)?;
                    out.clear();
                }
            }
            i = j;
        }
        new.append(&out).1.map_err(rewrite_error)?;
        for (v, to) in live.iter_mut().zip(moved_to) {
            if let Value::File { offset, .. } = v {
                *offset = to;
            }
        }
        // Closing the old file frees its pages (a tenth of a second per 768 MB here): on a
        // thread of its own, not under the table's lock. If none can be started, here.
        let old = self.file.replace(new);
        let _ = std::thread::Builder::new().name("value-file-close".into()).spawn(move || drop(old));
        Ok(())
    }

    /// Bytes in the file: (all, dead).
    #[cfg(test)]
    pub(super) fn file_bytes(&self) -> (u64, u64) {
        self.file.as_ref().map_or((0, 0), |f| (f.end, f.dead))
    }
}

/// Where a value is in the file: (offset, length); (0, 0) for one in memory.
fn extent(value: &Value) -> (u64, u32) {
    match value {
        Value::File { offset, len } => (*offset, *len),
        Value::Inline(_) => (0, 0),
    }
}

fn rewrite_error(e: std::io::Error) -> Error {
    Error::Backend(anyhow::anyhow!("rewrite the replica's value file: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::MemTable;
    use crate::request::{DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};
    use crate::txn::WriteOp;
    use crate::types::{KeyRange, KeyValue};
    use crate::view::ReadView;

    fn txn(op: RequestOp) -> WriteOp {
        WriteOp::Txn(TxnRequest { compare: vec![], success: vec![op], failure: vec![] })
    }

    fn put(key: &str, value: Vec<u8>) -> WriteOp {
        txn(RequestOp::Put(PutRequest { key: key.into(), value, prev_kv: true, ..Default::default() }))
    }

    fn delete(key: &str) -> WriteOp {
        txn(RequestOp::DeleteRange(DeleteRangeRequest { range: KeyRange::single(key), prev_kv: true }))
    }

    fn all(t: &mut MemTable, rev: i64) -> Vec<KeyValue> {
        t.scan(&KeyRange::all(), rev, 0, false).unwrap()
    }

    fn value(i: usize, round: usize) -> Vec<u8> {
        format!("{i:04}-{round:02}-").repeat(8 + i % 5).into_bytes()
    }

    #[test]
    fn a_table_with_its_values_in_a_file_reads_like_one_in_memory_through_rewrites() {
        let dir = std::env::temp_dir().join(format!("kine-values-test-{}", std::process::id()));
        let mut file = MemTable::at_with_values_in(1, &dir);
        let mut memory = MemTable::at(1);
        // Created and unlinked at once: nothing is left in the directory.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let mut rewrites = 0;
        for round in 0..12 {
            for i in 0..40 {
                // Short values stay in memory, the others go to the file; one is longer than
                // what a rewrite copies at a time.
                let v = match i {
                    _ if i % 7 == 0 => b"short".to_vec(),
                    3 => value(i, round).repeat(10),
                    _ => value(i, round),
                };
                for t in [&mut file, &mut memory] {
                    t.apply(&put(&format!("k{i}"), v.clone())).unwrap();
                }
            }
            for t in [&mut file, &mut memory] {
                t.apply(&delete(&format!("k{round}"))).unwrap();
            }
            // A write evaluated and undone writes nothing to the file.
            let before = file.values.file_bytes();
            file.evaluate(&put("k1", value(1, 99))).unwrap();
            assert_eq!(file.values.file_bytes(), before);
            let current = file.revisions().current;
            assert_eq!(all(&mut file, current), all(&mut memory, current));
            let events = |t: &MemTable| t.events(&KeyRange::all(), current - 40, current).unwrap();
            assert_eq!(events(&file), events(&memory));
            let (end, dead) = file.values.file_bytes();
            for t in [&mut file, &mut memory] {
                t.compact(current - 20).unwrap();
            }
            if file.values.file_bytes().0 < end {
                rewrites += 1;
                // Only live values were copied.
                assert_eq!(file.values.file_bytes().1, 0, "dead bytes after a rewrite (before: {end}, {dead} dead)");
            }
            for rev in [current - 20, current - 5, current] {
                assert_eq!(all(&mut file, rev), all(&mut memory, rev), "at {rev}");
            }
        }
        assert!(rewrites >= 3, "the file was rewritten {rewrites} times");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn values_stay_in_memory_when_no_file_can_be_made() {
        let mut t = MemTable::at_with_values_in(1, std::path::Path::new("/proc/no/such/dir"));
        t.apply(&put("a", value(3, 1))).unwrap();
        assert_eq!(all(&mut t, 2)[0].value, value(3, 1));
        assert_eq!(t.values.file_bytes(), (0, 0));
    }
}
