//! `WriteOp::Import` on `nats://` against a real nats-server: versions land on the stream
//! sequences equal to their revisions (a revision of several changes as one batch ending at
//! it), fillers in between; compaction removes the fillers at or below the compact revision;
//! another process loads the same store; a revision that does not fit is refused.

use kine_backend_nats::{NatsBackend, NatsOptions};
use kine_core::backend::{Backend, Revisions};
use kine_core::request::RangeRequest;
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Error, Event, EventKind, KeyRange, KeyValue, Revision};
use kine_testkit::nats::NatsServer;
use std::sync::Arc;

async fn open(server: &NatsServer, bucket: &str) -> Arc<dyn Backend> {
    let endpoint = format!("{}?bucket={bucket}", server.url());
    let config = kine_backend_nats::config::parse(&endpoint, |_| Ok(std::time::Duration::from_millis(500))).unwrap();
    Arc::new(NatsBackend::open(NatsOptions::new(config)).await.expect("open nats backend"))
}

fn put(revision: Revision, sub: usize, key: &str, create: Revision, version: i64) -> ImportedVersion {
    let kv = KeyValue {
        key: key.into(),
        create_revision: create,
        mod_revision: revision,
        version,
        value: format!("{key}@{revision}").into_bytes(),
        lease: 0,
    };
    ImportedVersion { revision, sub, event: Event { kind: EventKind::Put, kv, prev_kv: None } }
}

fn import(versions: Vec<ImportedVersion>, revision: Revision) -> WriteOp {
    WriteOp::Import(Import { versions, revision, add_leases: vec![], remove_leases: vec![] })
}

async fn keys(b: &dyn Backend, revision: Revision) -> Vec<(String, Revision, Revision, i64)> {
    let req = RangeRequest { revision, ..RangeRequest::new(KeyRange::all()) };
    let kvs = b.range(req).await.unwrap().value.kvs;
    kvs.into_iter()
        .map(|kv| (String::from_utf8(kv.key).unwrap(), kv.create_revision, kv.mod_revision, kv.version))
        .collect()
}

/// Sequences of the stream's fillers.
async fn fillers(server: &NatsServer, bucket: &str) -> Vec<u64> {
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(format!("KV_{bucket}")).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut found = Vec::new();
    for seq in 1..=last {
        if let Ok(m) = stream.get_raw_message(seq).await
            && m.subject.as_str() == format!("$KV.{bucket}.~fill")
        {
            found.push(seq);
        }
    }
    found
}

#[tokio::test]
async fn imported_versions_keep_their_revisions() {
    let server = NatsServer::start();
    let b = open(&server, "imported").await;
    // a created at 4, b and c at 7 (one revision of two changes: sequences 6 and 7), a again
    // at 9, the store's revision 12.
    let versions = vec![put(7, 1, "c", 7, 1), put(4, 0, "a", 4, 1), put(7, 0, "b", 7, 1), put(9, 0, "a", 4, 2)];
    let done = b.write(import(versions, 12)).await.unwrap();
    assert_eq!(done.revision, 12);
    assert_eq!(b.revisions().await.unwrap(), Revisions { current: 12, compacted: -1 });
    assert_eq!(
        keys(b.as_ref(), 7).await,
        [("a".to_string(), 4, 4, 1), ("b".to_string(), 7, 7, 1), ("c".to_string(), 7, 7, 1)]
    );
    assert_eq!(keys(b.as_ref(), 0).await[0], ("a".to_string(), 4, 9, 2));
    assert!(keys(b.as_ref(), 5).await.len() == 1 && keys(b.as_ref(), 6).await.len() == 1, "6 is the batch's first");
    let changes = b.events(&KeyRange::all(), 1, 12).await.unwrap();
    assert_eq!(changes.iter().map(|c| (c.revision, c.events.len())).collect::<Vec<_>>(), [(4, 1), (7, 2), (9, 1)]);
    assert_eq!(fillers(&server, "imported").await, [2, 3, 5, 8, 10, 11, 12]);

    // Does not fit: revision 13 with two changes needs sequence 12.
    let refused = b.write(import(vec![put(13, 0, "x", 13, 1), put(13, 1, "y", 13, 1)], 13)).await;
    let Err(Error::InvalidArgument(text)) = refused else { panic!("{refused:?}") };
    assert!(text.contains("revision 13 changed 2 key(s); NATS stores them on sequences 12..=13"), "{text}");
    assert!(text.contains("the stream is at 12"), "{text}");

    // Compaction removes the fillers at or below it; the stream's last message stays.
    b.compact(12).await.unwrap();
    assert_eq!(fillers(&server, "imported").await, [12]);
    b.close().await;

    // Another process loads the same store.
    let b = open(&server, "imported").await;
    assert_eq!(b.revisions().await.unwrap(), Revisions { current: 12, compacted: 12 });
    assert_eq!(
        keys(b.as_ref(), 0).await,
        [("a".to_string(), 4, 9, 2), ("b".to_string(), 7, 7, 1), ("c".to_string(), 7, 7, 1)]
    );
    let s = kine_testkit::contract::store(b.clone()).await;
    assert_eq!(kine_testkit::contract::put(&s, "a", "next").await, 13);
}

/// A bucket that keeps a limited history per key would drop fillers: refused.
#[tokio::test]
async fn a_bucket_with_a_per_key_limit_takes_no_import() {
    let server = NatsServer::start();
    let b = open(&server, "limited&revHistory=5").await;
    let refused = b.write(import(vec![put(4, 0, "a", 4, 1)], 4)).await;
    let Err(Error::Unsupported(text)) = refused else { panic!("{refused:?}") };
    assert!(text.contains("max_msgs_per_subject"), "{text}");
    assert_eq!(b.revisions().await.unwrap().current, 1, "nothing written");
}
