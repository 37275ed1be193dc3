//! The manifest against a real S3-compatible server (versitygw): created once, moved by one of
//! two writers holding the same version, and a foreign or another store's manifest refused.

use bytes::Bytes;
use kine_durable::manifest::{self, Checkpoint, Manifest};
mod common;
use common::store;
use kine_testkit::s3::S3Server;

#[tokio::test]
async fn one_writer_moves_the_manifest_and_strangers_are_refused() {
    let server = S3Server::start(&["kine"]);
    let s = store(&server, "a").await;
    let s = s.as_ref();
    assert_eq!(manifest::read(s, Some(7)).await.unwrap(), None);
    let first = Manifest::new(7, 1);
    let etag = manifest::write(s, &first, None).await.unwrap().expect("created");
    assert_eq!(manifest::write(s, &first, None).await.unwrap(), None, "created once");
    let (read, read_etag) = manifest::read(s, Some(7)).await.unwrap().unwrap();
    assert_eq!((read, read_etag.as_str()), (first.clone(), etag.as_str()));

    // Two writers from the same version: one moves it.
    let mut a = first.clone();
    let object = manifest::checkpoint_object(1, 100);
    a.checkpoint = Some(Checkpoint { object, revision: 100, sha256: "aa".into(), parts: 1, after_segment: (1, 4) });
    a.shipped = 120;
    let mut b = first.clone();
    b.term = 2;
    assert!(manifest::write(s, &a, Some(&etag)).await.unwrap().is_some());
    assert_eq!(manifest::write(s, &b, Some(&etag)).await.unwrap(), None);
    assert_eq!(manifest::read(s, None).await.unwrap().unwrap().0, a);

    // Another store's manifest, and another program's object, are refused.
    let err = manifest::read(s, Some(8)).await.unwrap_err().to_string();
    assert!(err.contains("the prefix holds another store (cluster id 7"), "{err}");
    let foreign = store(&server, "b").await;
    let foreign = foreign.as_ref();
    foreign.put("manifest", Bytes::from_static(b"{\"version\": 3}")).await.unwrap();
    let err = manifest::read(foreign, None).await.unwrap_err().to_string();
    assert!(err.contains("is not a kine-rs manifest"), "{err}");
    assert_eq!(manifest::checkpoint_object(1, 100), "checkpoint/0000000001/00000000000000000100/");
}
