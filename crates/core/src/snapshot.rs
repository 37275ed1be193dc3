//! The key space at one revision, read page by page: the body of a snapshot
//! (Maintenance.Snapshot, restored with `kine-rs snapshot restore`) and the input of the
//! key-space hash (Maintenance.Hash/HashKV).
//!
//! Snapshot format (version 1), all integers big-endian:
//!
//! ```text
//! "KINE-RS-SNAPSHOT" u32 format=1
//! i64 revision  i64 compact_revision  u64 cluster_id
//! u32 lease_count  { i64 id  i64 ttl_seconds }*
//! { u8 1  u32 key_len key  u32 value_len value  i64 create  i64 mod  i64 version  i64 lease }*
//! u8 0  u64 key_count
//! zero bytes up to a multiple of 512 (etcdctl checks that the size is one, as a bbolt file's is)
//! sha256 of everything above (32 bytes; sent by the server as etcd does, last)
//! ```
//!
//! A snapshot holds each live key's current version, not the history before `revision`: a
//! restored store starts compacted at `revision`.

use crate::auth::state::AuthState;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::request::RangeRequest;
use crate::types::{KeyRange, KeyValue, LeaseId, Revision, RevisionEvents};
use sha2::{Digest, Sha256};

pub const MAGIC: &[u8; 16] = b"KINE-RS-SNAPSHOT";
pub const FORMAT: u32 = 1;
const PAGE: i64 = 5000;

/// A decoded snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: Revision,
    pub compact_revision: Revision,
    pub cluster_id: u64,
    pub leases: Vec<(LeaseId, i64)>,
    pub kvs: Vec<KeyValue>,
}

/// What a snapshot holds besides its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub revision: Revision,
    pub compact_revision: Revision,
    /// The revision of the key space the history starts from: the compact revision, or 1
    /// (the empty store) when the store was never compacted.
    pub base_revision: Revision,
    pub cluster_id: u64,
    pub member_id: u64,
    /// Sorted by id.
    pub leases: Vec<(LeaseId, i64)>,
    /// The auth record, if the store has one.
    pub auth: Option<AuthState>,
}

/// A part of a snapshot with history, in order: the live keys at the base revision page by
/// page in key order, then every revision's events after it in revision order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Keys(Vec<KeyValue>),
    Events(Vec<RevisionEvents>),
}

/// A snapshot file format other than kine-rs's own (etcd's bbolt file, written by the binary
/// that links a bbolt implementation).
pub trait Format: Send + Sync + std::fmt::Debug {
    /// Writes a snapshot into the new file `out`: `head`, then the parts `next` returns until
    /// `None`. Blocking; the file is read back at once and deleted (it is not synced).
    fn write(&self, head: &Head, next: &mut dyn FnMut() -> Result<Option<Part>>, out: &std::path::Path) -> Result<()>;
}

/// Revisions of events read at once.
const EVENT_WINDOW: i64 = 1000;

/// The parts of a snapshot with history (see [`Part`]).
pub struct History<'a> {
    backend: &'a dyn Backend,
    keys: Pages<'a>,
    keys_done: bool,
    after: Revision,
    until: Revision,
}

impl<'a> History<'a> {
    pub fn new(backend: &'a dyn Backend, head: &Head) -> History<'a> {
        History {
            backend,
            keys: Pages::new(backend, head.base_revision),
            keys_done: false,
            after: head.base_revision,
            until: head.revision,
        }
    }

    /// The next part; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<Part>> {
        if !self.keys_done {
            match self.keys.next().await? {
                Some(kvs) => return Ok(Some(Part::Keys(kvs))),
                None => self.keys_done = true,
            }
        }
        while self.after < self.until {
            let to = (self.after + EVENT_WINDOW).min(self.until);
            let events = self.backend.events(&KeyRange::all(), self.after, to).await?;
            self.after = to;
            if !events.is_empty() {
                return Ok(Some(Part::Events(events)));
            }
        }
        Ok(None)
    }
}

/// The live keys at one revision (> 0), page by page in key order.
pub struct Pages<'a> {
    backend: &'a dyn Backend,
    revision: Revision,
    next: Option<Vec<u8>>,
}

impl<'a> Pages<'a> {
    /// No page at all for a revision below 1 (etcd hashes nothing for a negative revision).
    pub fn new(backend: &'a dyn Backend, revision: Revision) -> Pages<'a> {
        Pages { backend, revision, next: (revision > 0).then(|| vec![0]) }
    }

    /// The next page; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<Vec<KeyValue>>> {
        let Some(start) = self.next.take() else { return Ok(None) };
        let req = RangeRequest {
            revision: self.revision,
            limit: PAGE,
            ..RangeRequest::new(KeyRange::from_etcd(start, vec![0]))
        };
        // Each page has a request budget of its own: hashing or saving a large store takes as
        // long as its size needs (etcd bounds HashKV only by the client's deadline), while a
        // stalled datastore still fails the page within the request timeout.
        let page = crate::budget::request(self.backend.range(req)).await?.value;
        if let (true, Some(last)) = (page.more, page.kvs.last()) {
            let mut after = last.key.clone();
            after.push(0);
            self.next = Some(after);
        }
        Ok(Some(page.kvs))
    }
}

/// Appends one key's record.
pub fn encode_kv(out: &mut Vec<u8>, kv: &KeyValue) {
    out.push(1);
    out.extend_from_slice(&(kv.key.len() as u32).to_be_bytes());
    out.extend_from_slice(&kv.key);
    out.extend_from_slice(&(kv.value.len() as u32).to_be_bytes());
    out.extend_from_slice(&kv.value);
    for n in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// The snapshot's beginning, up to the first key.
pub fn encode_head(
    revision: Revision,
    compact_revision: Revision,
    cluster_id: u64,
    leases: &[(LeaseId, i64)],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + leases.len() * 16);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_be_bytes());
    out.extend_from_slice(&revision.to_be_bytes());
    out.extend_from_slice(&compact_revision.to_be_bytes());
    out.extend_from_slice(&cluster_id.to_be_bytes());
    out.extend_from_slice(&(leases.len() as u32).to_be_bytes());
    for (id, ttl) in leases {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
    }
    out
}

/// The snapshot's end after the last key, for a body of `written` bytes so far.
pub fn encode_tail(key_count: u64, written: u64) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&key_count.to_be_bytes());
    let len = written + out.len() as u64;
    out.resize(out.len() + ((512 - len % 512) % 512) as usize, 0);
    out
}

/// A hash of the live keys at `revision` (every field of every key), and optionally of the
/// leases: equal on every node of one datastore, different when any key differs.
pub async fn hash(backend: &dyn Backend, revision: Revision, leases: Option<&[(LeaseId, i64)]>) -> Result<u32> {
    let mut sha = Sha256::new();
    if let Some(leases) = leases {
        sha.update(encode_head(0, 0, 0, leases));
    }
    let mut pages = Pages::new(backend, revision);
    let mut buf = Vec::new();
    while let Some(kvs) = pages.next().await? {
        buf.clear();
        kvs.iter().for_each(|kv| encode_kv(&mut buf, kv));
        sha.update(&buf);
    }
    let digest = sha.finalize();
    Ok(u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]))
}

/// Decodes a snapshot file as `etcdctl snapshot save` writes it (body, then its sha256).
pub fn decode(file: &[u8]) -> std::result::Result<Snapshot, String> {
    if file.len() < MAGIC.len() || &file[..MAGIC.len()] != MAGIC {
        return Err("not a kine-rs snapshot".into());
    }
    if file.len() < MAGIC.len() + 32 {
        return Err("the snapshot is truncated".into());
    }
    let (body, sum) = file.split_at(file.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err("the snapshot's sha256 does not match its content: the file is damaged or truncated".into());
    }
    let mut r = Reader { buf: &body[MAGIC.len()..] };
    let format = r.u32()?;
    if format != FORMAT {
        return Err(format!("snapshot format {format} is not supported (this kine-rs reads format {FORMAT})"));
    }
    let revision = r.i64()?;
    let compact_revision = r.i64()?;
    let cluster_id = r.i64()? as u64;
    let mut leases = Vec::new();
    for _ in 0..r.u32()? {
        leases.push((r.i64()?, r.i64()?));
    }
    let mut kvs = Vec::new();
    loop {
        match r.u8()? {
            1 => {
                let key = r.bytes()?;
                let value = r.bytes()?;
                let (create_revision, mod_revision, version, lease) = (r.i64()?, r.i64()?, r.i64()?, r.i64()?);
                kvs.push(KeyValue { key, create_revision, mod_revision, version, value, lease });
            }
            0 => break,
            tag => return Err(format!("the snapshot has an unknown record tag {tag}")),
        }
    }
    let count = r.i64()? as u64;
    if count != kvs.len() as u64 || r.buf.len() >= 512 || r.buf.iter().any(|&b| b != 0) {
        return Err("the snapshot's key count does not match its content".into());
    }
    Ok(Snapshot { revision, compact_revision, cluster_id, leases, kvs })
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        if self.buf.len() < n {
            return Err("the snapshot ends in the middle of a record".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> std::result::Result<i64, String> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> std::result::Result<Vec<u8>, String> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

/// Checks a hash revision as etcd's HashKV does: 0 is the current revision, a negative one is
/// kept (and hashes no key).
pub fn check_revision(revision: Revision, current: Revision, compacted: Revision) -> Result<Revision> {
    if revision > current {
        return Err(Error::FutureRevision);
    }
    if revision > 0 && revision < compacted {
        return Err(Error::Compacted { compact_revision: compacted });
    }
    Ok(if revision == 0 { current } else { revision })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: i64) -> KeyValue {
        KeyValue { key: key.into(), create_revision: 2, mod_revision: rev, version: 3, value: vec![7; 3], lease: 0 }
    }

    fn file(kvs: &[KeyValue]) -> Vec<u8> {
        let mut body = encode_head(9, 4, 42, &[(5, 60)]);
        kvs.iter().for_each(|k| encode_kv(&mut body, k));
        body.extend(encode_tail(kvs.len() as u64, body.len() as u64));
        assert_eq!(body.len() % 512, 0);
        let sum = Sha256::digest(&body);
        body.extend_from_slice(&sum);
        body
    }

    #[test]
    fn round_trip_and_damage_detection() {
        let kvs = vec![kv("a", 3), kv("b", 9)];
        let f = file(&kvs);
        let s = decode(&f).unwrap();
        assert_eq!(
            (s.revision, s.compact_revision, s.cluster_id, s.leases.clone(), s.kvs),
            (9, 4, 42, vec![(5, 60)], kvs)
        );
        let mut damaged = f.clone();
        damaged[30] ^= 1;
        assert!(decode(&damaged).unwrap_err().contains("sha256"));
        assert!(decode(&f[..f.len() - 1]).is_err());
        assert!(decode(b"\x00\x00\x00\x00bbolt").unwrap_err().contains("not a kine-rs snapshot"));
    }

    #[test]
    fn revisions_are_checked_as_etcd_does() {
        assert_eq!(check_revision(0, 10, -1).unwrap(), 10);
        assert_eq!(check_revision(-1, 10, -1).unwrap(), -1);
        assert_eq!(check_revision(4, 10, 4).unwrap(), 4);
        assert!(matches!(check_revision(11, 10, 4), Err(Error::FutureRevision)));
        assert!(matches!(check_revision(3, 10, 4), Err(Error::Compacted { compact_revision: 4 })));
    }
}
