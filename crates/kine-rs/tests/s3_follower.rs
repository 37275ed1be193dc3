//! Several nodes on one S3 folder (`--s3-bucket`), end to end against a real S3-compatible
//! server (versitygw): a node started while another holds the writer lock serves a read-only
//! copy — linearizable reads that see every write the writer acknowledged under `--s3-sync`,
//! serializable reads, watches live and from history, leases — and refuses writes with the
//! learner's error naming the writer; once the writer is gone it takes over in place, its open
//! watches going on without a gap and its leases kept, and with every write the writer
//! acknowledged under `--s3-sync` when the writer is killed mid-load.

mod common;
use common::s3::*;
use common::*;
use etcd_client::{GetOptions, PutOptions, WatchOptions};
use kine_testkit::s3::S3Server;
use std::time::{Duration, Instant};

/// The next watch event's (revision, key, value), within 10 s.
async fn next_event(
    w: &mut etcd_client::WatchStream,
    pending: &mut Vec<(i64, String, String)>,
) -> (i64, String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, w.message()).await.expect("a watch event within 10 s").unwrap().unwrap();
        assert!(!msg.canceled(), "watch canceled: {}", msg.cancel_reason());
        for e in msg.events() {
            let kv = e.kv().unwrap();
            pending.push((
                kv.mod_revision(),
                String::from_utf8_lossy(kv.key()).into(),
                String::from_utf8_lossy(kv.value()).into(),
            ));
        }
    }
    pending.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_reads_and_watches_refuses_writes_and_takes_over_in_place() {
    let server = S3Server::start(&["kine"]);
    let (first, second) = (TempDir::new("s3-lead"), TempDir::new("s3-follow"));
    let writer = start(first.path(), &s3_args(&server, "follow"), &["--s3-sync"]);
    let mut w = writer.client().await;
    let lease = w.lease_grant(30, None).await.unwrap().id();
    w.put("/registry/leases/held", "l", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    for i in 0..5 {
        w.put(format!("/registry/pods/p{i}"), format!("v{i}"), None).await.unwrap();
    }

    let follower = start(second.path(), &s3_args(&server, "follow"), &[]);
    assert!(follower.log().contains("serving a read-only copy"), "{}", follower.log());
    let mut f = follower.client().await;
    let (wrev, wkeys) = everything(&mut w).await;
    let (frev, fkeys) = everything(&mut f).await;
    assert_eq!((frev, &fkeys), (wrev, &wkeys), "the copy holds what the writer holds");

    // A linearizable read on the follower sees each write the writer acknowledged under
    // --s3-sync, at once.
    for i in 0..10 {
        let put = w.put("/registry/pods/p0", format!("n{i}"), None).await.unwrap();
        let got = f.get("/registry/pods/p0", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), format!("n{i}").as_bytes());
        assert_eq!(got.kvs()[0].mod_revision(), put.header().unwrap().revision());
    }
    let serializable = f.get("/registry/pods/p1", Some(GetOptions::new().with_serializable())).await.unwrap();
    assert_eq!(serializable.kvs()[0].value(), b"v1");

    // Watches: one from history (the first revision), one live.
    let mut history =
        f.watch("/registry/pods/", Some(WatchOptions::new().with_prefix().with_start_revision(2))).await.unwrap();
    let mut pending = Vec::new();
    let first_event = next_event(&mut history, &mut pending).await;
    assert_eq!(first_event.1, "/registry/pods/p0", "{first_event:?}");
    let now = f.get("/registry/pods/p0", None).await.unwrap().header().unwrap().revision();
    let mut live =
        f.watch("/registry/pods/", Some(WatchOptions::new().with_prefix().with_start_revision(now + 1))).await.unwrap();
    let mut live_pending = Vec::new();
    let mut written = Vec::new();
    for i in 0..10 {
        let put = w.put(format!("/registry/pods/w{i}"), format!("x{i}"), None).await.unwrap();
        written.push((put.header().unwrap().revision(), format!("/registry/pods/w{i}"), format!("x{i}")));
    }
    for expected in &written {
        assert_eq!(&next_event(&mut live, &mut live_pending).await, expected);
    }

    // Leases granted together, then revoked together (one upload each), reach the copy.
    let (mut w1, mut w2, mut w3) = (w.clone(), w.clone(), w.clone());
    let (a, b, c) = tokio::join!(w1.lease_grant(60, None), w2.lease_grant(60, None), w3.lease_grant(60, None));
    let granted = [a.unwrap().id(), b.unwrap().id(), c.unwrap().id()];
    f.get("/registry/pods/p0", None).await.unwrap();
    let held: Vec<i64> = f.leases().await.unwrap().leases().iter().map(|l| l.id()).collect();
    assert!(granted.iter().all(|id| held.contains(id)), "granted {granted:?}, the copy holds {held:?}");
    let (ra, rb) = tokio::join!(w1.lease_revoke(granted[0]), w2.lease_revoke(granted[1]));
    ra.unwrap();
    rb.unwrap();
    f.get("/registry/pods/p0", None).await.unwrap();
    let held: Vec<i64> = f.leases().await.unwrap().leases().iter().map(|l| l.id()).collect();
    assert!(!held.contains(&granted[0]) && !held.contains(&granted[1]), "revoked, yet the copy holds {held:?}");
    assert!(held.contains(&granted[2]) && held.contains(&lease), "the copy holds {held:?}");

    // Writes are refused, naming the writer.
    let err = f.put("/registry/pods/refused", "x", None).await.unwrap_err().to_string();
    assert!(err.contains("rpc not supported for learner") && err.contains(&writer.url), "{err}");
    assert!(f.status().await.unwrap().is_learner());

    // The writer is killed: the follower takes the lock, restores, and serves writes; the live
    // watch goes on with the next revisions, and the lease is still there.
    writer.signal("KILL");
    let killed = Instant::now();
    while !follower.log().contains("took the S3 writer lock") {
        assert!(killed.elapsed() < Duration::from_secs(20), "no takeover: {}", follower.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("S3-FOLLOWER-TAKEOVER lease 2s: writing {:?} after the writer was killed", killed.elapsed());
    assert!(!f.status().await.unwrap().is_learner());
    let after = f.put("/registry/pods/after", "a", None).await.unwrap().header().unwrap().revision();
    assert_eq!(after, written.last().unwrap().0 + 1, "revisions go on from the writer's");
    assert_eq!(next_event(&mut live, &mut live_pending).await, (after, "/registry/pods/after".into(), "a".into()));
    let ttl = f.lease_time_to_live(lease, None).await.unwrap();
    assert!(ttl.ttl() > 0, "the lease survived the takeover: {ttl:?}");
    f.lease_keep_alive(lease).await.unwrap();
    let held = f.get("/registry/leases/held", None).await.unwrap();
    assert_eq!(held.kvs()[0].lease(), lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sees_compactions_and_a_clean_handover() {
    let server = S3Server::start(&["kine"]);
    let (first, second) = (TempDir::new("s3-lead2"), TempDir::new("s3-follow2"));
    let mut writer = start(first.path(), &s3_args(&server, "compact"), &["--s3-sync"]);
    let mut w = writer.client().await;
    for i in 0..5 {
        w.put("/k", format!("{i}"), None).await.unwrap();
    }
    let follower = start(second.path(), &s3_args(&server, "compact"), &[]);
    let mut f = follower.client().await;
    let compacted = w.put("/k", "5", None).await.unwrap().header().unwrap().revision();
    w.compact(compacted, None).await.unwrap();
    // Compactions reach the copy with the next segment.
    w.put("/other", "x", None).await.unwrap();
    let err = f.get("/k", Some(GetOptions::new().with_revision(2))).await.unwrap_err().to_string();
    assert!(err.contains("required revision has been compacted"), "{err}");
    assert_eq!(f.get("/k", None).await.unwrap().kvs()[0].value(), b"5");

    // A clean stop releases the lock: the follower writes within about a lock tick.
    writer.stop("TERM").await;
    let stopped = Instant::now();
    let (put, took) = until_served("write after the handover", Duration::from_secs(15), || {
        let mut f = f.clone();
        async move {
            match f.put("/after", "y", None).await {
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::FailedPrecondition => {
                    Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(s.message())))
                }
                other => other,
            }
        }
    })
    .await;
    println!("S3-FOLLOWER-HANDOVER: writing {took:?} after the writer stopped ({:?})", stopped.elapsed());
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(put.header().unwrap().revision(), compacted + 2);
}

/// A standby on the same folder (serving a read-only copy while it waits for the writer lock) takes over when the
/// writer is killed mid-load: within the lease plus the last segments, with every write the writer
/// acknowledged (`--s3-sync`), revisions going on from there; the killed writer's database is
/// then another store's, refused. Prints `S3-TAKEOVER` with the measured time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_a_killed_writer_with_every_acknowledged_write() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "standby");
    let (first, second) = (TempDir::new("s3-writer"), TempDir::new("s3-standby"));
    let writer = start(first.path(), &s3, &["--s3-sync"]);
    let mut c = writer.client().await;
    c.put("/registry/pods/first", "0", None).await.unwrap();

    // Writes, each remembered once acknowledged, until the writer is gone.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = tokio::spawn({
        let (mut c, acked) = (c.clone(), acked.clone());
        async move {
            for i in 0.. {
                let key = format!("/registry/pods/w{i:05}");
                match c.put(key.as_str(), format!("v{i}"), None).await {
                    Ok(r) => acked.lock().unwrap().push((key, r.header().unwrap().revision())),
                    Err(_) => return i,
                }
            }
            unreachable!()
        }
    });
    let standby = {
        let (dir, s3) = (second.path().to_path_buf(), s3.clone());
        tokio::task::spawn_blocking(move || start(&dir, &s3, &[]))
    };
    // The kill comes once the standby serves its read-only copy and the writer has
    // acknowledged a few dozen writes (which takes longer on a busy machine).
    let begun = std::time::Instant::now();
    while begun.elapsed() < std::time::Duration::from_millis(1500) || acked.lock().unwrap().len() < 30 {
        assert!(begun.elapsed() < std::time::Duration::from_secs(60), "the writer acknowledged too few writes");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let standby = standby.await.unwrap();
    assert!(standby.log().contains("serving a read-only copy"), "{}", standby.log());
    writer.signal("KILL");
    let killed = std::time::Instant::now();
    let attempted = load.await.unwrap();
    while !standby.log().contains("took the S3 writer lock") {
        assert!(killed.elapsed() < std::time::Duration::from_secs(20), "no takeover: {}", standby.log());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let took = killed.elapsed();
    println!("S3-TAKEOVER lease 2s: serving {took:?} after the writer was killed ({attempted} writes attempted)");
    // Its database was kept current as it followed: the takeover applied what it lacked only.
    assert!(standby.log().contains("the local database caught up with the S3 store"), "{}", standby.log());
    assert!(took < std::time::Duration::from_secs(10), "{took:?}: {}", standby.log());

    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 20, "too few writes acknowledged before the kill: {}", acked.len());
    let mut c = standby.client().await;
    let (revision, keys) = everything(&mut c).await;
    let last = acked.last().unwrap().1;
    assert!(revision >= last, "the standby is at {revision}, the writer acknowledged {last}");
    for (key, rev) in &acked {
        let kv = keys.iter().find(|k| k.0 == key.as_bytes()).unwrap_or_else(|| panic!("{key} (revision {rev}) lost"));
        assert_eq!(kv.3, *rev, "{key}");
    }
    let put = c.put("/registry/pods/after", "x", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), revision + 1);
    drop(c);
    drop(standby);

    let err = refused(first.path(), &s3, &[]);
    assert!(err.contains("holds another store"), "{err}");
}
