//! A NATS bucket as the target: a revision is a stream sequence, so versions are written in
//! revision order, each revision of n changes on sequences R-n+1..R (one atomic batch), the
//! sequences between them as fillers (the backend's `WriteOp::Import`, `backend/import.rs`).
//!
//! - The keys at the copy's base revision go in in mod revision order (held in memory
//!   meanwhile), then the target is compacted there, which removes the fillers.
//! - The base: the source's compact revision, unless the history after it holds a revision of
//!   n > 1 changes whose n-1 preceding sequences are taken (by a change, the compact revision,
//!   or the bucket's marker at sequence 1): that history cannot be written, so the copy starts
//!   at the newest such revision (its keys at it, compacted there).
//! - Keys at the base that share a mod revision need the sequences before it free of the other
//!   keys' mod revisions; if not, the copy is refused before anything is written.
//! - An interrupted copy of the keys continues after the target's revision, once the target's
//!   keys are found to be the source's keys at the base up to that revision.

use super::progress::Progress;
use super::{BATCH, BATCH_BYTES, WINDOW, count, e, same_history};
use anyhow::{Context, Result, bail};
use kine_core::backend::{Backend, Revisions};
use kine_core::pages::Pager;
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Event, EventKind, KeyRange, KeyValue, Revision};

/// Brings the target to where the history is copied from: the keys at the base written and
/// compacted there, or an earlier copy's history checked (the rest of `copy` goes on as for
/// any target).
pub(super) async fn prepare(
    source: &dyn Backend,
    target: &dyn Backend,
    s: Revisions,
    current_only: bool,
) -> Result<()> {
    let t = target.revisions().await.map_err(e)?;
    if t.current > s.current {
        bail!(
            "--to is at revision {}, past --from's {}: it holds another store (migrate writes into an empty datastore, \
             or continues its own earlier copy)",
            t.current,
            s.current
        );
    }
    let base = if current_only { s.current } else { choose_base(source, s).await? };
    if base >= 2 && t.compacted < base && t.current <= base {
        return copy_keys(source, target, base).await;
    }
    if t.current == 1 {
        if count(source, 1).await? > 0 {
            bail!(
                "--from changed keys at revision 1 (a Go kine bucket's first message?): NATS keeps sequence 1 for the \
                 bucket's marker; copy with --current-only, or into SQLite, PostgreSQL or MySQL"
            );
        }
        return Ok(());
    }
    // An earlier copy's history: the rest must fit after it.
    let from = s.compacted.max(t.compacted);
    if from > t.current {
        bail!(
            "--from was compacted at revision {}, past what --to holds (revision {}): the copy cannot continue; start \
             again with an empty --to",
            s.compacted,
            t.current
        );
    }
    if !same_history(source, target, &KeyRange::all(), from, t.current).await? {
        bail!(
            "--to's history up to revision {} differs from --from's: it holds another store (migrate writes into an \
             empty datastore, or continues its own earlier copy)",
            t.current
        );
    }
    if let Some((revision, n)) = misfit(source, t.current, s.current).await? {
        bail!(
            "--from's revision {revision} changed {n} keys, which NATS stores on sequences {}..{revision}, taken by \
             what --to holds already (up to revision {}): start again with an empty --to (the copy then starts at \
             that revision)",
            revision - n as Revision + 1,
            t.current
        );
    }
    tracing::info!(revision = t.current, "--to holds a copy of --from up to this revision; continuing");
    Ok(())
}

/// The newest revision after `after` (up to `until`) whose changes do not fit after the
/// revision before them, with how many changes it has. Sequence `after` is taken (changes at
/// revision 1 are not looked at: `prepare` refuses them).
pub(super) async fn misfit(
    source: &dyn Backend,
    after: Revision,
    until: Revision,
) -> Result<Option<(Revision, usize)>> {
    let (mut found, mut taken, mut from) = (None, after.max(1), after.max(1));
    while from < until {
        let to = (from + WINDOW).min(until);
        for change in source.events(&KeyRange::all(), from, to).await.map_err(e)? {
            let n = change.events.len();
            if change.revision - (n as Revision) < taken {
                found = Some((change.revision, n));
            }
            taken = change.revision;
        }
        from = to;
    }
    Ok(found)
}

/// Where a copy into NATS starts: `compacted`, or the newest revision after it that does not
/// fit (logged with the reason).
pub(super) async fn choose_base(source: &dyn Backend, s: Revisions) -> Result<Revision> {
    let Some((revision, n)) = misfit(source, s.compacted, s.current).await? else { return Ok(s.compacted) };
    tracing::info!(
        revision,
        changes = n,
        compact_revision = s.compacted,
        "NATS stores a revision of n changes on the n stream sequences ending at it, and the ones before this \
         revision are taken: the history is copied from this revision on (--to holds the keys at it, compacted there)"
    );
    Ok(revision)
}

/// The keys at `base` (held in memory), grouped by mod revision (ascending), keys in key order
/// within a group; refused, naming the keys, if a group does not fit after the one before it.
pub(super) async fn plan(source: &dyn Backend, base: Revision) -> Result<Vec<(Revision, Vec<KeyValue>)>> {
    let mut sorted = Vec::new();
    let mut keys = Pager::new(source, KeyRange::all(), base);
    while let Some(kv) = keys.next().await? {
        sorted.push(kv);
    }
    // Stable: key order within a mod revision.
    sorted.sort_by_key(|kv| kv.mod_revision);
    let mut groups: Vec<(Revision, Vec<KeyValue>)> = Vec::new();
    for kv in sorted {
        match groups.last_mut() {
            Some((rev, g)) if *rev == kv.mod_revision => g.push(kv),
            _ => groups.push((kv.mod_revision, vec![kv])),
        }
    }
    let shown = |kv: &KeyValue| format!("{:?}", String::from_utf8_lossy(&kv.key));
    for (i, (rev, group)) in groups.iter().enumerate() {
        let n = group.len() as Revision;
        let before = if i == 0 { None } else { Some(&groups[i - 1]) };
        let taken = before.map_or(1, |(r, _)| *r);
        if rev - n < taken {
            let names: Vec<String> = group.iter().take(5).map(shown).collect();
            let why = match before {
                None => "sequence 1 is the bucket's marker".to_string(),
                Some((r, g)) => format!("key {} has mod revision {r}", shown(&g[0])),
            };
            bail!(
                "--from's keys at revision {base} {}{} share mod revision {rev}: NATS stores them on the {n} stream \
                 sequences ending at {rev}, and {why}; this store cannot be written into NATS with its revisions \
                 (nothing was written)",
                names.join(", "),
                if group.len() > 5 { format!(" and {} more", group.len() - 5) } else { String::new() },
            );
        }
    }
    Ok(groups)
}

/// Copies the keys at `base` into `target` (from the target's revision on, after checking
/// what it holds), fills up to `base` and compacts there.
pub(super) async fn copy_keys(source: &dyn Backend, target: &dyn Backend, base: Revision) -> Result<()> {
    let groups = plan(source, base).await?;
    let t = target.revisions().await.map_err(e)?;
    if t.current > 1 {
        let mut copied: Vec<&KeyValue> =
            groups.iter().filter(|(rev, _)| *rev <= t.current).flat_map(|(_, g)| g.iter()).collect();
        copied.sort_by(|a, b| a.key.cmp(&b.key));
        same_keys(target, t.current, copied.into_iter(), base).await?;
        tracing::info!(revision = t.current, base, "continuing an earlier copy of the keys");
    }
    let todo: Vec<_> = groups.into_iter().filter(|(rev, _)| *rev > t.current).collect();
    let total = todo.iter().map(|(_, g)| g.len() as u64).sum();
    let mut progress = Progress::new("copying the keys", "keys", total);
    let (mut versions, mut bytes, mut upto) = (Vec::new(), 0, t.current);
    let mut todo = todo.into_iter().peekable();
    while let Some((rev, group)) = todo.next() {
        for (sub, kv) in group.into_iter().enumerate() {
            bytes += kv.key.len() + kv.value.len();
            versions.push(ImportedVersion {
                revision: rev,
                sub,
                event: Event { kind: EventKind::Put, kv, prev_kv: None },
            });
        }
        upto = rev;
        if versions.len() >= BATCH || bytes >= BATCH_BYTES || todo.peek().is_none() {
            let n = versions.len() as u64;
            let import = Import {
                versions: std::mem::take(&mut versions),
                revision: upto,
                add_leases: vec![],
                remove_leases: vec![],
            };
            target.write(WriteOp::Import(import)).await.map_err(e).context("write into --to")?;
            bytes = 0;
            progress.advance(n);
        }
    }
    progress.finish();
    if upto < base {
        let import = Import { versions: vec![], revision: base, add_leases: vec![], remove_leases: vec![] };
        target.write(WriteOp::Import(import)).await.map_err(e).context("write into --to")?;
    }
    target.compact(base).await.map_err(e).context("set --to's compact revision")?;
    Ok(())
}

/// The target's keys at `revision` are `want` (in key order), each with its revisions.
async fn same_keys<'a>(
    target: &dyn Backend,
    revision: Revision,
    want: impl Iterator<Item = &'a KeyValue>,
    base: Revision,
) -> Result<()> {
    let mut have = Pager::new(target, KeyRange::all(), revision);
    let mut want = want.peekable();
    loop {
        match (have.next().await?, want.next()) {
            (None, None) => return Ok(()),
            (Some(h), Some(w)) if &h == w => {}
            (h, w) => {
                let key = h.or(w.cloned()).map(|kv| String::from_utf8_lossy(&kv.key).into_owned()).unwrap_or_default();
                bail!(
                    "--to is at revision {revision} and its keys are not --from's keys at revision {base} up to it (key \
                     {key:?} differs): it holds another store, or a copy started at another revision; start again with \
                     an empty --to"
                );
            }
        }
    }
}
