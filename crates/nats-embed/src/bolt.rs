//! bbolt files (go.etcd.io/bbolt, etcd's storage engine, in the Go shim `go/bolt.go`): written
//! in batches and read bucket by bucket, for snapshots in etcd's own format. The first call
//! loads the shim (and starts the Go runtime) if the embedded server has not already.
//!
//! Every call blocks; call it from a blocking context.
#![allow(unsafe_code)]

use crate::ffi::{self, shim, take};
use std::ffi::{CString, c_char, c_int};
use std::path::Path;

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// An open bbolt file; closed on drop.
pub struct Db {
    shim: &'static ffi::Shim,
    handle: usize,
}

/// Records for [`Db::put`]: `bucket, key, value`, each a little-endian u32 length and bytes.
#[derive(Default)]
pub struct Batch {
    buf: Vec<u8>,
}

impl Batch {
    pub fn put(&mut self, bucket: &[u8], key: &[u8], value: &[u8]) {
        for field in [bucket, key, value] {
            self.buf.extend_from_slice(&(field.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(field);
        }
    }

    /// Creates the bucket if it does not exist.
    pub fn bucket(&mut self, bucket: &[u8]) {
        self.put(bucket, b"", b"");
    }

    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| format!("{} has a NUL byte", path.display()))
}

impl Db {
    /// A new bbolt file at `path` (which must not exist), with etcd's settings (no freelist
    /// page, no fsync per commit).
    pub fn create(path: &Path) -> Result<Db, String> {
        Self::open(path, true)
    }

    /// An existing bbolt file, read-only.
    pub fn open_read_only(path: &Path) -> Result<Db, String> {
        Self::open(path, false)
    }

    fn open(path: &Path, create: bool) -> Result<Db, String> {
        let shim = shim()?;
        let cpath = c_path(path)?;
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `cpath` outlives the call (Go copies it); `err` is written at most once with a
        // C string that `take` frees.
        let handle = unsafe { (shim.bolt.open)(cpath.as_ptr(), c_int::from(create), &mut err) };
        if let Some(e) = take(shim, err) {
            return Err(e);
        }
        Ok(Db { shim, handle })
    }

    /// Writes the batch in one transaction.
    pub fn put(&mut self, batch: &Batch) -> Result<(), String> {
        // SAFETY: the buffer outlives the call; Go reads it only during the call.
        let err = unsafe { (self.shim.bolt.put)(self.handle, batch.buf.as_ptr().cast(), batch.buf.len()) };
        take(self.shim, err).map_or(Ok(()), Err)
    }

    /// A consistent copy of the file, exactly the pages in use, in the new file `path`.
    pub fn write_to(&self, path: &Path) -> Result<(), String> {
        let cpath = c_path(path)?;
        // SAFETY: `cpath` outlives the call; Go copies it.
        take(self.shim, unsafe { (self.shim.bolt.write_to)(self.handle, cpath.as_ptr()) }).map_or(Ok(()), Err)
    }

    /// The entries of `bucket` after the key `after` (from the first when empty), about
    /// `max_bytes` of them; empty at the end. An empty bucket name lists the top-level
    /// buckets (value empty, or `!` for an entry that is not a bucket).
    pub fn scan(&self, bucket: &[u8], after: &[u8], max_bytes: usize) -> Result<Vec<Entry>, String> {
        let mut out: *mut c_char = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: both slices outlive the call (Go copies them); `out`/`len` are written once,
        // `out` with a malloc'd buffer of `len` bytes that is freed below.
        let err = unsafe {
            (self.shim.bolt.scan)(
                self.handle,
                bucket.as_ptr().cast(),
                bucket.len(),
                after.as_ptr().cast(),
                after.len(),
                max_bytes,
                &mut out,
                &mut len,
            )
        };
        if let Some(e) = take(self.shim, err) {
            return Err(e);
        }
        if out.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: `out` points to `len` bytes that Go allocated; copied before it is freed.
        let data = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), len) }.to_vec();
        self.shim.free(out);
        let mut entries = Vec::new();
        let mut rest = data.as_slice();
        while !rest.is_empty() {
            let (k, r) = field(rest)?;
            let (v, r) = field(r)?;
            entries.push((k.to_vec(), v.to_vec()));
            rest = r;
        }
        Ok(entries)
    }
}

fn field(data: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let bad = || "the bbolt shim returned a malformed record".to_string();
    let len = u32::from_le_bytes(data.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
    let rest = &data[4..];
    if rest.len() < len {
        return Err(bad());
    }
    Ok(rest.split_at(len))
}

impl Drop for Db {
    fn drop(&mut self) {
        // SAFETY: the handle is live and closed exactly once, here.
        if let Some(e) = take(self.shim, unsafe { (self.shim.bolt.close)(self.handle) }) {
            tracing::warn!(error = %e, "closing a bbolt file");
        }
    }
}
