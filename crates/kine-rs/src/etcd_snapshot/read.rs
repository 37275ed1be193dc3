//! Restoring a snapshot saved from etcd (or from kine-rs in etcd's format) into a new SQLite
//! database: the sha256 and the bbolt file's structure are checked (`verify`) before bbolt maps
//! it, then every version its `key` bucket holds (the history since etcd's compaction, deletes
//! included) is written with its revision, with the leases, the users and roles, and the
//! compact revision.

use super::auth::{AUTH, ROLES, USERS};
use super::{FINISHED_COMPACT, KEY, LEASE, Lease, META, parse_revision_key};
use anyhow::{Context, anyhow};
use kine_backend_sql::{Restored, Row};
use kine_nats_embed::bolt::{Db, Entry};
use kine_proto::mvccpb;
use prost::Message;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

const SCAN_BYTES: usize = 4 << 20;

/// What a restore wrote.
pub struct Summary {
    pub revision: i64,
    pub compact_revision: i64,
    pub versions: u64,
    pub live: u64,
    pub leases: usize,
}

/// Restores the etcd snapshot `file` (with or without the sha256 that `snapshot save`
/// appends; or a stopped member's `member/snap/db`) into a new SQLite database at `db`.
pub fn restore(file: &Path, db: &Path) -> anyhow::Result<Summary> {
    let (bolt, buckets) = open(file).map_err(|e| anyhow!("snapshot {}: {e}", file.display()))?;
    let in_file = |e: String| anyhow!("snapshot {}: {e}", file.display());
    // A bucket etcd always has; empty when missing.
    let bucket = |name: &[u8]| -> Result<Vec<Entry>, String> {
        if buckets.iter().any(|(b, _)| b == name) { scan_all(&bolt, name) } else { Ok(Vec::new()) }
    };
    let compacted = match bucket(META).map_err(in_file)?.into_iter().find(|(k, _)| k == FINISHED_COMPACT) {
        Some((_, v)) => parse_revision_key(&v)
            .map(|(main, _, _)| main)
            .ok_or_else(|| in_file("meta/finishedCompactRev is malformed".into()))?,
        None => -1,
    };
    let mut leases = Vec::new();
    for (k, v) in bucket(LEASE).map_err(in_file)? {
        let lease = Lease::decode(v.as_slice()).map_err(|e| in_file(format!("lease {k:02x?}: {e}")))?;
        leases.push((lease.id, lease.ttl));
    }
    let auth = super::auth::read(
        &bucket(AUTH).map_err(in_file)?,
        &bucket(USERS).map_err(in_file)?,
        &bucket(ROLES).map_err(in_file)?,
    )
    .map_err(in_file)?;
    let restored = Restored { revision: None, compact_revision: compacted, leases, auth };
    let (mut after, mut versions) = (Vec::new(), 0u64);
    let mut next = || -> anyhow::Result<Option<Vec<Row>>> {
        let page = bolt.scan(KEY, &after, SCAN_BYTES).map_err(|e| anyhow!(e))?;
        let Some((last, _)) = page.last() else { return Ok(None) };
        after = last.clone();
        let rows =
            page.into_iter().map(|(k, v)| row(&k, &v)).collect::<Result<Vec<_>, String>>().map_err(|e| anyhow!(e))?;
        versions += rows.len() as u64;
        Ok(Some(rows))
    };
    let (revision, live) = kine_backend_sql::restore_sqlite_rows(db, &restored, &mut next)
        .with_context(|| format!("restore {} into {}", file.display(), db.display()))?;
    Ok(Summary { revision, compact_revision: compacted, versions, live, leases: restored.leases.len() })
}

/// The checked bbolt file, open, and its top-level buckets (etcd's `key` and `meta` among them).
fn open(path: &Path) -> Result<(Db, Vec<Entry>), String> {
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
    Ok((db, buckets))
}

/// One entry of the `key` bucket as a version to restore.
fn row(k: &[u8], v: &[u8]) -> Result<Row, String> {
    let (revision, sub, deleted) =
        parse_revision_key(k).ok_or_else(|| format!("key bucket: malformed revision {k:02x?}"))?;
    let kv =
        mvccpb::KeyValue::decode(v).map_err(|e| format!("key bucket: revision {revision}: not a KeyValue: {e}"))?;
    let mut kv = kine_server::kv_from_proto(kv);
    if deleted {
        kv.mod_revision = revision;
    } else if kv.mod_revision != revision {
        return Err(format!("key bucket: revision {revision} holds a version of mod revision {}", kv.mod_revision));
    }
    Ok(Row { revision, sub, deleted, kv })
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
