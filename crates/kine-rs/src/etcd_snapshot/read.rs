//! Reading a snapshot saved from etcd (or from kine-rs in etcd's format): the sha256 and the
//! bbolt file's structure are checked (`verify`) before bbolt maps it, then its `key` bucket is
//! replayed: each key's newest version, tombstones removing keys.

use super::auth::{AUTH, ROLES, USERS};
use super::{FINISHED_COMPACT, KEY, LEASE, Lease, META, parse_revision_key};
use kine_core::snapshot::Snapshot;
use kine_nats_embed::bolt::{Db, Entry};
use kine_proto::mvccpb;
use prost::Message;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

const SCAN_BYTES: usize = 4 << 20;

/// The live keys, leases and revision of an etcd snapshot (with or without the sha256 that
/// `snapshot save` appends) or of an etcd data file (`member/snap/db`).
pub fn read(path: &Path) -> Result<Snapshot, String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let body = if len % 512 == 32 { check_sha256(&mut file, len - 32)? } else { len };
    super::verify::check(&file, body)?;
    let db = Db::open_read_only(path).map_err(|e| format!("bbolt cannot open it: {e}"))?;
    let buckets = db.scan(b"", b"", usize::MAX)?;
    for need in [KEY, META] {
        if !buckets.iter().any(|(name, v)| name == need && v.is_empty()) {
            return Err(format!("a bbolt file, but not etcd's: it has no `{}` bucket", String::from_utf8_lossy(need)));
        }
    }
    let (kvs, last) = replay(&db)?;
    // A bucket etcd always has; empty when missing.
    let bucket = |name: &[u8]| -> Result<Vec<Entry>, String> {
        if buckets.iter().any(|(b, _)| b == name) { scan_all(&db, name) } else { Ok(Vec::new()) }
    };
    let compacted = match bucket(META)?.into_iter().find(|(k, _)| k == FINISHED_COMPACT) {
        Some((_, v)) => parse_revision_key(&v).map(|(main, _)| main).ok_or("meta/finishedCompactRev is malformed")?,
        None => 0,
    };
    let mut leases = Vec::new();
    for (k, v) in bucket(LEASE)? {
        let lease = Lease::decode(v.as_slice()).map_err(|e| format!("lease {k:02x?}: {e}"))?;
        leases.push((lease.id, lease.ttl));
    }
    let auth = super::auth::read(&bucket(AUTH)?, &bucket(USERS)?, &bucket(ROLES)?)?;
    let revision = last.max(compacted).max(1);
    Ok(Snapshot { revision, compact_revision: revision, cluster_id: 0, leases, kvs, auth })
}

/// Each key's newest version (tombstoned keys left out), in key order, and the last revision.
fn replay(db: &Db) -> Result<(Vec<kine_core::types::KeyValue>, i64), String> {
    let mut live: HashMap<Vec<u8>, mvccpb::KeyValue> = HashMap::new();
    let mut last = 0;
    let mut after = Vec::new();
    loop {
        let page = db.scan(KEY, &after, SCAN_BYTES)?;
        let Some((k, _)) = page.last() else { break };
        after = k.clone();
        for (k, v) in page {
            let (main, tombstone) =
                parse_revision_key(&k).ok_or_else(|| format!("key bucket: malformed revision {k:02x?}"))?;
            let kv = mvccpb::KeyValue::decode(v.as_slice())
                .map_err(|e| format!("key bucket: revision {main}: not a KeyValue: {e}"))?;
            last = last.max(main);
            if tombstone {
                live.remove(&kv.key);
            } else {
                live.insert(kv.key.clone(), kv);
            }
        }
    }
    let mut kvs: Vec<_> = live.into_values().map(kine_server::kv_from_proto).collect();
    kvs.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    Ok((kvs, last))
}

fn scan_all(db: &Db, bucket: &[u8]) -> Result<Vec<Entry>, String> {
    let mut all: Vec<Entry> = Vec::new();
    loop {
        let after = all.last().map(|(k, _)| k.clone()).unwrap_or_default();
        let page = db.scan(bucket, &after, SCAN_BYTES)?;
        if page.is_empty() {
            return Ok(all);
        }
        all.extend(page);
    }
}

/// The sha256 `snapshot save` appended matches the `body` bytes before it; returns `body`.
fn check_sha256(file: &mut File, body: u64) -> Result<u64, String> {
    let mut sha = Sha256::new();
    let mut rest = body;
    let mut buf = vec![0u8; 1 << 20];
    while rest > 0 {
        let n = buf.len().min(rest as usize);
        file.read_exact(&mut buf[..n]).map_err(|e| e.to_string())?;
        sha.update(&buf[..n]);
        rest -= n as u64;
    }
    let mut sum = [0u8; 32];
    file.read_exact(&mut sum).map_err(|e| e.to_string())?;
    if sha.finalize().as_slice() != sum {
        return Err("its sha256 does not match its content: the file is damaged or truncated".into());
    }
    Ok(body)
}
