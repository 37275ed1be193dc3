//! Read-only copies of a NATS bucket (a JetStream mirror served by kine-rs), on one nats-server:
//! a copy serves exactly what its origin serves (every revision, watches, leases, hashes) and
//! refuses every write as etcd refuses a learner; bad set-ups are refused at start; promotion
//! turns a copy into the primary with every revision kept, and fences its old origin.
//! The edge/hub topology over a leaf node is in `nats_edge.rs`.

mod common;
use common::copies::*;
use common::*;
use etcd_client::*;
use kine_testkit::nats::{NatsServer, free_port};
use std::time::Duration;

fn origin(nats: &NatsServer) -> Server {
    Server::start(&["--endpoint", &format!("{}?noEmbed", nats.url())])
}

fn copy_of_kine(nats: &NatsServer, bucket: &str, extra: &[&str]) -> Server {
    let endpoint = format!("{}?noEmbed&bucket={bucket}&mirror=kine", nats.url());
    let mut args = vec!["--endpoint", endpoint.as_str()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn assert_learner_refusal(e: Error, what: &str) {
    let (code, message) = status_of(e);
    assert_eq!(code, tonic::Code::FailedPrecondition, "{what}: {message}");
    assert!(
        message.starts_with("etcdserver: rpc not supported for learner: ") && message.contains("KV_kine"),
        "{what}: {message}"
    );
}

async fn revision(c: &mut Client) -> i64 {
    c.get("health", None).await.unwrap().header().unwrap().revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_serves_what_its_origin_serves_and_refuses_writes() {
    let nats = NatsServer::start();
    let origin = origin(&nats);
    let mut o = origin.client().await;
    let mut load = K8sLoad::new(&mut o, "/registry").await;
    for _ in 0..300 {
        load.step(&mut o).await.unwrap();
    }
    // History before the copy exists, compacted once.
    let compact_at = revision(&mut o).await - 100;
    o.compact(compact_at, None).await.unwrap();

    let metrics = free_port();
    let copy = copy_of_kine(&nats, "copy", &["--metrics-bind-address", &format!("127.0.0.1:{metrics}")]);
    assert!(copy.log().contains("serving a read-only copy"), "{}", copy.log());
    let mut c = copy.client().await;
    let mut w_origin = watch_from(&mut o, "/registry/", compact_at).await;
    let mut w_copy = watch_from(&mut c, "/registry/", compact_at).await;
    // Followed live, and a compaction made by the origin while the copy runs.
    for _ in 0..300 {
        load.step(&mut o).await.unwrap();
    }
    let second_compaction = revision(&mut o).await - 150;
    o.compact(second_compaction, None).await.unwrap();
    for _ in 0..100 {
        load.step(&mut o).await.unwrap();
    }
    let last = revision(&mut o).await;
    wait_for_revision(&mut c, last, Duration::from_secs(20)).await;

    // The watch streams are equal event for event, prev_kv included.
    let (a, b) = (collect(&mut w_origin, last).await, collect(&mut w_copy, last).await);
    assert_eq!(a.len(), b.len());
    assert_eq!(a, b);
    // Every revision the origin still holds reads the same on the copy, once the copy applied the
    // origin's compaction (below it, both answer "compacted").
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let h = c.hash_kv(0).await.unwrap();
        if h.compact_version() == second_compaction {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the copy did not apply the origin's compaction: {h:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    same_at_every_revision(&mut o, &mut c, "/registry/", second_compaction - 5, last).await;
    // The mirror is purged as its origin was (NATS mirrors do not repeat purges).
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mut messages = Vec::new();
    for stream in ["KV_kine", "KV_copy"] {
        messages.push(js.get_stream(stream).await.unwrap().info().await.unwrap().state.messages);
    }
    assert_eq!(messages[0], messages[1], "messages in the origin's stream and in the mirror");
    for rev in [second_compaction, (second_compaction + last) / 2, last] {
        let (x, y) = (o.hash_kv(rev).await.unwrap(), c.hash_kv(rev).await.unwrap());
        assert_eq!((x.hash(), x.compact_version()), (y.hash(), y.compact_version()), "HashKV at {rev}");
    }
    assert_eq!(o.hash().await.unwrap().hash(), c.hash().await.unwrap().hash(), "Hash (keys and leases)");
    // Leases: the same ids, TTLs and keys.
    let leases = |r: LeaseLeasesResponse| r.leases().iter().map(|l| l.id()).collect::<Vec<_>>();
    let ids = leases(o.leases().await.unwrap());
    assert_eq!(ids, leases(c.leases().await.unwrap()));
    for id in ids {
        let opts = || Some(LeaseTimeToLiveOptions::new().with_keys());
        let (x, y) = (o.lease_time_to_live(id, opts()).await.unwrap(), c.lease_time_to_live(id, opts()).await.unwrap());
        assert_eq!((x.granted_ttl(), x.keys()), (y.granted_ttl(), y.keys()));
        assert!(y.ttl() > 0);
    }
    // Same datastore: the same cluster id; this node is a learner.
    let header = c.get("health", None).await.unwrap().header().unwrap().clone();
    assert_eq!(header.cluster_id(), o.get("health", None).await.unwrap().header().unwrap().cluster_id());
    let status = c.status().await.unwrap();
    assert!(status.is_learner());
    assert_eq!(status.raft_applied_index(), last as u64);
    assert_ne!(status.leader(), 0);
    assert!(!o.status().await.unwrap().is_learner());
    // The copy lists itself as a learner and its origin as a voting member.
    let (me, origin_id) = (own_member(&mut c).await, own_member(&mut o).await.id());
    assert!(me.is_learner());
    let members = c.member_list().await.unwrap();
    let origin_entry = members.members().iter().find(|m| m.id() == origin_id).expect("the origin is listed");
    assert!(!origin_entry.is_learner());
    // Snapshot and read-only transactions work; a progress request is answered.
    let mut snapshot = c.snapshot().await.unwrap();
    let mut bytes = 0;
    while let Some(part) = snapshot.message().await.unwrap() {
        bytes += part.blob().len();
    }
    assert!(bytes > 1000);
    let txn = Txn::new()
        .when([Compare::version("/registry/nothing", CompareOp::Equal, 0)])
        .and_then([TxnOp::get("/registry/", Some(GetOptions::new().with_prefix().with_count_only()))]);
    assert!(c.txn(txn).await.unwrap().succeeded());
    let mut progress = c.watch("/registry/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    progress.message().await.unwrap();
    progress.request_progress().await.unwrap();
    let p = tokio::time::timeout(Duration::from_secs(5), progress.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(p.header().unwrap().revision(), last);

    // Every write is refused the way etcd refuses a learner, and nothing is written.
    assert_learner_refusal(c.put("/registry/x", "v", None).await.unwrap_err(), "put");
    assert_learner_refusal(
        c.delete("/registry/", Some(DeleteOptions::new().with_prefix())).await.unwrap_err(),
        "delete",
    );
    let txn = Txn::new().when([Compare::version("/x", CompareOp::Equal, 0)]).and_then([TxnOp::put("/x", "v", None)]);
    assert_learner_refusal(c.txn(txn).await.unwrap_err(), "txn");
    assert_learner_refusal(c.compact(last, None).await.unwrap_err(), "compact");
    assert_learner_refusal(c.lease_grant(60, None).await.unwrap_err(), "lease grant");
    let lease = o.leases().await.unwrap().leases()[0].id();
    assert_learner_refusal(c.lease_revoke(lease).await.unwrap_err(), "lease revoke");
    // (The client sends the first keep-alive itself and reports its answer.)
    let refused = match c.lease_keep_alive(lease).await {
        Err(e) => e,
        Ok((_, mut answers)) => answers.message().await.unwrap_err(),
    };
    assert_learner_refusal(refused, "lease keep-alive");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(revision(&mut o).await, last, "a refused write changed the origin");
    assert_eq!(revision(&mut c).await, last);

    // Lag: zero once caught up; health with a limit passes; metrics say so.
    let (code, body) = http_get(metrics, "/health?lag=5s&lag_revisions=10", None).await;
    assert_eq!((code, body.as_str()), (200, r#"{"health":"true","reason":""}"#));
    let (code, body) = http_get(metrics, "/health?lag=soon", None).await;
    assert_eq!(code, 400, "{body}");
    let (_, text) = http_get(metrics, "/metrics", None).await;
    for line in ["etcd_server_is_learner 1", "kine_copy_lag_revisions 0", "kine_copy_link_up 1"] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_copies_are_refused_at_start() {
    let nats = NatsServer::start();
    let origin = origin(&nats);
    let mut o = origin.client().await;
    o.put("/a", "1", None).await.unwrap();
    let start = |endpoint: String| {
        let started = std::time::Instant::now();
        let (ok, _, stderr) = run(std::process::Command::new(server_bin()).args([
            "--listen-address",
            "127.0.0.1:0",
            "--endpoint",
            &endpoint,
        ]));
        assert!(!ok, "{endpoint} started:\n{stderr}");
        (stderr, started.elapsed())
    };
    // A bucket of its own cannot become a copy.
    let _own = Server::start(&["--endpoint", &format!("{}?noEmbed&bucket=own", nats.url())]);
    let (e, _) = start(format!("{}?noEmbed&bucket=own&mirror=kine", nats.url()));
    assert!(e.contains("bucket own exists and is not a mirror"), "{e}");
    // A mirror of something that is not a kine-rs bucket.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "KV_foreign".into(),
        subjects: vec!["$KV.foreign.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("$KV.foreign.k", "v".into()).await.unwrap().await.unwrap();
    let (e, _) = start(format!("{}?noEmbed&bucket=c1&mirror=foreign", nats.url()));
    assert!(e.contains("not a kine-rs bucket"), "{e}");
    // A mirror of nothing: an error within seconds, never an empty store.
    let (e, took) = start(format!("{}?noEmbed&bucket=c2&mirror=missing", nats.url()));
    assert!(e.contains("has received nothing from it") && e.contains("KV_missing"), "{e}");
    assert!(took < Duration::from_secs(40), "{took:?}");
    // An existing mirror of another bucket than mirror= names.
    let _copy = copy_of_kine(&nats, "c3", &[]);
    let (e, _) = start(format!("{}?noEmbed&bucket=c3&mirror=own", nats.url()));
    assert!(e.contains("is a mirror of KV_kine") && e.contains("not of KV_own"), "{e}");
    // A mirror is detected without mirror=: it is served read-only.
    let metrics = free_port();
    let detected = Server::start(&[
        "--endpoint",
        &format!("{}?noEmbed&bucket=c3", nats.url()),
        "--metrics-bind-address",
        &format!("127.0.0.1:{metrics}"),
    ]);
    let mut d = detected.client().await;
    assert_learner_refusal(d.put("/b", "2", None).await.unwrap_err(), "put on a detected mirror");
    assert_eq!(d.get("/a", None).await.unwrap().kvs()[0].value(), b"1");
    // The origin deleted under a running copy: it says so in health, and still serves reads.
    drop(origin);
    for stream in ["KV_kine", "KV_kine-meta"] {
        js.delete_stream(stream).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (code, body) = http_get(metrics, "/health?lag=1m", None).await;
        if code == 503 {
            assert!(body.contains("COPY LAG:the link to KV_kine (in this JetStream domain) is down"), "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "health still {code} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(d.get("/a", None).await.unwrap().kvs()[0].value(), b"1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_keeps_every_revision_and_fences_the_old_origin() {
    let nats = NatsServer::start();
    let mut origin = origin(&nats);
    let mut o = origin.client().await;
    let mut load = K8sLoad::new(&mut o, "/registry").await;
    for _ in 0..200 {
        load.step(&mut o).await.unwrap();
    }
    let copy = copy_of_kine(&nats, "copy", &[]);
    let second = copy_of_kine(&nats, "copy", &[]);
    let mut c = copy.client().await;
    let c2 = second.client().await;
    for _ in 0..200 {
        load.step(&mut o).await.unwrap();
    }
    let last = revision(&mut o).await;
    wait_for_revision(&mut c, last, Duration::from_secs(20)).await;
    let all = || Some(GetOptions::new().with_prefix());
    let listing = |r: GetResponse| {
        r.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key().to_vec(),
                    kv.value().to_vec(),
                    kv.mod_revision(),
                    kv.create_revision(),
                    kv.version(),
                    kv.lease(),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = listing(c.get("/registry/", all()).await.unwrap());

    // Not a copy, a wrong member id: refused, nothing changed.
    let origin_id = own_member(&mut o).await.id();
    let (code, message) = status_of(o.member_promote(origin_id).await.unwrap_err());
    assert_eq!(
        (code, message.as_str()),
        (tonic::Code::FailedPrecondition, "etcdserver: can only promote a learner member")
    );
    let id = own_member(&mut c).await.id();
    let (code, message) = status_of(c.member_promote(id ^ 1).await.unwrap_err());
    assert_eq!((code, message.as_str()), (tonic::Code::NotFound, "etcdserver: member not found"));

    // The origin is lost (its kine-rs killed); the copy is promoted.
    origin.child.kill().unwrap();
    origin.child.wait().unwrap();
    let promoted = c.member_promote(id).await.unwrap();
    assert!(!promoted.members().iter().find(|m| m.id() == id).expect("the promoted node is listed").is_learner());
    assert!(!c.status().await.unwrap().is_learner());
    let (code, message) = status_of(c.member_promote(id).await.unwrap_err());
    assert_eq!(
        (code, message.as_str()),
        (tonic::Code::FailedPrecondition, "etcdserver: can only promote a learner member")
    );
    // Every object keeps its revisions; writes continue after the copy's newest revision.
    assert_eq!(before, listing(c.get("/registry/", all()).await.unwrap()));
    for a in load.acked.iter().rev().take(50) {
        let r = c.get(a.key.as_str(), Some(GetOptions::new().with_revision(a.revision))).await.unwrap();
        assert_eq!(r.kvs().first().map(|kv| kv.value_str().unwrap().to_string()), a.value, "{a:?}");
    }
    for _ in 0..50 {
        load.step(&mut c).await.unwrap();
    }
    let first_new = load.acked.iter().find(|a| a.revision > last).map(|a| a.revision);
    assert_eq!(first_new, Some(last + 1), "the first write after the promotion");
    // The other node of the copy takes writes too, once it noticed (until then it refuses them
    // as a learner does).
    let start = std::time::Instant::now();
    loop {
        match c2.clone().put("/registry/second", "v", None).await {
            Ok(_) => break,
            Err(e) => {
                let (code, message) = status_of(e);
                assert_eq!(code, tonic::Code::FailedPrecondition, "{message}");
                assert!(message.contains("read-only copy"), "{message}");
                assert!(start.elapsed() < Duration::from_secs(15), "the second node still refuses: {message}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // Leases are served and expire again on the promoted copy.
    let lease = c.lease_grant(2, None).await.unwrap().id();
    c.put("/registry/leased", "v", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(c.get("/registry/leased", None).await.unwrap().kvs().is_empty(), "the lease expired on the new primary");

    // The old origin comes back: it was fenced, refuses writes and reports it; the new
    // primary's history is untouched.
    let new_primary = revision(&mut c).await;
    let back = Server::start(&["--endpoint", &format!("{}?noEmbed", nats.url())]);
    let mut b = back.client().await;
    let (code, message) = status_of(b.put("/registry/fork", "x", None).await.unwrap_err());
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(message.contains("superseded by the promoted copy KV_copy"), "{message}");
    assert!(back.log().contains("superseded by a promoted copy"), "{}", back.log());
    assert_eq!(revision(&mut c).await, new_primary);
    assert!(c.get("/registry/fork", None).await.unwrap().kvs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_promotion_loses_nothing() {
    let nats = NatsServer::start();
    let origin = origin(&nats);
    let copy = copy_of_kine(&nats, "copy", &[]);
    let mut o = origin.client().await;
    let mut c = copy.client().await;
    // Writes go on against the origin while the copy is promoted.
    let writer = {
        let mut o = o.clone();
        tokio::spawn(async move {
            let mut load = K8sLoad::new(&mut o, "/planned").await;
            let mut refused = None;
            for _ in 0..5000 {
                if let Err(e) = load.step(&mut o).await {
                    refused = Some(status_of(e));
                    break;
                }
            }
            (load.acked, refused)
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let id = own_member(&mut c).await.id();
    c.member_promote(id).await.unwrap();
    let (acked, refused) = writer.await.unwrap();
    let (code, message) = refused.expect("the origin refused writes once fenced");
    assert_eq!(code, tonic::Code::FailedPrecondition, "{message}");
    assert!(message.contains("superseded"), "{message}");
    assert!(acked.len() > 50);
    // Every write the origin acknowledged is on the new primary at its revision.
    for a in &acked {
        let r = c.get(a.key.as_str(), Some(GetOptions::new().with_revision(a.revision))).await.unwrap();
        assert_eq!(r.kvs().first().map(|kv| kv.value_str().unwrap().to_string()), a.value, "{a:?}");
    }
    let last = acked.iter().map(|a| a.revision).max().unwrap();
    let next = c.put("/planned/after", "v", None).await.unwrap().header().unwrap().revision();
    assert!(next > last, "{next} after {last}");
    let _ = o.status().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_bucket_under_the_old_origins_name_is_not_fenced() {
    let nats = NatsServer::start();
    let origin = origin(&nats);
    let mut o = origin.client().await;
    o.put("/a", "1", None).await.unwrap();
    let copy = copy_of_kine(&nats, "copy", &[]);
    let mut c = copy.client().await;
    wait_for_revision(&mut c, 2, Duration::from_secs(10)).await;
    // The origin is lost for good: its streams are gone, so the promotion cannot fence it.
    drop(origin);
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    for stream in ["KV_kine", "KV_kine-meta"] {
        js.delete_stream(stream).await.unwrap();
    }
    let id = own_member(&mut c).await.id();
    c.member_promote(id).await.unwrap();
    assert!(copy.log().contains("promoting without it"), "{}", copy.log());
    // A new bucket under the old name is another datastore: the promoted copy leaves it alone.
    let fresh = Server::start(&["--endpoint", &format!("{}?noEmbed", nats.url())]);
    let mut f = fresh.client().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        f.put("/b", "2", None).await.expect("the new bucket takes writes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(copy.log().contains("the old origin bucket is gone"), "{}", copy.log());
    assert!(!fresh.log().contains("superseded"), "{}", fresh.log());
}
