//! The file a table's values are appended to (see `values.rs`): created and at once unlinked,
//! and written through a tail kept in memory, so that a bulk load (a NATS replica reading its
//! whole bucket at start-up) makes one write per [`TAIL_BYTES`] rather than one per value.
//!
//! **Invariant:** every byte appended is readable at its offset, from the disk below `written`
//! and from the tail above it. A tail that cannot be written out (a full disk) stays in memory:
//! nothing appended is ever lost, and the file is marked failed so that later values stay in
//! memory instead (`Values::store`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The tail is written out once it holds this much (less in tests, to cross the boundaries).
#[cfg(not(test))]
const TAIL_BYTES: usize = 1 << 20;
#[cfg(test)]
const TAIL_BYTES: usize = 200;

/// Names the files of one process apart.
static FILES: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub(super) struct ValueFile {
    file: File,
    pub(super) dir: PathBuf,
    /// Bytes appended so far: the next value's offset.
    pub(super) end: u64,
    /// Bytes on disk: the tail holds `written..end`.
    written: u64,
    tail: Vec<u8>,
    /// Bytes of values no version refers to any more.
    pub(super) dead: u64,
    /// A write failed; later values stay in memory until the file is rewritten.
    pub(super) failed: bool,
}

impl ValueFile {
    pub(super) fn create(dir: &Path) -> io::Result<ValueFile> {
        std::fs::create_dir_all(dir)?;
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".kine-rs-values-{}-{n}", std::process::id()));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        std::fs::remove_file(&path)?;
        Ok(ValueFile::over(file, dir))
    }

    fn over(file: File, dir: &Path) -> ValueFile {
        ValueFile { file, dir: dir.to_path_buf(), end: 0, written: 0, tail: Vec::new(), dead: 0, failed: false }
    }

    /// Appends `bytes` and returns their offset. They are in the file for every later read, even
    /// if writing the tail out fails: that error is returned, and the tail stays in memory.
    pub(super) fn append(&mut self, bytes: &[u8]) -> (u64, io::Result<()>) {
        let offset = self.end;
        self.tail.extend_from_slice(bytes);
        self.end += bytes.len() as u64;
        let flushed = if self.tail.len() >= TAIL_BYTES && !self.failed { self.write_tail() } else { Ok(()) };
        (offset, flushed)
    }

    fn write_tail(&mut self) -> io::Result<()> {
        self.file.write_all_at(&self.tail, self.written)?;
        self.written += self.tail.len() as u64;
        self.tail.clear();
        Ok(())
    }

    /// Fills `buf` with the bytes at `offset`.
    pub(super) fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        if end > self.end {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{end} is beyond the file's {}", self.end),
            ));
        }
        let on_disk = (self.written.saturating_sub(offset) as usize).min(buf.len());
        let (disk, tail) = buf.split_at_mut(on_disk);
        if !disk.is_empty() {
            self.file.read_exact_at(disk, offset)?;
        }
        if !tail.is_empty() {
            let from = (offset + on_disk as u64 - self.written) as usize;
            tail.copy_from_slice(&self.tail[from..from + tail.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn every_value_reads_back_from_the_disk_the_tail_or_both() {
        let dir = std::env::temp_dir().join(format!("kine-value-file-test-{}", std::process::id()));
        let mut f = ValueFile::create(&dir).unwrap();
        let mut appended = Vec::new();
        for i in 0..60 {
            let v = bytes(7 + i * 5, i as u8);
            let (offset, written) = f.append(&v);
            written.unwrap();
            appended.push((offset, v));
        }
        // The last append may have emptied the tail: one more, shorter than a tail.
        let v = bytes(10, 99);
        appended.push((f.append(&v).0, v));
        assert!(f.written > 0 && f.written < f.end, "some on disk, some in the tail: {} of {}", f.written, f.end);
        for (offset, v) in &appended {
            let mut buf = vec![0; v.len()];
            f.read_at(&mut buf, *offset).unwrap();
            assert_eq!(&buf, v, "at {offset}");
        }
        // A read across the boundary between disk and tail.
        let mut across = vec![0; (f.end - f.written) as usize + 20];
        f.read_at(&mut across, f.written - 20).unwrap();
        let mut whole = vec![0; f.end as usize];
        f.read_at(&mut whole, 0).unwrap();
        let at = (f.written - 20) as usize;
        assert_eq!(across, whole[at..]);
        assert!(f.read_at(&mut [0; 2], f.end - 1).is_err(), "a read beyond the end fails");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tail_that_cannot_be_written_stays_readable() {
        // Writes to a file opened read-only fail (EBADF), as they would on a full disk.
        let mut f = ValueFile::over(File::open("/dev/null").unwrap(), Path::new("/dev"));
        let mut appended = Vec::new();
        let mut failures = 0;
        for i in 0..20 {
            let v = bytes(50, i);
            let (offset, written) = f.append(&v);
            if written.is_err() {
                failures += 1;
                f.failed = true;
            }
            appended.push((offset, v));
        }
        assert_eq!(failures, 1, "one failed write; the file is then marked failed");
        for (offset, v) in &appended {
            let mut buf = vec![0; v.len()];
            f.read_at(&mut buf, *offset).unwrap();
            assert_eq!(&buf, v);
        }
    }
}
