//! `KV.RangeStream` (etcd 3.7) over gRPC with the etcd-client crate: parts that add up to the
//! Range, etcd's errors, the gRPC metrics of a server stream, and nothing left running on the
//! server after many streams that clients cancelled or left unread (writers never wait for
//! them). Every backend's parts are checked by `contract::range_stream_parts_are_the_range`.

mod common;
use common::*;
use etcd_client::*;
use kine_testkit::nats::free_port;
use std::time::{Duration, Instant};

/// Every message of a RangeStream.
async fn stream(c: &mut Client, key: &str, opts: Option<GetOptions>) -> Result<Vec<GetResponse>, Error> {
    let mut s = c.kv_client().get_stream(key, opts).await?;
    let mut parts = Vec::new();
    while let Some(p) = s.message().await? {
        parts.push(p);
    }
    Ok(parts)
}

fn code(e: Error) -> (tonic::Code, String) {
    match e {
        Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

async fn metric(port: u16, line_start: &str) -> f64 {
    let (_, text) = http_get(port, "/metrics", None).await;
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_add_up_to_the_range_and_errors_are_etcds() {
    let metrics = free_port();
    let (server, _dir) = sqlite_server(&["--metrics-bind-address", &format!("127.0.0.1:{metrics}")]);
    let mut c = server.client().await;
    let value = "v".repeat(2000);
    // 3 MB in all: a unary Range still fits the client's 4 MiB message limit.
    for i in 0..1500 {
        c.put(format!("/registry/pods/p{i:05}"), value.as_str(), None).await.unwrap();
    }
    let prefix = || GetOptions::new().with_prefix();
    for opts in [prefix(), prefix().with_limit(500), prefix().with_keys_only(), prefix().with_revision(800)] {
        let unary = c.get("/registry/pods/", Some(opts.clone())).await.unwrap();
        let parts = stream(&mut c, "/registry/pods/", Some(opts)).await.unwrap();
        assert!(parts.len() > 3, "{} parts", parts.len());
        let (last, rest) = parts.split_last().unwrap();
        // Only the last part has the header, count and more; no other part is empty.
        assert!(rest.iter().all(|p| p.header().is_none() && p.count() == 0 && !p.more() && !p.kvs().is_empty()));
        let keys: Vec<_> =
            parts.iter().flat_map(|p| p.kvs().iter().map(|kv| (kv.key().to_vec(), kv.mod_revision()))).collect();
        let want: Vec<_> = unary.kvs().iter().map(|kv| (kv.key().to_vec(), kv.mod_revision())).collect();
        assert_eq!(keys, want);
        assert_eq!(
            (last.header().unwrap().revision(), last.count(), last.more()),
            (unary.header().unwrap().revision(), unary.count(), unary.more())
        );
    }
    // One message for a count, and for nothing at all.
    let parts = stream(&mut c, "/registry/pods/", Some(prefix().with_count_only())).await.unwrap();
    assert_eq!((parts.len(), parts[0].count(), parts[0].kvs().len()), (1, 1500, 0));
    let parts = stream(&mut c, "/nothing/", Some(prefix())).await.unwrap();
    assert_eq!((parts.len(), parts[0].count(), parts[0].header().unwrap().revision()), (1, 0, 1501));

    // etcd 3.7's errors.
    let e = code(stream(&mut c, "", None).await.unwrap_err());
    assert_eq!(e, (tonic::Code::InvalidArgument, "etcdserver: key is not provided".into()));
    let sorted = prefix().with_sort(SortTarget::Mod, SortOrder::Descend);
    let e = code(stream(&mut c, "/registry/", Some(sorted)).await.unwrap_err());
    assert_eq!(e, (tonic::Code::Unimplemented, "RangeStream does not support custom sort orders".into()));
    let filtered = prefix().with_min_mod_revision(5);
    let e = code(stream(&mut c, "/registry/", Some(filtered)).await.unwrap_err());
    assert_eq!(e, (tonic::Code::Unimplemented, "RangeStream does not support revision filters".into()));
    let e = code(stream(&mut c, "/registry/", Some(prefix().with_revision(99_999))).await.unwrap_err());
    assert_eq!(e, (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision".into()));
    c.compact(100, None).await.unwrap();
    let e = code(stream(&mut c, "/registry/", Some(prefix().with_revision(50))).await.unwrap_err());
    assert_eq!(e, (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted".into()));

    // Counted as etcd counts it: a server stream, one handled RPC each.
    let handled = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="RangeStream",grpc_service="etcdserverpb.KV",grpc_type="server_stream"}"#;
    assert_eq!(metric(metrics, handled).await, 6.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_unread_streams_leave_nothing_behind() {
    let metrics = free_port();
    let (server, _dir) = sqlite_server(&["--metrics-bind-address", &format!("127.0.0.1:{metrics}")]);
    let mut c = server.client().await;
    let value = "v".repeat(4000);
    for i in 0..2000 {
        c.put(format!("/big/{i:05}"), value.as_str(), None).await.unwrap();
    }
    // Streams that other clients leave unread hold one part each on the server; writers and
    // other readers go on. (A client that leaves its own streams unread fills its connection's
    // HTTP/2 window and stalls only itself.)
    let mut unread = Vec::new();
    for _ in 0..20 {
        let other = server.client().await;
        let mut s = other.kv_client().get_stream("/big/", Some(GetOptions::new().with_prefix())).await.unwrap();
        s.message().await.unwrap().unwrap();
        unread.push((other, s));
    }
    let started = Instant::now();
    for i in 0..200 {
        c.put(format!("/other/{i}"), "v", None).await.unwrap();
    }
    assert_eq!(c.get("/big/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count(), 2000);
    assert!(started.elapsed() < Duration::from_secs(10), "writes waited for unread streams: {:?}", started.elapsed());
    assert_eq!(metric(metrics, "kine_range_streams ").await, 20.0);
    drop(unread);
    // 1,000 streams cancelled after their first part, on connections that stay open: 100 per
    // connection (the Rust h2 *client* gives up a connection after 1,024 resets of its own, and
    // under load frames that cross a cancellation count as such).
    let mut open = Vec::new();
    for _ in 0..10 {
        let client = server.client().await;
        for _ in 0..100 {
            let mut s = client.kv_client().get_stream("/big/", Some(GetOptions::new().with_prefix())).await.unwrap();
            s.message().await.unwrap().unwrap();
        }
        open.push(client);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let active = metric(metrics, "kine_range_streams ").await;
        if active == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "{active} RangeStream tasks still running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every stream started was counted as handled (the cancelled ones as Canceled).
    let (_, text) = http_get(metrics, "/metrics", None).await;
    let sum = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(r#"grpc_method="RangeStream""#))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(sum("grpc_server_started_total"), 1020.0);
    assert_eq!(sum("grpc_server_handled_total"), 1020.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulating_etcd_3_6_serves_no_range_stream() {
    let (server, _dir) = sqlite_server(&["--emulated-etcd-version", "3.6.16"]);
    let mut c = server.client().await;
    c.put("/a", "1", None).await.unwrap();
    // etcd 3.6's answer (kube-apiserver falls back to paginated lists on it).
    let e = code(stream(&mut c, "/a", None).await.unwrap_err());
    assert_eq!(e, (tonic::Code::Unimplemented, "unknown method RangeStream for service etcdserverpb.KV".into()));
    let status = c.status().await.unwrap();
    assert_eq!((status.version(), status.storage_version()), ("3.6.16", "3.6.0"));
    let (server, _dir) = sqlite_server(&[]);
    let status = server.client().await.status().await.unwrap();
    assert_eq!((status.version(), status.storage_version()), ("3.7.3", "3.7.0"));
}

/// etcd 3.7 answers a keys-only range from its index, without leases, unless it is sorted by
/// value (then from the stored values, leases included): plain and as a RangeStream alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_only_sorted_by_value_keeps_leases_as_etcd_3_7() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("/l/a", "2", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    c.put("/l/b", "1", None).await.unwrap();
    let keys_only = || GetOptions::new().with_prefix().with_keys_only();
    let by_value = || keys_only().with_sort(SortTarget::Value, SortOrder::Ascend);
    let leases = |r: &GetResponse| r.kvs().iter().map(|kv| (kv.key().to_vec(), kv.lease())).collect::<Vec<_>>();
    let unary = c.get("/l/", Some(by_value())).await.unwrap();
    assert_eq!(leases(&unary), vec![(b"/l/b".to_vec(), 0), (b"/l/a".to_vec(), lease)]);
    let parts = stream(&mut c, "/l/", Some(by_value().with_sort(SortTarget::Value, SortOrder::None))).await;
    // etcd 3.7 takes only SortOrder NONE in a RangeStream (the parts are sorted by value).
    let streamed: Vec<_> = parts.unwrap().iter().flat_map(leases).collect();
    assert_eq!(streamed, vec![(b"/l/b".to_vec(), 0), (b"/l/a".to_vec(), lease)]);
    let plain = c.get("/l/", Some(keys_only())).await.unwrap();
    assert_eq!(leases(&plain), vec![(b"/l/a".to_vec(), 0), (b"/l/b".to_vec(), 0)], "the index's answer: lease 0");
}
