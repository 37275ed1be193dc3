//! S3 that answers with errors (500 InternalError, 503 SlowDown) for every request, through a
//! proxy in front of a real S3-compatible server (versitygw): a node refuses to start with the
//! status named; a writer (`--s3-sync`) fails writes with etcd's timeout while it lasts, loses
//! nothing and ships everything once S3 answers again; errors past the writer lock's lease make
//! it stop.

mod common;
use common::s3::*;
use common::*;
use kine_testkit::proxy::Proxy;
use kine_testkit::s3::S3Server;
use std::time::{Duration, Instant};

/// The flags of a node on `folder` that reaches S3 through `proxy`, with a lease of `lease`.
fn through(server: &S3Server, proxy: &Proxy, folder: &str, lease: &str) -> Vec<String> {
    let mut args = s3_args(server, folder);
    let endpoint = args.iter().position(|a| a == "--s3-endpoint").unwrap();
    args[endpoint + 1] = format!("http://127.0.0.1:{}", proxy.port);
    let l = args.iter().position(|a| a == "--s3-lock-lease").unwrap();
    args[l + 1] = lease.into();
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_answering_errors_fails_writes_cleanly_and_loses_nothing() {
    let server = S3Server::start(&["kine"]);
    let proxy = Proxy::start(server.port);
    let s3 = through(&server, &proxy, "errors", "10s");
    let (dir, restored, never) = (TempDir::new("s3-err"), TempDir::new("s3-err-restored"), TempDir::new("s3-err-no"));

    // At start: refused, naming the flag and S3's answer.
    proxy.answer_with(503);
    let err = refused(never.path(), &s3, &[]);
    assert!(err.contains("--s3-bucket") && (err.contains("503") || err.contains("SlowDown")), "{err}");
    proxy.forward();

    let node = start(dir.path(), &s3, &["--s3-sync", "--request-timeout", "2s"]);
    let mut c = node.client().await;
    c.put("/a", "1", None).await.unwrap();
    for status in [503, 500] {
        proxy.answer_with(status);
        let began = Instant::now();
        let err = c.put(format!("/during-{status}"), "x", None).await.unwrap_err().to_string();
        assert!(err.contains("request timed out"), "{status}: {err}");
        assert!(began.elapsed() < Duration::from_secs(4), "{status}: {:?}", began.elapsed());
        proxy.forward();
        // Shipping resumes: a write is acknowledged again within a few ship intervals (the
        // SDK's retries of the failed upload included).
        let (_, took) = until_served("a write once S3 answers", Duration::from_secs(30), || {
            let mut c = c.clone();
            async move { c.put(format!("/after-{status}"), "y", None).await }
        })
        .await;
        println!("S3-ERRORS {status}: writes acknowledged again {took:?} after S3 answered");
    }
    let before = everything(&mut c).await;
    assert_eq!(before.1.len(), 5, "the writes that timed out were committed locally: {before:?}");
    drop(c);
    node.signal("KILL");
    drop(node);

    // Everything, the timed-out writes included, is in S3.
    let node = start_writing(restored.path(), &s3, &[]);
    assert_eq!(everything(&mut node.client().await).await, before, "{}", node.log());

    // Errors past the lease (10 s): the writer stops, naming the lock.
    proxy.answer_with(500);
    let mut node = node;
    let status = node.stop_by_itself(Duration::from_secs(30)).await;
    proxy.forward();
    assert!(!status.success(), "{}", node.log());
    assert!(node.log().contains("S3 writer lock was not renewed within its lease"), "{}", node.log());
}
