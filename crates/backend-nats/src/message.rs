//! One etcd change ↔ one JetStream message.
//!
//! Subject `$KV.<bucket>.<encoded key>`; the value is the raw payload; metadata travels in
//! headers (no JSON, no base64): `Kine-Create`, `Kine-Version`, `Kine-Lease`. A deletion
//! carries `KV-Operation: DEL` (as NATS KV tools expect) and an empty payload.
//! A request that changes several keys is one atomic batch of consecutive messages, each
//! marked `Kine-Batch: i/n`; all its changes take the revision of the batch's last message.
//! The stream's first message, on [`INIT_TOKEN`], marks a bucket written by kine-rs; its
//! sequence is revision 1, so the first etcd write gets revision 2, as in etcd.
//! A message on [`FILL_TOKEN`] (no payload, no headers of kine-rs's) is a revision at which
//! nothing changed: `kine-rs migrate` writes them so that another store's versions land on
//! their own revisions (docs/nats.md, "Fillers"); compaction removes them.

use crate::codec;
use async_nats::HeaderMap;
use bytes::Bytes;
use kine_core::{Event, EventKind, KeyValue, Revision};

/// The subject token of the init marker; `codec::encode_key` never produces `~`.
pub const INIT_TOKEN: &str = "~init";
/// The subject token of a filler: a revision with no change.
pub const FILL_TOKEN: &str = "~fill";
const CREATE: &str = "Kine-Create";
const VERSION: &str = "Kine-Version";
const LEASE: &str = "Kine-Lease";
const OPERATION: &str = "KV-Operation";
const BATCH: &str = "Kine-Batch";
/// On an imported version 1 whose create revision is not its own revision (a Go kine key whose
/// earlier versions were compacted): `Kine-Create` is kept as written.
const CREATE_KEPT: &str = "Kine-Create-Kept";

pub fn subject(bucket: &str, key: &[u8]) -> String {
    format!("$KV.{bucket}.{}", codec::encode_key(key))
}

/// Bytes of a protocol line that carries a subject besides the subject itself, at most: the
/// longest is a JetStream delivery (`HMSG <subject> <sid> $JS.ACK.<domain>.<account>.<stream>.
/// <consumer>.<five numbers>.<token> <sizes>`), or its forwarding between servers.
const LINE_OVERHEAD: usize = 512;

/// The longest subject servers with this `max_control_line` carry for bucket `bucket`.
pub fn max_subject_len(max_control_line: usize, bucket: &str) -> usize {
    max_control_line.saturating_sub(LINE_OVERHEAD + bucket.len())
}

/// Refuses a key whose subject no NATS server would carry: publishing it would get kine-rs's
/// connection closed ("maximum control line exceeded"), failing other clients' requests too.
pub fn check_key(key: &[u8], subject_len: usize, limit: usize, max_control_line: usize) -> kine_core::Result<()> {
    if subject_len > limit {
        return Err(kine_core::Error::InvalidArgument(format!(
            "etcdserver: key is {} bytes, its NATS subject {subject_len} bytes; the NATS datastore takes subjects of \
             at most {limit} bytes (the servers' max_control_line, {max_control_line}, less {} for the rest of a \
             protocol line; maxControlLine=N if the servers allow longer lines)",
            key.len(),
            max_control_line - limit
        )));
    }
    Ok(())
}

pub fn init_subject(bucket: &str) -> String {
    format!("$KV.{bucket}.{INIT_TOKEN}")
}

pub fn fill_subject(bucket: &str) -> String {
    format!("$KV.{bucket}.{FILL_TOKEN}")
}

/// Headers and payload for one change.
pub fn encode(event: &Event) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    match event.kind {
        EventKind::Put => {
            headers.insert(CREATE, event.kv.create_revision.to_string().as_str());
            headers.insert(VERSION, event.kv.version.to_string().as_str());
            if event.kv.lease != 0 {
                headers.insert(LEASE, event.kv.lease.to_string().as_str());
            }
            (headers, Bytes::from(event.kv.value.clone()))
        }
        EventKind::Delete => {
            headers.insert(OPERATION, "DEL");
            (headers, Bytes::new())
        }
    }
}

/// Headers and payload for another store's version at `revision` (an import): as [`encode`],
/// and a version 1 whose create revision is not `revision` keeps it (`Kine-Create-Kept`).
pub fn encode_imported(event: &Event, revision: Revision) -> (HeaderMap, Bytes) {
    let (mut headers, payload) = encode(event);
    if event.kind == EventKind::Put && event.kv.version == 1 && event.kv.create_revision != revision {
        headers.insert(CREATE_KEPT, "1");
    }
    (headers, payload)
}

/// The id a write's message carries (`Nats-Msg-Id`, see the backend's `sent.rs`).
pub fn msg_id(headers: Option<&HeaderMap>) -> Option<&str> {
    headers?.get("Nats-Msg-Id").map(|v| v.as_str())
}

/// Marks message `index` (from 0) of a batch of `count`.
pub fn mark_batch(headers: &mut HeaderMap, index: usize, count: usize) {
    headers.insert(BATCH, format!("{}/{count}", index + 1).as_str());
}

/// `(position from 1, count)` of a batch member.
pub fn batch_position(headers: Option<&HeaderMap>) -> Option<(i64, i64)> {
    let value = headers?.get(BATCH)?.as_str();
    let (i, n) = value.split_once('/')?;
    let (i, n) = (i.parse().ok()?, n.parse().ok()?);
    (1 <= i && i <= n).then_some((i, n))
}

/// What one stream message means.
#[derive(Debug)]
pub enum Decoded {
    Init,
    /// A filler: a revision with no change.
    Fill,
    Change(Event),
    /// A message kine-rs did not write (another program's key, or kine's format).
    Foreign(String),
}

pub fn decode(bucket: &str, subject: &str, headers: Option<&HeaderMap>, payload: &[u8], seq: Revision) -> Decoded {
    let prefix = format!("$KV.{bucket}.");
    let Some(tokens) = subject.strip_prefix(&prefix) else {
        return Decoded::Foreign(format!("subject {subject} is outside the bucket"));
    };
    if tokens == INIT_TOKEN {
        return Decoded::Init;
    }
    if tokens == FILL_TOKEN {
        return Decoded::Fill;
    }
    let Some(key) = codec::decode_key(tokens) else {
        return Decoded::Foreign(format!("subject {subject} is not a kine-rs key"));
    };
    let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
    let op = header(OPERATION);
    if matches!(op.as_deref(), Some("DEL") | Some("PURGE")) {
        let kv = KeyValue { key, mod_revision: seq, ..Default::default() };
        return Decoded::Change(Event { kind: EventKind::Delete, kv, prev_kv: None });
    }
    let number = |name: &str| header(name).and_then(|v| v.parse::<i64>().ok());
    let (Some(create_revision), Some(version)) = (number(CREATE), number(VERSION)) else {
        return Decoded::Foreign(format!("message {seq} on {subject} has no kine-rs headers"));
    };
    // A creation's create revision is its own revision (its own sequence, or its batch's last),
    // which the writer could not know (other nodes may have written in between); an imported
    // version says when it keeps the one it carries.
    let create_revision = if version == 1 && header(CREATE_KEPT).is_none() {
        batch_position(headers).map_or(seq, |(i, n)| seq - i + n)
    } else {
        create_revision
    };
    let kv = KeyValue {
        key,
        create_revision,
        mod_revision: seq,
        version,
        value: payload.to_vec(),
        lease: number(LEASE).unwrap_or(0),
    };
    Decoded::Change(Event { kind: EventKind::Put, kv, prev_kv: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let put = Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: b"/a/b".to_vec(),
                create_revision: 3,
                mod_revision: 9,
                version: 2,
                value: b"v".to_vec(),
                lease: 7,
            },
            prev_kv: None,
        };
        let (h, p) = encode(&put);
        let Decoded::Change(got) = decode("kine", &subject("kine", b"/a/b"), Some(&h), &p, 9) else { panic!() };
        assert_eq!(got, put);
        let del = Event {
            kind: EventKind::Delete,
            kv: KeyValue { key: b"k".to_vec(), mod_revision: 10, ..Default::default() },
            prev_kv: None,
        };
        let (h, p) = encode(&del);
        let Decoded::Change(got) = decode("kine", &subject("kine", b"k"), Some(&h), &p, 10) else { panic!() };
        assert_eq!(got, del);
        assert!(matches!(decode("kine", &init_subject("kine"), None, b"", 1), Decoded::Init));
        assert_eq!(fill_subject("kine"), "$KV.kine.~fill");
        assert!(matches!(decode("kine", &fill_subject("kine"), None, b"", 6), Decoded::Fill));
        // Another bucket's filler is not this one's.
        assert!(matches!(decode("kine", &fill_subject("other"), None, b"", 6), Decoded::Foreign(_)));
        // A creation takes its create revision from its own sequence.
        let (h, p) = encode(&Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: b"n".to_vec(),
                create_revision: 5,
                mod_revision: 5,
                version: 1,
                value: vec![],
                lease: 0,
            },
            prev_kv: None,
        });
        let Decoded::Change(got) = decode("kine", &subject("kine", b"n"), Some(&h), &p, 8) else { panic!() };
        assert_eq!((got.kv.create_revision, got.kv.mod_revision), (8, 8));
        // A creation in a batch: the batch's revision (its last sequence).
        let mut h2 = h.clone();
        mark_batch(&mut h2, 0, 3);
        let Decoded::Change(got) = decode("kine", &subject("kine", b"n"), Some(&h2), &p, 8) else { panic!() };
        assert_eq!((got.kv.create_revision, got.kv.mod_revision), (10, 8));
        // An imported version 1 created earlier keeps its create revision.
        let kept = Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: b"k".to_vec(),
                create_revision: 3,
                mod_revision: 9,
                version: 1,
                value: vec![],
                lease: 0,
            },
            prev_kv: None,
        };
        let (h, p) = encode_imported(&kept, 9);
        let Decoded::Change(got) = decode("kine", &subject("kine", b"k"), Some(&h), &p, 9) else { panic!() };
        assert_eq!(got, kept);
        assert!(encode_imported(&put, 9).0.get(CREATE_KEPT).is_none(), "only where needed");
        let mut h = HeaderMap::new();
        mark_batch(&mut h, 1, 3);
        assert_eq!(batch_position(Some(&h)), Some((2, 3)));
        assert_eq!(batch_position(None), None);
        assert!(matches!(decode("kine", "$KV.kine.x", None, b"{}", 4), Decoded::Foreign(_)));
    }
}
