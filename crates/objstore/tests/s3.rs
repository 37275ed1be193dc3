//! The S3 object store against a real S3-compatible server (versitygw): plain and conditional
//! puts (one winner among racing writers), gets, lists under the folder, deletes, and clear
//! errors for wrong credentials and a missing bucket; HTTPS with a private CA.

use bytes::Bytes;
use kine_objstore::{ObjectStore, S3Config, S3Store, StaticKeys};
use kine_testkit::s3::{ACCESS_KEY, REGION, S3Server, SECRET_KEY};
use std::sync::Arc;

fn config(server: &S3Server, bucket: &str, folder: &str) -> S3Config {
    S3Config {
        bucket: bucket.into(),
        folder: folder.into(),
        endpoint: Some(server.endpoint()),
        region: REGION.into(),
        keys: Some(StaticKeys::new(ACCESS_KEY, SECRET_KEY)),
        ca_bundle: None,
    }
}

#[tokio::test]
async fn objects_are_written_read_listed_and_deleted_under_the_folder() {
    let server = S3Server::start(&["kine"]);
    let store = S3Store::connect(&config(&server, "kine", "cluster-a")).await.unwrap();
    assert_eq!(store.get("manifest").await.unwrap(), None);
    let etag = store.put("wal/0000000001/00000000000000000002", Bytes::from_static(b"segment")).await.unwrap();
    let got = store.get("wal/0000000001/00000000000000000002").await.unwrap().expect("written");
    assert_eq!((got.body.as_ref(), got.etag.as_str()), (&b"segment"[..], etag.as_str()));
    store.put("wal/0000000001/00000000000000000010", Bytes::from_static(b"next")).await.unwrap();
    store.put("checkpoint/0000000001/00000000000000000001.db", Bytes::from_static(b"db")).await.unwrap();
    assert_eq!(
        store.list("wal/").await.unwrap(),
        ["wal/0000000001/00000000000000000002", "wal/0000000001/00000000000000000010"]
    );
    // Another folder of the same bucket sees none of it.
    let other = S3Store::connect(&config(&server, "kine", "cluster-b")).await.unwrap();
    assert!(other.list("").await.unwrap().is_empty());
    store.delete("wal/0000000001/00000000000000000002").await.unwrap();
    store.delete("wal/0000000001/00000000000000000002").await.unwrap();
    assert_eq!(store.list("wal/").await.unwrap(), ["wal/0000000001/00000000000000000010"]);
}

#[tokio::test]
async fn conditional_puts_let_exactly_one_racer_win() {
    let server = S3Server::start(&["kine"]);
    let store = Arc::new(S3Store::connect(&config(&server, "kine", "")).await.unwrap());
    // Create only: of eight racers, one.
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.put_if_absent("leader-lock", Bytes::from(format!("node {i}"))).await })
        })
        .collect();
    let mut won = Vec::new();
    for r in racers {
        if let Some(etag) = r.await.unwrap().unwrap() {
            won.push(etag);
        }
    }
    assert_eq!(won.len(), 1, "one creator");
    let lock = store.get("leader-lock").await.unwrap().unwrap();
    assert_eq!(lock.etag, won[0]);
    // Replace only that version: of eight racers holding its ETag, one; a stale ETag never.
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let (store, etag) = (store.clone(), lock.etag.clone());
            tokio::spawn(async move {
                store.put_if_match("leader-lock", Bytes::from(format!("term 2 node {i}")), &etag).await
            })
        })
        .collect();
    let mut replaced = 0;
    for r in racers {
        replaced += usize::from(r.await.unwrap().unwrap().is_some());
    }
    assert_eq!(replaced, 1, "one replacer");
    assert_eq!(store.put_if_match("leader-lock", Bytes::from_static(b"late"), &lock.etag).await.unwrap(), None);
    assert_eq!(store.put_if_match("missing", Bytes::from_static(b"x"), &lock.etag).await.unwrap(), None);
    assert!(store.get("leader-lock").await.unwrap().unwrap().body.starts_with(b"term 2 node "));
}

#[tokio::test]
async fn wrong_credentials_and_a_missing_bucket_fail_clearly() {
    let server = S3Server::start(&["kine"]);
    let mut wrong = config(&server, "kine", "");
    wrong.keys = Some(StaticKeys::new(ACCESS_KEY, "not-the-secret"));
    let store = S3Store::connect(&wrong).await.unwrap();
    let err = format!("{:#}", store.put("x", Bytes::from_static(b"x")).await.unwrap_err());
    assert!(err.contains("put s3://kine/x") && err.contains("SignatureDoesNotMatch"), "{err}");
    assert!(!err.contains("not-the-secret"), "the secret leaked: {err}");

    let store = S3Store::connect(&config(&server, "missing", "")).await.unwrap();
    let err = format!("{:#}", store.list("").await.unwrap_err());
    assert!(err.contains("list s3://missing/") && err.contains("NoSuchBucket"), "{err}");
}

#[tokio::test]
async fn https_with_a_private_ca_is_trusted_through_the_ca_bundle_only() {
    let certs = kine_testkit::TempDir::new("s3-certs");
    kine_testkit::certs::make_certs(certs.path());
    let server = S3Server::start_tls(&["kine"], &certs.path().join("server.crt"), &certs.path().join("server.key"));
    assert!(server.endpoint().starts_with("https://"));
    let ca = std::fs::read(certs.path().join("ca.crt")).unwrap();

    let mut trusted = config(&server, "kine", "tls");
    trusted.ca_bundle = Some(ca.clone());
    let store = S3Store::connect(&trusted).await.unwrap();
    store.put("o", Bytes::from_static(b"over TLS")).await.unwrap();
    assert_eq!(store.get("o").await.unwrap().unwrap().body.as_ref(), b"over TLS");

    // The system's roots do not know the test CA.
    let store = S3Store::connect(&config(&server, "kine", "tls")).await.unwrap();
    let err = format!("{:#}", store.get("o").await.unwrap_err());
    assert!(err.contains("get s3://kine/tls/o") && err.contains("UnknownIssuer"), "{err}");
    // Nor does a bundle holding another CA (of the same name: its signature does not match).
    let other = kine_testkit::TempDir::new("s3-other-ca");
    kine_testkit::certs::make_certs(other.path());
    let mut wrong = config(&server, "kine", "tls");
    wrong.ca_bundle = Some(std::fs::read(other.path().join("ca.crt")).unwrap());
    let store = S3Store::connect(&wrong).await.unwrap();
    let err = format!("{:#}", store.get("o").await.unwrap_err());
    assert!(err.contains("invalid peer certificate: BadSignature"), "{err}");

    // What is not a bundle of certificates is refused at connect, never at the first request.
    for (bad, why) in [
        (b"".to_vec(), "no certificate"),
        (b"not pem at all".to_vec(), "no certificate"),
        (std::fs::read(certs.path().join("server.key")).unwrap(), "no certificate"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(), "certificate 1"),
        (ca[..ca.len() / 2].to_vec(), "PEM"),
    ] {
        let mut config = config(&server, "kine", "tls");
        config.ca_bundle = Some(bad);
        let err = format!("{:#}", S3Store::connect(&config).await.err().expect("refused"));
        assert!(err.contains("--s3-ca-bundle") && err.contains(why), "{why}: {err}");
    }
}
