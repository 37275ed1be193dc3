//! Shipping a SQLite store's history to a real S3-compatible server (versitygw) and restoring it
//! into new SQLite stores: from the segments alone, from a checkpoint and the segments after
//! it, and up to a past revision; every restored store is compared with the original at every
//! revision it holds. Damaged or missing objects stop a restore with their names. A store that
//! never held anything restores without a late segment skipped.

use bytes::Bytes;
use kine_core::backend::Backend;
use kine_core::request::RangeRequest;
use kine_core::{KeyRange, KeyValue, Revision};
use kine_durable::manifest::{self, Manifest};
use kine_durable::restore::restore;
use kine_durable::ship::Shipper;
use kine_durable::{checkpoint, segment};
mod common;
use common::store;
use kine_testkit::s3::S3Server;
use kine_testkit::{TempDir, memory, model, sqlite};
use std::collections::BTreeMap;

async fn keys_at(s: &dyn Backend, revision: Revision) -> Vec<KeyValue> {
    let mut req = RangeRequest::new(KeyRange::all());
    req.revision = revision;
    s.range(req).await.unwrap().value.kvs
}

/// The keys at every revision of the run, read right after it was made (later compactions do
/// not take them away from the comparison).
type Seen = BTreeMap<Revision, Vec<KeyValue>>;

/// `restored` holds the keys `seen` at each revision it holds, up to `to`; the events it holds
/// are the original's (`from` on, where both still have them), and the leases too if `leases`.
async fn same(original: &dyn Backend, restored: &dyn Backend, seen: &Seen, to: Revision, leases: bool) {
    let r = restored.revisions().await.unwrap();
    assert_eq!(r.current, to);
    for rev in r.compacted.max(1)..=to {
        assert_eq!(&keys_at(restored, rev).await, &seen[&rev], "the keys at revision {rev}");
    }
    let from = r.compacted.max(original.revisions().await.unwrap().compacted).max(1);
    if from < to {
        let all = KeyRange::all();
        let (x, y) = (original.events(&all, from, to).await.unwrap(), restored.events(&all, from, to).await.unwrap());
        assert_eq!(x, y, "the events after {from} up to {to}");
    }
    if leases {
        let (mut x, mut y) = (original.leases().await.unwrap(), restored.leases().await.unwrap());
        x.sort();
        y.sort();
        assert_eq!(x, y, "the leases");
        let (x, y) = (original.auth_record().await.unwrap(), restored.auth_record().await.unwrap());
        assert_eq!(x.map(|r| r.data), y.map(|r| r.data), "the auth record");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shipped_store_restores_whole_from_a_checkpoint_and_to_a_past_revision() {
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "store").await;
    let dir = TempDir::new("ship");
    let source = sqlite(&dir.path().join("source"));
    let oracle = memory();
    manifest::write(s3.as_ref(), &Manifest::new(7, 1), None).await.unwrap().expect("a new manifest");
    let start = Shipper::state(source.as_ref()).await.unwrap();
    let mut shipper = Shipper::new(s3.clone(), source.clone(), 1, start);

    // Random operations (puts, deletes, Txns changing several keys, leases, compactions), one
    // segment after each that wrote; a checkpoint halfway.
    let seed = kine_core::id::random_u64();
    eprintln!("seed {seed}");
    let mut seen = Seen::new();
    seen.insert(1, vec![]);
    let mut halfway = None;
    for step in 0..400u64 {
        model::run(seed.wrapping_add(step), 1, source.clone(), oracle.clone()).await;
        let current = source.revisions().await.unwrap().current;
        for rev in seen.len() as Revision + 1..=current {
            seen.insert(rev, keys_at(source.as_ref(), rev).await);
        }
        if step % 150 == 100 {
            // Users and roles (opaque to the backend): one change before the checkpoint, one after.
            let version = source.auth_record().await.unwrap().map(|r| r.version);
            let mut state = kine_core::auth::state::AuthState::new(vec![step as u8; 32]);
            state.roles.insert(format!("role-{step}"), Default::default());
            assert!(source.auth_replace(version, state.encode()).await.unwrap());
        }
        shipper.ship().await.unwrap_or_else(|e| panic!("seed {seed} step {step}: {e:#}"));
        if step == 200 {
            // Restored from the segments alone, everything since the first revision.
            let restored = sqlite(&dir.path().join("segments"));
            restore(s3.as_ref(), restored.as_ref(), None).await.unwrap();
            assert_eq!(restored.revisions().await.unwrap(), source.revisions().await.unwrap());
            same(source.as_ref(), restored.as_ref(), &seen, current, true).await;

            let position = shipper.position().clone();
            let cp = checkpoint::write(s3.as_ref(), source.as_ref(), 1, &position).await.unwrap();
            let (mut m, etag) = manifest::read(s3.as_ref(), Some(7)).await.unwrap().unwrap();
            (m.checkpoint, m.shipped) = (Some(cp), position.revision);
            manifest::write(s3.as_ref(), &m, Some(&etag)).await.unwrap().expect("the manifest moved");
            halfway = Some(position.revision);
        }
    }
    let (halfway, now) = (halfway.unwrap(), source.revisions().await.unwrap().current);
    assert_eq!(shipper.position().revision, now);

    // From the checkpoint and the segments after it.
    let whole = sqlite(&dir.path().join("whole"));
    let r = restore(s3.as_ref(), whole.as_ref(), None).await.unwrap();
    assert_eq!((r.checkpoint, r.revision), (Some(halfway), now));
    let compacted = whole.revisions().await.unwrap().compacted;
    assert!(compacted >= halfway, "restored from the checkpoint: compacted at {compacted}");
    same(source.as_ref(), whole.as_ref(), &seen, now, true).await;

    // Up to a revision between the checkpoint and now.
    let past = halfway + (now - halfway) / 2;
    let earlier = sqlite(&dir.path().join("earlier"));
    let r = restore(s3.as_ref(), earlier.as_ref(), Some(past)).await.unwrap();
    assert_eq!(r.revision, past);
    same(source.as_ref(), earlier.as_ref(), &seen, past, false).await;
    let err = restore(s3.as_ref(), sqlite(&dir.path().join("before")).as_ref(), Some(halfway - 1)).await.unwrap_err();
    assert!(err.to_string().contains("before the oldest checkpoint kept"), "{err}");
    let err = restore(s3.as_ref(), sqlite(&dir.path().join("future")).as_ref(), Some(now + 5)).await.unwrap_err();
    assert!(err.to_string().contains("was never shipped"), "{err}");
    let err = restore(s3.as_ref(), whole.as_ref(), None).await.unwrap_err();
    assert!(err.to_string().contains("it must be empty"), "{err}");

    // A damaged segment, then a missing one, stop the restore and are named.
    let names: Vec<String> = s3.list("wal/").await.unwrap();
    let victim = names.iter().rev().nth(3).unwrap().clone();
    let body = s3.get(&victim).await.unwrap().unwrap().body;
    let mut damaged = body.to_vec();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 1;
    s3.put(&victim, Bytes::from(damaged)).await.unwrap();
    let err = restore(s3.as_ref(), sqlite(&dir.path().join("damaged")).as_ref(), None).await.unwrap_err();
    assert!(err.to_string().contains(&victim), "{err}");
    s3.delete(&victim).await.unwrap();
    let err = restore(s3.as_ref(), sqlite(&dir.path().join("missing")).as_ref(), None).await.unwrap_err();
    assert!(err.to_string().contains("are missing"), "{err}");
    assert!(segment::parse_name(&victim).is_some());
}

#[tokio::test]
async fn a_prefix_without_a_store_is_refused() {
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "empty").await;
    let dir = TempDir::new("ship-empty");
    let err = restore(s3.as_ref(), sqlite(&dir.path().join("x")).as_ref(), None).await.unwrap_err();
    assert!(err.to_string().contains("no kine-rs store here"), "{err}");
}

/// Each writer's first segment of its term carries no revision when the store holds nothing
/// (only its lease table, reset): a later restore skips the older term's as superseded, but
/// counts (and warns of) no late upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_held_anything_restores_without_a_late_segment() {
    use kine_durable::node::{self, Options};
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "nothing").await;
    let dir = TempDir::new("ship-nothing");
    let options = Options {
        ship_interval: std::time::Duration::from_millis(50),
        checkpoint_interval: std::time::Duration::from_secs(3600),
        checkpoint_segments: 10_000,
        lease: std::time::Duration::from_secs(2),
        node: "n".into(),
        address: "http://n:2379".into(),
        read_wait: std::time::Duration::from_secs(7),
    };
    for term in 1..=2u64 {
        let started =
            node::start(s3.clone(), common::local(&dir.path().join(format!("t{term}"))), &options).await.unwrap();
        // A clean stop ships what is left (the term's first segment) and releases the lock.
        started.runner.run(async {}).await.unwrap();
        assert!(s3.get(&segment::object_name(term, 1)).await.unwrap().is_some(), "term {term} shipped nothing");
    }
    let restored = sqlite(&dir.path().join("restored"));
    let r = restore(s3.as_ref(), restored.as_ref(), None).await.unwrap();
    assert_eq!((r.revision, r.zombies), (1, 0), "{r:?}");
}

/// The real server, with a listing that leaves one object out (as versitygw's did for a segment
/// created while a follower listed the folder, with a later one shown).
struct Forgetful {
    real: std::sync::Arc<dyn kine_objstore::ObjectStore>,
    hidden: String,
}

#[async_trait::async_trait]
impl kine_objstore::ObjectStore for Forgetful {
    async fn get(&self, key: &str) -> anyhow::Result<Option<kine_objstore::Object>> {
        self.real.get(key).await
    }
    async fn put(&self, key: &str, body: Bytes) -> anyhow::Result<String> {
        self.real.put(key, body).await
    }
    async fn put_if_absent(&self, key: &str, body: Bytes) -> anyhow::Result<Option<String>> {
        self.real.put_if_absent(key, body).await
    }
    async fn put_if_match(&self, key: &str, body: Bytes, etag: &str) -> anyhow::Result<Option<String>> {
        self.real.put_if_match(key, body, etag).await
    }
    async fn list(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        Ok(self.real.list(prefix).await?.into_iter().filter(|n| *n != self.hidden).collect())
    }
    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.real.delete(key).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_a_listing_leaves_out_is_read_by_name() {
    use kine_objstore::ObjectStore;
    let server = S3Server::start(&["kine"]);
    let s3 = store(&server, "forgetful").await;
    let dir = TempDir::new("ship-forgetful");
    let source = sqlite(&dir.path().join("source"));
    manifest::write(s3.as_ref(), &Manifest::new(7, 1), None).await.unwrap().expect("a new manifest");
    let mut shipper = Shipper::new(s3.clone(), source.clone(), 1, Shipper::state(source.as_ref()).await.unwrap());
    for i in 0..6 {
        let put = kine_core::request::PutRequest {
            key: format!("/k/{i}").into(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        let txn = kine_core::request::TxnRequest {
            compare: vec![],
            success: vec![kine_core::request::RequestOp::Put(put)],
            failure: vec![],
        };
        source.write(kine_core::txn::WriteOp::Txn(txn)).await.unwrap();
        shipper.ship().await.unwrap().expect("a segment");
    }
    let forgetful = Forgetful { real: s3.clone(), hidden: segment::object_name(1, 3) };
    assert!(!forgetful.list("wal/").await.unwrap().contains(&segment::object_name(1, 3)));
    let restored = sqlite(&dir.path().join("restored"));
    let r = restore(&forgetful, restored.as_ref(), None).await.unwrap();
    assert_eq!((r.revision, r.segments), (7, 6), "{r:?}");
    assert_eq!(keys_at(restored.as_ref(), 7).await, keys_at(source.as_ref(), 7).await);

    // One that is not there at all is missing, and named.
    s3.delete(&segment::object_name(1, 3)).await.unwrap();
    let err = restore(&forgetful, sqlite(&dir.path().join("gap")).as_ref(), None).await.unwrap_err().to_string();
    assert!(err.contains(&format!("{} is missing", segment::object_name(1, 3))), "{err}");
}
