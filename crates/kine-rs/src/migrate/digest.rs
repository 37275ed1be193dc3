//! What `kine-rs migrate` compares between the two stores: a digest of a history (each key's
//! version at its start, then every change after it, with all their fields) read through the
//! `Backend` trait, so two stores that hold the same history have the same digest whatever
//! their datastore.

use anyhow::Result;
use kine_core::backend::Backend;
use kine_core::pages::Pager;
use kine_core::{EventKind, KeyRange, KeyValue, Revision};
use sha2::{Digest, Sha256};

/// Revisions of history read per request.
const WINDOW: Revision = 10_000;

fn kv(sha: &mut Sha256, kv: &KeyValue) {
    sha.update((kv.key.len() as u64).to_be_bytes());
    sha.update(&kv.key);
    for n in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
        sha.update(n.to_be_bytes());
    }
    sha.update((kv.value.len() as u64).to_be_bytes());
    sha.update(&kv.value);
}

/// The history of `range` from `from` to `to`: the keys at `from` (none when `from` < 2), then
/// every change in `(from, to]`. Returns the sha256 and the number of versions read.
pub async fn history(backend: &dyn Backend, range: &KeyRange, from: Revision, to: Revision) -> Result<([u8; 32], u64)> {
    let mut sha = Sha256::new();
    let mut versions = 0;
    if from >= 2 {
        let mut keys = Pager::new(backend, range.clone(), from);
        while let Some(k) = keys.next().await? {
            kv(&mut sha, &k);
            versions += 1;
        }
    }
    sha.update(b"events");
    let mut after = from.max(1);
    while after < to {
        let until = (after + WINDOW).min(to);
        for changes in backend.events(range, after, until).await.map_err(|e| anyhow::anyhow!("{e}"))? {
            sha.update(changes.revision.to_be_bytes());
            for e in &changes.events {
                sha.update([u8::from(e.kind == EventKind::Put)]);
                kv(&mut sha, &e.kv);
                versions += 1;
            }
        }
        after = until;
    }
    Ok((sha.finalize().into(), versions))
}
