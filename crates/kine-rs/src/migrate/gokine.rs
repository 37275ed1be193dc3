//! Go kine's SQL datastore as a `kine-rs migrate` source: its `kine` table (SQLite — k3s's
//! `state.db` —, PostgreSQL or MySQL; the URL Go kine was started with) read row by row in one
//! snapshot and turned into the history a kine-rs store holds, in memory (values spilled to an
//! unlinked file), which `migrate` then copies and verifies like any source. Go kine's database
//! is only read.
//!
//! What Go kine served is what the copy serves, at the same revision numbers (a row's `id` is
//! its revision):
//! - each key's version at Go kine's compact revision (its `compact_rev_key` row's
//!   `prev_revision`; the rows compaction left at or below it), then every row after it;
//! - not Go kine's bookkeeping: the `compact_rev_key` row and the `gap-<id>` rows its poll loop
//!   writes over revisions that never committed (their revisions carry no change in the copy);
//! - the apiserver's `compact_rev_key`, which Go kine stores as `compact_rev_key_apiserver` with
//!   the value `<version>|<value>`, under its own name with that version and value;
//! - versions, which Go kine does not keep (it reports 0): 1 for a key's oldest version in the
//!   copied history, one more for each later put, as etcd counts them;
//! - leases: Go kine's lease ids are their TTLs in seconds, and it keeps no lease table; each
//!   lease a live key names becomes a kine-rs lease of that id with that TTL, which expires
//!   that long after kine-rs starts serving the copy (Go kine, too, counts a key's TTL again
//!   from its own start).

use anyhow::{Context, Result, bail};
use kine_backend_sql::{GoKineDb, GoKineLog, GoKineRow};
use kine_core::backend::Backend;
use kine_core::memory::{MemTable, MemoryBackend};
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Event, EventKind, KeyValue, LeaseId, Revision};
use sha2::Digest;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Rows read per query.
const PAGE: usize = 10_000;
/// How long the newest revision must stand still before the copy takes it: Go kine fills a
/// revision that has not committed after 1 s with a `gap-` row (PostgreSQL hands out ids
/// before the commit), so below a revision that stood still this long no row is still coming.
const SETTLE: Duration = Duration::from_secs(2);

/// Go kine's name for the apiserver's `compact_rev_key`.
const APISERVER_KEY: &[u8] = b"compact_rev_key_apiserver";
const BOOKKEEPING_KEY: &[u8] = b"compact_rev_key";

fn e(e: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// What was read from Go kine's table.
pub struct Loaded {
    pub backend: MemoryBackend,
    /// Every live key at the newest revision as Go kine serves it.
    pub live: BTreeMap<Vec<u8>, Served>,
    pub revision: Revision,
}

/// Reads Go kine's table (in `db`, `shown` as the user gave it) into memory, or `None` if `db`
/// holds no Go kine table.
pub async fn load(db: GoKineDb, shown: &str) -> Result<Option<Loaded>> {
    let shown = shown.to_string();
    tokio::task::spawn_blocking(move || {
        let Some(mut log) = GoKineLog::open(&db).with_context(|| format!("--from {shown}"))? else { return Ok(None) };
        read(&mut log, &shown).map(Some)
    })
    .await
    .context("read Go kine's table")?
}

fn read(log: &mut GoKineLog, shown: &str) -> Result<Loaded> {
    let first = log.summary()?;
    std::thread::sleep(SETTLE);
    log.begin()?;
    let now = log.summary()?;
    if now.max_id != first.max_id {
        tracing::warn!(
            from = first.max_id,
            to = now.max_id,
            "Go kine is still writing to --from: the copy takes revision {} (what had settled); stop Go kine and \
             run migrate again to copy the rest",
            first.max_id
        );
    }
    let until = first.max_id;
    let recorded = now.compact_revision;
    if recorded > until {
        bail!("--from {shown}: Go kine's compact revision {recorded} is past its newest revision {until}");
    }
    let lost = log.lost_history(until)?;
    if lost > recorded {
        tracing::warn!(
            recorded_compact_revision = recorded,
            history_complete_from = lost,
            "Go kine's table lacks rows its history after its recorded compact revision needs (its compact_rev_key \
             row lost or wrong, or rows deleted by hand): the copy is compacted at the revision from which the \
             history is complete; reads and watches below it answer \"compacted\""
        );
    }
    let compacted = recorded.max(lost);
    tracing::info!(revision = until, compact_revision = compacted, rows = now.rows, "reading Go kine's table");
    let mut build = Builder::new(compacted);
    // The keys at the compact revision: what compaction left at or below it.
    let mut after = 0;
    while after < compacted {
        let rows = log.rows(after, compacted, PAGE)?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        rows.into_iter().for_each(|row| build.at_compaction(row));
    }
    // Every row after it.
    let mut after = compacted.max(1);
    while after < until {
        let rows = log.rows(after, until, PAGE)?;
        after = rows.last().map_or(until, |r| r.id);
        for row in &rows {
            build.after(row)?;
        }
    }
    log.end()?;
    build.finish(until)
}

/// Go kine's rows turned into a kine-rs history in memory: first the rows at or below Go kine's
/// compact revision (each key's newest of them is its version there), then every row after it
/// in revision order.
pub struct Builder {
    backend: MemoryBackend,
    state: State,
    compacted: Revision,
    at_compaction: Option<BTreeMap<Vec<u8>, GoKineRow>>,
}

impl Builder {
    pub fn new(compacted: Revision) -> Builder {
        let dir = kine_backend_nats::values_dir::values_dir();
        // Revision 0: a bucket's first message is a change at revision 1.
        let backend = MemoryBackend::with_table(MemTable::at_with_values_in(0, &dir));
        Builder { backend, state: State::default(), compacted, at_compaction: Some(BTreeMap::new()) }
    }

    /// A row at or below the compact revision, in id order.
    pub fn at_compaction(&mut self, row: GoKineRow) {
        if let Some(keys) = self.at_compaction.as_mut()
            && !bookkeeping(&row)
        {
            keys.insert(row.name.clone(), row);
        }
    }

    /// The keys at the compact revision, once: each key's newest row there, if not a deletion.
    fn start_history(&mut self) -> Result<()> {
        let Some(keys) = self.at_compaction.take() else { return Ok(()) };
        let versions: Vec<ImportedVersion> =
            keys.into_values().filter(|r| !r.deleted).filter_map(|r| self.state.version(&r)).collect();
        let base = self.compacted.max(1);
        for chunk in versions.chunks(PAGE) {
            import(&self.backend, chunk.to_vec(), base)?;
        }
        if self.compacted >= 2 {
            futures_block(self.backend.compact(self.compacted)).map_err(e)?;
        }
        Ok(())
    }

    /// A row after the compact revision, in id order: its own revision (with the previous
    /// value, for the change log `migrate` reads the history from).
    pub fn after(&mut self, row: &GoKineRow) -> Result<()> {
        self.start_history()?;
        if let Some(v) = self.state.version(row) {
            self.backend.apply_committed(v.revision, vec![v.event]).map_err(e)?;
        }
        Ok(())
    }

    /// The history up to `until` (revisions after the last change carry none), the leases.
    pub fn finish(mut self, until: Revision) -> Result<Loaded> {
        self.start_history()?;
        let revision = until.max(self.compacted).max(1);
        let leases: Vec<(LeaseId, i64)> = self.state.leases();
        let import = Import { versions: vec![], revision, add_leases: leases, remove_leases: vec![] };
        futures_block(self.backend.write(WriteOp::Import(import))).map_err(e)?;
        let live = self
            .state
            .keys
            .into_iter()
            .filter_map(|(k, s)| {
                s.live.map(|(mod_revision, value)| {
                    (k, Served { mod_revision, create_revision: s.create_revision, value })
                })
            })
            .collect();
        Ok(Loaded { backend: self.backend, live, revision })
    }
}

/// A key as Go kine serves it: its revisions and the sha256 of its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    pub mod_revision: Revision,
    pub create_revision: Revision,
    pub value: [u8; 32],
}

/// The copy serves what Go kine served at `revision`: every live key with its mod revision and
/// value, and nothing else (checked against the rows read, beside `migrate`'s own check of the
/// copy against the history built from them).
pub async fn verify(target: &dyn Backend, live: &BTreeMap<Vec<u8>, Served>, revision: Revision) -> Result<()> {
    let mut keys = kine_core::pages::Pager::new(target, kine_core::KeyRange::all(), revision);
    let mut expected = live.iter();
    let mut n = 0u64;
    while let Some(kv) = keys.next().await? {
        let here = Served {
            mod_revision: kv.mod_revision,
            create_revision: kv.create_revision,
            value: sha2::Sha256::digest(&kv.value).into(),
        };
        match expected.next() {
            Some((key, served)) if *key == kv.key && *served == here => n += 1,
            Some((key, served)) => bail!(
                "verification failed: at revision {revision} Go kine serves {:?} (created at revision {}, modified at \
                 {}), the copy serves {:?} (created at {}, modified at {}{})",
                String::from_utf8_lossy(key),
                served.create_revision,
                served.mod_revision,
                String::from_utf8_lossy(&kv.key),
                here.create_revision,
                here.mod_revision,
                if served.value != here.value && *key == kv.key { ", another value" } else { "" }
            ),
            None => {
                bail!("verification failed: --to serves {:?}, which Go kine does not", String::from_utf8_lossy(&kv.key))
            }
        }
    }
    if let Some((key, _)) = expected.next() {
        bail!("verification failed: --to lacks {:?}, which Go kine serves", String::from_utf8_lossy(key));
    }
    tracing::info!(keys = n, revision, "--to serves every key Go kine serves, with its revisions and value");
    Ok(())
}

fn import(backend: &MemoryBackend, versions: Vec<ImportedVersion>, revision: Revision) -> Result<()> {
    let import = Import { versions, revision, add_leases: vec![], remove_leases: vec![] };
    futures_block(backend.write(WriteOp::Import(import))).map_err(e)?;
    Ok(())
}

/// Runs a call of the memory backend from the blocking thread that reads Go kine's table.
fn futures_block<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Handle::current().block_on(f)
}

/// Go kine's own rows, never shown as keys.
fn bookkeeping(row: &GoKineRow) -> bool {
    row.name == BOOKKEEPING_KEY || (row.deleted && row.name == format!("gap-{}", row.id).as_bytes())
}

/// What the translation keeps per key.
#[derive(Default)]
struct KeyState {
    version: i64,
    create_revision: Revision,
    lease: i64,
    /// Live at the newest row read: (mod revision, sha256 of the value).
    live: Option<(Revision, [u8; 32])>,
}

#[derive(Default)]
struct State {
    keys: HashMap<Vec<u8>, KeyState>,
}

impl State {
    /// The kine-rs version of `row`, or `None` for Go kine's bookkeeping.
    fn version(&mut self, row: &GoKineRow) -> Option<ImportedVersion> {
        if bookkeeping(row) {
            return None;
        }
        let (key, value, encoded_version) = if row.name == APISERVER_KEY {
            let (version, value) = decode_version(&row.value);
            (b"compact_rev_key".to_vec(), value, Some(version))
        } else {
            (row.name.clone(), row.value.clone(), None)
        };
        let s = self.keys.entry(key.clone()).or_default();
        if row.deleted {
            let kv = KeyValue { key, mod_revision: row.id, ..Default::default() };
            *s = KeyState::default();
            return Some(ImportedVersion {
                revision: row.id,
                sub: 0,
                event: Event { kind: EventKind::Delete, kv, prev_kv: None },
            });
        }
        let fresh = s.live.is_none();
        s.version = encoded_version.unwrap_or(if fresh { 1 } else { s.version + 1 });
        s.create_revision = if fresh || row.created {
            if row.created || row.create_revision == 0 { row.id } else { row.create_revision }
        } else {
            s.create_revision
        };
        s.lease = row.lease.max(0);
        s.live = Some((row.id, sha2::Sha256::digest(&value).into()));
        let kv = KeyValue {
            key,
            create_revision: s.create_revision,
            mod_revision: row.id,
            version: s.version,
            value,
            lease: s.lease,
        };
        Some(ImportedVersion { revision: row.id, sub: 0, event: Event { kind: EventKind::Put, kv, prev_kv: None } })
    }

    /// A lease for every TTL a live key names (Go kine's lease id is the TTL).
    fn leases(&self) -> Vec<(LeaseId, i64)> {
        let mut ttls: Vec<i64> =
            self.keys.values().filter(|s| s.live.is_some() && s.lease > 0).map(|s| s.lease).collect();
        ttls.sort_unstable();
        ttls.dedup();
        ttls.into_iter().map(|t| (t, t)).collect()
    }
}

/// Go kine's `<version>|<value>` of `compact_rev_key_apiserver`; a legacy bare number is the
/// version, with the value `0`.
fn decode_version(raw: &[u8]) -> (i64, Vec<u8>) {
    match raw.iter().position(|b| *b == b'|') {
        Some(at) => {
            let version = std::str::from_utf8(&raw[..at]).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
            (version, raw[at + 1..].to_vec())
        }
        None => (std::str::from_utf8(raw).ok().and_then(|v| v.parse().ok()).unwrap_or(0), b"0".to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, name: &str, created: bool, deleted: bool, create_revision: i64, value: &str) -> GoKineRow {
        GoKineRow {
            id,
            name: name.as_bytes().to_vec(),
            created,
            deleted,
            create_revision,
            prev_revision: 0,
            lease: 0,
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn rows_become_etcd_versions() {
        let mut s = State::default();
        assert!(s.version(&row(1, "compact_rev_key", true, false, 0, "")).is_none(), "bookkeeping");
        assert!(s.version(&row(5, "gap-5", false, true, 0, "")).is_none(), "a fill row");
        let v = s.version(&row(2, "/a", true, false, 0, "x")).unwrap();
        assert_eq!((v.event.kv.version, v.event.kv.create_revision, v.event.kv.mod_revision), (1, 2, 2));
        let v = s.version(&row(3, "/a", false, false, 2, "y")).unwrap();
        assert_eq!((v.event.kv.version, v.event.kv.create_revision, v.event.kv.value.as_slice()), (2, 2, &b"y"[..]));
        let v = s.version(&row(4, "/a", false, true, 0, "")).unwrap();
        assert_eq!(v.event.kind, EventKind::Delete);
        let v = s.version(&row(6, "/a", true, false, 0, "z")).unwrap();
        assert_eq!((v.event.kv.version, v.event.kv.create_revision), (1, 6), "created again");
        // A key named like a fill row, but live, is a key.
        assert!(s.version(&row(7, "gap-3", true, false, 0, "k")).is_some());
    }

    #[test]
    fn the_apiservers_compact_key_keeps_its_version() {
        let mut s = State::default();
        let v = s.version(&row(9, "compact_rev_key_apiserver", true, false, 0, "3|1234")).unwrap();
        assert_eq!(v.event.kv.key, b"compact_rev_key");
        assert_eq!((v.event.kv.version, v.event.kv.value.as_slice()), (3, &b"1234"[..]));
        assert_eq!(decode_version(b"7"), (7, b"0".to_vec()), "a legacy bare version");
    }

    #[test]
    fn leases_are_the_ttls_live_keys_name() {
        let mut s = State::default();
        let mut r = row(2, "/e", true, false, 0, "x");
        r.lease = 3600;
        s.version(&r);
        let mut gone = row(3, "/f", true, false, 0, "x");
        gone.lease = 60;
        s.version(&gone);
        s.version(&row(4, "/f", false, true, 0, ""));
        assert_eq!(s.leases(), vec![(3600, 3600)]);
    }
}
