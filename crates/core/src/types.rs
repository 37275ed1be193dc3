//! Plain data types of the etcd revision model. No gRPC, no SQL.

/// A store revision. Revision 1 is the empty store; every write advances it by one.
pub type Revision = i64;

/// A lease identifier (0 means "no lease").
pub type LeaseId = i64;

/// One version of a key, as etcd's `mvccpb.KeyValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// 1 on create, +1 per put, reset by a delete.
    pub version: i64,
    pub value: Vec<u8>,
    pub lease: LeaseId,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A change to one key at one revision.
///
/// For a delete, `kv` holds the key, `mod_revision` = the delete revision and nothing else
/// (as etcd). `prev_kv` is, as etcd reports it to watchers, the key's version at the revision
/// before the change, if there was one (none for a creation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    /// A put that created the key (etcd reports no previous version for it).
    pub fn is_create(&self) -> bool {
        self.kind == EventKind::Put && self.kv.create_revision == self.kv.mod_revision
    }
}

/// All events of one committed revision, in the order the request produced them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionEvents {
    pub revision: Revision,
    pub events: Vec<Event>,
}

/// The end of a key range, decoded from etcd's `range_end` convention.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeEnd {
    /// `range_end` empty: exactly `key`.
    Single,
    /// `range_end == "\0"`: every key `>= key`.
    Unbounded,
    /// Every key in `[key, end)`.
    Before(Vec<u8>),
}

/// A key or key range, as etcd requests name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: RangeEnd,
}

impl KeyRange {
    /// Decodes etcd's `(key, range_end)` pair.
    pub fn from_etcd(key: Vec<u8>, range_end: Vec<u8>) -> KeyRange {
        let end = if range_end.is_empty() {
            RangeEnd::Single
        } else if range_end == [0] {
            RangeEnd::Unbounded
        } else {
            RangeEnd::Before(range_end)
        };
        KeyRange { start: key, end }
    }

    /// Back to etcd's `(key, range_end)` pair.
    pub fn etcd_parts(&self) -> (Vec<u8>, Vec<u8>) {
        let end = match &self.end {
            RangeEnd::Single => Vec::new(),
            RangeEnd::Unbounded => vec![0],
            RangeEnd::Before(end) => end.clone(),
        };
        (self.start.clone(), end)
    }

    pub fn single(key: impl Into<Vec<u8>>) -> KeyRange {
        KeyRange { start: key.into(), end: RangeEnd::Single }
    }

    /// Every key (what `key = "\0", range_end = "\0"` asks for).
    pub fn all() -> KeyRange {
        KeyRange { start: vec![0], end: RangeEnd::Unbounded }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match &self.end {
            RangeEnd::Single => key == self.start.as_slice(),
            RangeEnd::Unbounded => key >= self.start.as_slice(),
            RangeEnd::Before(end) => key >= self.start.as_slice() && key < end.as_slice(),
        }
    }

    /// True when no key can fall in the range (`end <= start`).
    pub fn is_empty(&self) -> bool {
        matches!(&self.end, RangeEnd::Before(end) if end.as_slice() <= self.start.as_slice())
    }

    /// Do two ranges share at least one key?
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        if self.is_empty() || other.is_empty() {
            return false;
        }
        // [a_start, a_end) and [b_start, b_end) overlap iff a_start < b_end && b_start < a_end,
        // with Single treated as [start, start+"\0").
        fn below_end(key: &[u8], r: &KeyRange) -> bool {
            match &r.end {
                RangeEnd::Single => key <= r.start.as_slice(),
                RangeEnd::Unbounded => true,
                RangeEnd::Before(end) => key < end.as_slice(),
            }
        }
        below_end(&self.start, other) && below_end(&other.start, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_decoding_and_membership() {
        let single = KeyRange::from_etcd(b"a".to_vec(), vec![]);
        assert!(single.contains(b"a") && !single.contains(b"ab"));
        let all_from = KeyRange::from_etcd(b"b".to_vec(), vec![0]);
        assert!(all_from.contains(b"zzz") && !all_from.contains(b"a"));
        let prefix = KeyRange::from_etcd(b"/a/".to_vec(), b"/a0".to_vec());
        assert!(prefix.contains(b"/a/x") && !prefix.contains(b"/a0"));
        assert!(KeyRange::from_etcd(b"b".to_vec(), b"a".to_vec()).is_empty());
    }

    #[test]
    fn overlap() {
        let a = KeyRange::single(b"a".to_vec());
        let ab = KeyRange::from_etcd(b"a".to_vec(), b"b".to_vec());
        let b = KeyRange::single(b"b".to_vec());
        assert!(a.overlaps(&ab) && ab.overlaps(&a));
        assert!(!b.overlaps(&ab));
        assert!(!a.overlaps(&b));
        assert!(KeyRange::all().overlaps(&b));
    }
}
