//! Snapshots in etcd's own format: the bbolt file etcd's backend keeps (written and read with
//! go.etcd.io/bbolt, through the Go shim), so that `etcdctl`/`etcdutl snapshot status` read a
//! kine-rs snapshot, `etcdutl snapshot restore` turns it into an etcd member, and
//! `kine-rs snapshot restore` takes a snapshot saved from etcd.
//!
//! What goes in (etcd 3.4–3.7 use the same schema):
//! - bucket `key`: the history etcd would hold: each key's version at the store's compact
//!   revision, then every revision since, under its revision: 8-byte big-endian main revision,
//!   `_`, 8-byte big-endian sub revision (the changes of one Txn share the main revision), and
//!   `t` for a delete; the value is an mvccpb.KeyValue (a delete's: its key alone).
//! - bucket `meta`: `finishedCompactRev`/`scheduledCompactRev` at the store's compact revision
//!   (none if never compacted), `consistent_index` and `term` (which a restore replaces),
//!   `storageVersion` 3.6.0 (etcd 3.6 and 3.7 both start on it).
//! - bucket `lease`: 8-byte big-endian id → leasepb.Lease {ID, TTL}.
//! - buckets `auth` (`authEnabled`, `authRevision`), `authUsers` and `authRoles` (authpb.User
//!   with its bcrypt hash, authpb.Role): the users and roles, when the store has any.
//! - the other buckets a fresh etcd has, empty: alarm, cluster, members, members_removed
//!   (membership is the restoring tool's business).

mod auth;
mod read;
mod verify;
mod write;

pub use read::restore;
pub use write::Etcd;

pub(crate) const KEY: &[u8] = b"key";
pub(crate) const META: &[u8] = b"meta";
pub(crate) const LEASE: &[u8] = b"lease";
/// Every top-level bucket of an etcd 3.6/3.7 backend.
pub(crate) const BUCKETS: [&[u8]; 10] =
    [b"alarm", b"auth", b"authRoles", b"authUsers", b"cluster", KEY, LEASE, b"members", b"members_removed", META];

pub(crate) const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
pub(crate) const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";

/// etcd's revision key: main and sub, big-endian, joined by `_`.
pub(crate) fn revision_key(main: i64, sub: i64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..8].copy_from_slice(&main.to_be_bytes());
    k[8] = b'_';
    k[9..].copy_from_slice(&sub.to_be_bytes());
    k
}

/// The main and sub revision of a revision key, and whether it marks a tombstone (a trailing
/// `t`).
pub(crate) fn parse_revision_key(k: &[u8]) -> Option<(i64, i64, bool)> {
    let main = i64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let sub = i64::from_be_bytes(k.get(9..17)?.try_into().ok()?);
    match (k.len(), k.get(8), k.get(17)) {
        (17, Some(b'_'), None) => Some((main, sub, false)),
        (18, Some(b'_'), Some(b't')) => Some((main, sub, true)),
        _ => None,
    }
}

/// leasepb.Lease (etcd's lease record).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Lease {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_keys_round_trip_and_sort_by_revision() {
        let a = revision_key(2, 1);
        let b = revision_key(10, 0);
        assert!(a < b);
        assert_eq!(parse_revision_key(&a), Some((2, 1, false)));
        let mut t = b.to_vec();
        t.push(b't');
        assert_eq!(parse_revision_key(&t), Some((10, 0, true)));
        assert_eq!(parse_revision_key(b"short"), None);
        t[17] = b'x';
        assert_eq!(parse_revision_key(&t), None);
    }
}
