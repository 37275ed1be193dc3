//! A WAL segment: what one writer committed over a span of revisions, as the object
//! `wal/<term:10>/<number:20>` (its header names the first revision).
//!
//! Layout: the header (`KRSEG1` and two zero bytes, the term, the first revision; big-endian),
//! then frames — a payload's length (u32), its CRC-32C (u32), the payload (a record: a tag byte
//! and its fields, big-endian; byte strings length-prefixed) — then the trailer: `KRSEGEND`, the
//! number of records (u32) and the CRC-32C of everything before it (u32). A segment is written
//! whole, so a missing trailer (a truncation, even at a frame boundary), a checksum that does
//! not match, or a frame that does not parse is damage: decoding fails and names the byte
//! offset.

use thiserror::Error;

pub const MAGIC: &[u8; 8] = b"KRSEG1\0\0";
pub const END: &[u8; 8] = b"KRSEGEND";
const HEADER: usize = 8 + 8 + 8;
const TRAILER: usize = 8 + 4 + 4;
/// A frame larger than this is damage (a value is at most a few MiB).
const MAX_FRAME: u32 = 64 << 20;

/// One change a segment carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A version of a key (or its deletion) at a revision and sub revision.
    Version {
        revision: i64,
        sub: u32,
        deleted: bool,
        key: Vec<u8>,
        create_revision: i64,
        version: i64,
        lease: i64,
        value: Vec<u8>,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    /// The store was compacted at this revision.
    Compact {
        revision: i64,
    },
    /// The auth record (users, roles, the switch) as it is from here on.
    Auth {
        data: Vec<u8>,
    },
    /// Everything before this marker is committed, and the store's revision is this.
    Committed {
        revision: i64,
    },
    /// Every lease is dropped; the grants after it are all the leases there are (the first
    /// segment of a writer's term, which does not know what the last term shipped).
    LeasesReset,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub term: u64,
    pub first_revision: i64,
    pub records: Vec<Record>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a kine-rs WAL segment (no KRSEG1 header)")]
    NotASegment,
    #[error("the segment ends inside a frame at byte {0}: truncated")]
    Truncated(usize),
    #[error("the frame at byte {0} fails its CRC-32C: damaged")]
    Checksum(usize),
    #[error("the segment's trailer says {said} records, it holds {held}: damaged")]
    Count { said: u32, held: usize },
    #[error("the frame at byte {offset} is not a valid record: {what}")]
    Malformed { offset: usize, what: &'static str },
}

fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

fn payload(record: &Record) -> Vec<u8> {
    let mut p = Vec::new();
    match record {
        Record::Version { revision, sub, deleted, key, create_revision, version, lease, value } => {
            p.push(1);
            p.extend_from_slice(&revision.to_be_bytes());
            p.extend_from_slice(&sub.to_be_bytes());
            p.push(u8::from(*deleted));
            for n in [create_revision, version, lease] {
                p.extend_from_slice(&n.to_be_bytes());
            }
            put_bytes(&mut p, key);
            put_bytes(&mut p, value);
        }
        Record::LeaseGrant { id, ttl } => {
            p.push(2);
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(&ttl.to_be_bytes());
        }
        Record::LeaseRevoke { id } => {
            p.push(3);
            p.extend_from_slice(&id.to_be_bytes());
        }
        Record::Compact { revision } => {
            p.push(4);
            p.extend_from_slice(&revision.to_be_bytes());
        }
        Record::Auth { data } => {
            p.push(5);
            put_bytes(&mut p, data);
        }
        Record::Committed { revision } => {
            p.push(6);
            p.extend_from_slice(&revision.to_be_bytes());
        }
        Record::LeasesReset => p.push(7),
    }
    p
}

impl Segment {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.records.len() * 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.term.to_be_bytes());
        out.extend_from_slice(&self.first_revision.to_be_bytes());
        for r in &self.records {
            let p = payload(r);
            out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            out.extend_from_slice(&crc32c(&p).to_be_bytes());
            out.extend_from_slice(&p);
        }
        let sum = crc32c(&out);
        out.extend_from_slice(END);
        out.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        out.extend_from_slice(&sum.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Segment, DecodeError> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(DecodeError::NotASegment);
        }
        let body = bytes.len().checked_sub(TRAILER).filter(|b| *b >= HEADER && &bytes[*b..*b + 8] == END);
        let Some(body) = body else { return Err(DecodeError::Truncated(bytes.len())) };
        let said = u32::from_be_bytes(bytes[body + 8..body + 12].try_into().expect("4 bytes"));
        if crc32c(&bytes[..body]) != u32::from_be_bytes(bytes[body + 12..].try_into().expect("4 bytes")) {
            return Err(DecodeError::Checksum(body));
        }
        let bytes = &bytes[..body];
        let term = u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let first_revision = i64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let mut records = Vec::new();
        let mut at = HEADER;
        while at < bytes.len() {
            let Some(head) = bytes.get(at..at + 8) else { return Err(DecodeError::Truncated(at)) };
            let len = u32::from_be_bytes(head[..4].try_into().expect("4 bytes"));
            let sum = u32::from_be_bytes(head[4..].try_into().expect("4 bytes"));
            if len > MAX_FRAME {
                return Err(DecodeError::Malformed { offset: at, what: "a frame larger than 64 MiB" });
            }
            let Some(p) = bytes.get(at + 8..at + 8 + len as usize) else { return Err(DecodeError::Truncated(at)) };
            if crc32c(p) != sum {
                return Err(DecodeError::Checksum(at));
            }
            records.push(Reader { p, offset: at }.record()?);
            at += 8 + len as usize;
        }
        if said as usize != records.len() {
            return Err(DecodeError::Count { said, held: records.len() });
        }
        Ok(Segment { term, first_revision, records })
    }
}

/// Reads one payload's fields.
struct Reader<'a> {
    p: &'a [u8],
    offset: usize,
}

impl Reader<'_> {
    fn bad(&self, what: &'static str) -> DecodeError {
        DecodeError::Malformed { offset: self.offset, what }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        if self.p.len() < n {
            return Err(self.bad("a field runs past the frame"));
        }
        let (head, rest) = self.p.split_at(n);
        self.p = rest;
        Ok(head)
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }

    fn record(mut self) -> Result<Record, DecodeError> {
        let tag = self.take(1)?[0];
        let record = match tag {
            1 => {
                let revision = self.i64()?;
                let sub = self.u32()?;
                let deleted = match self.take(1)?[0] {
                    0 => false,
                    1 => true,
                    _ => return Err(self.bad("a deletion flag other than 0 or 1")),
                };
                let (create_revision, version, lease) = (self.i64()?, self.i64()?, self.i64()?);
                let key = self.bytes()?;
                let value = self.bytes()?;
                Record::Version { revision, sub, deleted, key, create_revision, version, lease, value }
            }
            2 => Record::LeaseGrant { id: self.i64()?, ttl: self.i64()? },
            3 => Record::LeaseRevoke { id: self.i64()? },
            4 => Record::Compact { revision: self.i64()? },
            5 => Record::Auth { data: self.bytes()? },
            6 => Record::Committed { revision: self.i64()? },
            7 => Record::LeasesReset,
            _ => return Err(self.bad("an unknown record type")),
        };
        if !self.p.is_empty() {
            return Err(self.bad("bytes after the record"));
        }
        Ok(record)
    }
}

/// The object name of a term's segment number `n` (from 1): zero-padded, so that listing
/// order is term, then shipping order. The header says which revisions it starts at.
pub fn object_name(term: u64, n: u64) -> String {
    format!("wal/{term:010}/{n:020}")
}

/// (term, number) of a segment's object name, `None` for any other name.
pub fn parse_name(name: &str) -> Option<(u64, u64)> {
    let (term, n) = name.strip_prefix("wal/")?.split_once('/')?;
    let digits =
        |s: &str, len: usize| (s.len() == len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?;
    Some((digits(term, 10)?, digits(n, 20)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Segment {
        Segment {
            term: 3,
            first_revision: 41,
            records: vec![
                Record::Version {
                    revision: 41,
                    sub: 0,
                    deleted: false,
                    key: b"/registry/pods/default/a".to_vec(),
                    create_revision: 41,
                    version: 1,
                    lease: 0,
                    value: vec![0, 1, 2, 255],
                },
                Record::Version {
                    revision: 42,
                    sub: 1,
                    deleted: true,
                    key: b"/b".to_vec(),
                    create_revision: 0,
                    version: 0,
                    lease: 0,
                    value: vec![],
                },
                Record::LeaseGrant { id: 7, ttl: 60 },
                Record::LeaseRevoke { id: 7 },
                Record::Compact { revision: 30 },
                Record::Auth { data: b"{}".to_vec() },
                Record::LeasesReset,
                Record::Committed { revision: 42 },
            ],
        }
    }

    #[test]
    fn a_segment_reads_back_as_written() {
        let s = sample();
        assert_eq!(Segment::decode(&s.encode()), Ok(s));
        let empty = Segment { term: 1, first_revision: 2, records: vec![] };
        assert_eq!(Segment::decode(&empty.encode()), Ok(empty));
    }

    #[test]
    fn damage_is_found_and_located() {
        let bytes = sample().encode();
        assert_eq!(Segment::decode(b"not a segment at all, nothing"), Err(DecodeError::NotASegment));
        assert_eq!(Segment::decode(&bytes[..10]), Err(DecodeError::NotASegment));
        // Every truncation inside the frames is reported, never read as a shorter segment.
        let first_frame = HEADER;
        for cut in first_frame + 1..bytes.len() {
            let err = Segment::decode(&bytes[..cut]).expect_err("truncated");
            assert!(matches!(err, DecodeError::Truncated(_)), "cut at {cut}: {err}");
        }
        // Every flipped bit after the header fails the checksum or the frame's shape.
        for i in HEADER..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x10;
            assert!(Segment::decode(&damaged).is_err(), "a flipped bit at byte {i} went unnoticed");
        }
    }

    #[test]
    fn names_sort_by_term_then_revision() {
        let mut names = vec![object_name(2, 5), object_name(1, 100), object_name(1, 20), object_name(10, 1)];
        names.sort();
        assert_eq!(names, [object_name(1, 20), object_name(1, 100), object_name(2, 5), object_name(10, 1)]);
        assert_eq!(object_name(1, 20), "wal/0000000001/00000000000000000020");
        assert_eq!(parse_name(&object_name(3, 17)), Some((3, 17)));
        for other in ["wal/1/2", "wal/0000000001/0000000000000000002x", "checkpoint/0000000001/00000000000000000020"] {
            assert_eq!(parse_name(other), None, "{other}");
        }
    }
}
