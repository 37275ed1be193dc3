//! `--max-response-bytes`: a Range (alone or in a Txn) is assembled 4,096 keys at a time, whole
//! and in order whatever its length, and one whose response would pass the limit fails with
//! gRPC's ResourceExhausted `grpc: trying to send message larger than max (X vs. Y)`, as etcd's
//! server refuses it, instead of being read into memory whole.

mod common;
use common::*;
use etcd_client::*;

const MAX: usize = 300_000;

/// `n` keys `PREFIX%05d` with `value`, 100 puts per Txn.
async fn fill(c: &mut Client, prefix: &str, n: usize, value: &[u8]) {
    for first in (0..n).step_by(100) {
        let puts: Vec<TxnOp> =
            (first..(first + 100).min(n)).map(|i| TxnOp::put(format!("{prefix}{i:05}"), value, None)).collect();
        c.txn(Txn::new().and_then(puts)).await.expect("fill");
    }
}

fn too_large(e: Error) -> String {
    match e {
        Error::GRpcStatus(s) if s.code() == tonic::Code::ResourceExhausted => s.message().to_string(),
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ranges_are_whole_and_too_large_ones_are_refused() {
    let limit = MAX.to_string();
    let (server, _dir) = sqlite_server(&["--max-response-bytes", &limit]);
    let mut c = server.client().await;
    // 5,000 small keys (about 205 kB counted): more than one page, under the limit.
    fill(&mut c, "/s/", 5000, b"v").await;
    let r = c.get("/s/", Some(GetOptions::new().with_prefix())).await.unwrap();
    let keys: Vec<String> = r.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).collect();
    assert_eq!(keys.len(), 5000);
    assert_eq!((r.count(), r.more()), (5000, false));
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "in key order");
    assert_eq!((keys[0].as_str(), keys[4999].as_str()), ("/s/00000", "/s/04999"));
    let r = c.get("/s/", Some(GetOptions::new().with_prefix().with_limit(4500))).await.unwrap();
    assert_eq!((r.kvs().len(), r.count(), r.more()), (4500, 5000, true));
    assert_eq!(r.kvs()[4499].key(), b"/s/04499");
    let r = c
        .get("/s/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Descend)))
        .await
        .unwrap();
    assert_eq!((r.kvs().len(), r.kvs()[0].key()), (5000, b"/s/04999".as_slice()));

    // Ten values of 40 kB: 400 kB, over the limit.
    fill(&mut c, "/big/", 10, &[b'x'; 40_000]).await;
    let message = too_large(c.get("/big/", Some(GetOptions::new().with_prefix())).await.unwrap_err());
    assert!(
        message.starts_with("grpc: trying to send message larger than max (")
            && message.ends_with(&format!(" vs. {MAX})")),
        "{message}"
    );
    let inside = Txn::new().and_then([TxnOp::get("/big/", Some(GetOptions::new().with_prefix()))]);
    let message = too_large(c.txn(inside).await.unwrap_err());
    assert!(message.starts_with("grpc: trying to send message larger than max ("), "{message}");
    // Within the limit: a page of them, and every key without values.
    let r = c.get("/big/", Some(GetOptions::new().with_prefix().with_limit(2))).await.unwrap();
    assert_eq!((r.kvs().len(), r.count(), r.more()), (2, 10, true));
    let r = c.get("/big/", Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    assert_eq!(r.kvs().len(), 10);
    // The server goes on serving.
    c.put("/after", "ok", None).await.unwrap();
}

#[test]
fn the_limit_is_checked_at_start() {
    for bad in ["0", "2147483648", "lots"] {
        let out = std::process::Command::new(BIN).args(["--max-response-bytes", bad]).output().unwrap();
        assert!(!out.status.success(), "--max-response-bytes {bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--max-response-bytes"), "{err}");
    }
}
