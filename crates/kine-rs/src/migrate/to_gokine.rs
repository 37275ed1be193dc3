//! `kine-rs migrate --to-go-kine`: a kine-rs store written back as Go kine's table (SQLite,
//! PostgreSQL or MySQL), so that a user who tried kine-rs can return to Go kine with every
//! object's resourceVersion kept. Checked by reading the rows back as `--from` reads Go kine.
//!
//! Go kine's table holds one row per revision (its id), so:
//! - a revision that changed several keys at once (a multi-key Txn, a lease revoke deleting
//!   its keys) cannot be written as it was: the history is written from the newest such
//!   revision on (Go kine's compact revision becomes at least that one), the keys below it as
//!   their versions there; two live keys whose version is from one such revision cannot be
//!   written at all (refused, naming them);
//! - leases: Go kine keeps the TTL in seconds with each key (its lease ids are TTLs);
//! - the apiserver's `compact_rev_key` is Go kine's `compact_rev_key_apiserver`, its value
//!   `<version>|<value>`; Go kine's own `compact_rev_key` row records the compact revision;
//! - the newest revision gets a row whatever happens (a `gap-<id>` row if it changed nothing),
//!   so that Go kine reports it as its current revision.

use anyhow::{Context, Result, bail};
use kine_backend_sql::{GoKineDb, GoKineRowOut, GoKineWriter};
use kine_core::backend::Backend;
use kine_core::pages::Pager;
use kine_core::{EventKind, KeyRange, KeyValue, Revision};
use std::collections::{BTreeSet, HashMap};

/// Revisions of history read per request, and rows written per batch.
const WINDOW: Revision = 1000;

fn e(e: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// What was written: (current revision, Go kine's compact revision, rows).
pub async fn write(source: &dyn Backend, db: GoKineDb) -> Result<(Revision, Revision, usize)> {
    let s = source.revisions().await.map_err(e)?;
    // The newest revision that changed several keys: the history is written from it on.
    let mut start = s.compacted.max(1);
    let mut after = start;
    while after < s.current {
        let to = (after + WINDOW).min(s.current);
        for r in source.events(&KeyRange::all(), after, to).await.map_err(e)? {
            if r.events.len() > 1 {
                start = start.max(r.revision);
            }
        }
        after = to;
    }
    let ttls: HashMap<i64, i64> = source.leases().await.map_err(e)?.into_iter().collect();
    let mut rows: Vec<GoKineRowOut> = Vec::new();
    let mut used: BTreeSet<Revision> = BTreeSet::new();
    // Each live key's version at `start`.
    let mut keys = Pager::new(source, KeyRange::all(), start);
    let mut at_start: HashMap<Revision, Vec<u8>> = HashMap::new();
    while let Some(kv) = keys.next().await.map_err(e)? {
        if let Some(other) = at_start.insert(kv.mod_revision, kv.key.clone()) {
            bail!(
                "keys {:?} and {:?} were both written at revision {} (one Txn): Go kine's table holds one change per \
                 revision and cannot hold them",
                String::from_utf8_lossy(&other),
                String::from_utf8_lossy(&kv.key),
                kv.mod_revision
            );
        }
        used.insert(kv.mod_revision);
        rows.push(row_of(&kv, &ttls, false, 0, None));
    }
    // Every change after it, one row each. A create after a deletion names the deletion as its
    // previous revision, as Go kine's do (its unique index is on name and previous revision).
    let mut tombstones: HashMap<Vec<u8>, Revision> = HashMap::new();
    let mut after = start;
    while after < s.current {
        let to = (after + WINDOW).min(s.current);
        for r in source.events(&KeyRange::all(), after, to).await.map_err(e)? {
            let Some(ev) = r.events.into_iter().next() else { continue };
            let prev = ev.prev_kv.as_ref();
            let (prev_revision, old_value) = match prev {
                Some(p) => (p.mod_revision, Some(p.value.clone())),
                None => (tombstones.get(&ev.kv.key).copied().unwrap_or(0), None),
            };
            used.insert(r.revision);
            match ev.kind {
                EventKind::Put => {
                    let mut row = row_of(&ev.kv, &ttls, true, prev_revision, old_value);
                    row.id = r.revision;
                    rows.push(row);
                }
                EventKind::Delete => {
                    tombstones.insert(ev.kv.key.clone(), r.revision);
                    rows.push(GoKineRowOut {
                        id: r.revision,
                        name: go_kine_name(&ev.kv.key),
                        created: false,
                        deleted: true,
                        create_revision: 0,
                        prev_revision,
                        lease: 0,
                        value: None,
                        old_value,
                    })
                }
            }
        }
        after = to;
    }
    if !used.contains(&s.current) && s.current > 1 {
        rows.push(fill(s.current));
        used.insert(s.current);
    }
    // Go kine's own record of its compact revision, on a revision no change took.
    let compacted = if start >= 2 { start } else { 0 };
    match (1..=s.current).find(|id| !used.contains(id)) {
        Some(id) => rows.push(GoKineRowOut {
            id,
            name: b"compact_rev_key".to_vec(),
            created: true,
            deleted: false,
            create_revision: 0,
            prev_revision: compacted,
            lease: 0,
            value: Some(Vec::new()),
            old_value: None,
        }),
        // Every revision holds a change (so none was compacted): Go kine adds the row itself
        // at its first start, at the next revision.
        None if compacted == 0 => {}
        None => bail!("no free revision for Go kine's compact_rev_key row below revision {}", s.current),
    }
    rows.sort_by_key(|r| r.id);
    let n = rows.len();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut writer = GoKineWriter::create(&db)?;
        let written = rows.chunks(WINDOW as usize).try_for_each(|chunk| writer.insert(chunk));
        match written {
            Ok(()) => writer.finish(),
            Err(err) => {
                writer.abandon();
                Err(err)
            }
        }
    })
    .await
    .context("write Go kine's table")??;
    Ok((s.current, compacted, n))
}

/// A put as a row: a create or an update.
fn row_of(
    kv: &KeyValue,
    ttls: &HashMap<i64, i64>,
    history: bool,
    prev_revision: Revision,
    old_value: Option<Vec<u8>>,
) -> GoKineRowOut {
    // Go kine marks a key's creation; any other row carries the create revision.
    let created = kv.create_revision == kv.mod_revision;
    let (key, value) = if kv.key == b"compact_rev_key" {
        // The apiserver's key, as Go kine keeps it.
        let mut v = format!("{}|", kv.version).into_bytes();
        v.extend_from_slice(&kv.value);
        (b"compact_rev_key_apiserver".to_vec(), v)
    } else {
        (kv.key.clone(), kv.value.clone())
    };
    GoKineRowOut {
        id: kv.mod_revision,
        name: key,
        created,
        deleted: false,
        create_revision: if created { 0 } else { kv.create_revision },
        prev_revision: if history { prev_revision } else { 0 },
        lease: if kv.lease == 0 { 0 } else { ttls.get(&kv.lease).copied().unwrap_or(0) },
        value: Some(value),
        old_value: if history { old_value } else { None },
    }
}

fn go_kine_name(key: &[u8]) -> Vec<u8> {
    if key == b"compact_rev_key" { b"compact_rev_key_apiserver".to_vec() } else { key.to_vec() }
}

/// Go kine's row for a revision that changed nothing.
fn fill(id: Revision) -> GoKineRowOut {
    GoKineRowOut {
        id,
        name: format!("gap-{id}").into_bytes(),
        created: false,
        deleted: true,
        create_revision: 0,
        prev_revision: 0,
        lease: 0,
        value: None,
        old_value: None,
    }
}
