//! A standby's local database kept current while it follows an S3 store (docs/s3.md,
//! "Takeover"), end to end against a real S3-compatible server (versitygw): after thousands of
//! `--s3-sync` segments since the checkpoint, a takeover applies only the few its database did
//! not hold yet; a follower killed mid-way and started again goes on from its database instead
//! of refusing it; `--s3-checkpoint-segments` bounds what a restore reads; a restore of a store
//! that never held anything warns of nothing.

mod common;
use common::s3::*;
use common::*;
use kine_testkit::s3::S3Server;
use std::time::{Duration, Instant};

/// The number after `name=` on the log line that says `message`.
fn logged(log: &str, message: &str, name: &str) -> Option<i64> {
    let line = log.lines().rev().find(|l| l.contains(message))?;
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Waits until `node`'s log says `message`.
async fn logs(node: &Server, message: &str, limit: Duration) {
    let begun = Instant::now();
    while !node.log().contains(message) {
        assert!(begun.elapsed() < limit, "no {message:?} within {limit:?}: {}", node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const KEPT_CURRENT: &str = "the local database holds the S3 store: it is kept current";
const CAUGHT_UP: &str = "the local database caught up with the S3 store";

/// `n` writes, one at a time (one `--s3-sync` upload each), from key `from` on.
async fn write(c: &mut etcd_client::Client, from: usize, n: usize) -> Vec<(String, i64)> {
    let mut acked = Vec::new();
    for i in from..from + n {
        let key = format!("/registry/pods/p{i:05}");
        let put = c.put(key.as_str(), format!("v{i}"), None).await.unwrap();
        acked.push((key, put.header().unwrap().revision()));
    }
    acked
}

/// Every write in `acked` is on `node` at its revision.
async fn holds(node: &Server, acked: &[(String, i64)]) {
    let (_, keys) = everything(&mut node.client().await).await;
    for (key, rev) in acked {
        let kv = keys.iter().find(|k| k.0 == key.as_bytes()).unwrap_or_else(|| panic!("{key} (revision {rev}) lost"));
        assert_eq!(kv.3, *rev, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_after_thousands_of_segments_applies_only_the_last_few() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "thousands");
    let (first, second) = (TempDir::new("s3-many-w"), TempDir::new("s3-many-s"));
    let writer = start(first.path(), &s3, &["--s3-sync"]);
    let mut c = writer.client().await;
    let mut acked = write(&mut c, 0, 10).await;
    let standby = start(second.path(), &s3, &[]);
    logs(&standby, KEPT_CURRENT, Duration::from_secs(30)).await;

    // Thousands of segments since the checkpoint (there is none: the interval is an hour).
    let begun = Instant::now();
    acked.extend(write(&mut c, 10, 2500).await);
    println!("S3-STANDBY: 2,500 --s3-sync writes in {:?}", begun.elapsed());
    drop(c);
    writer.signal("KILL");
    let killed = Instant::now();
    let mut f = standby.client().await;
    let (_, took) = until_served("a write on the standby", Duration::from_secs(30), || {
        let mut f = f.clone();
        async move {
            match f.put("/registry/pods/after", "x", None).await {
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::FailedPrecondition => {
                    Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(s.message())))
                }
                other => other,
            }
        }
    })
    .await;
    let log = standby.log();
    let segments = logged(&log, CAUGHT_UP, "segments").unwrap_or_else(|| panic!("no catch-up at the takeover: {log}"));
    let elapsed = logged(&log, CAUGHT_UP, "elapsed_ms").unwrap();
    println!(
        "S3-STANDBY-TAKEOVER lease 2s: writing {took:?} after the kill ({:?} since); {segments} segments applied at the \
         takeover in {elapsed} ms",
        killed.elapsed()
    );
    assert!(segments < 50, "the takeover applied {segments} segments: {log}");
    assert!(!log.contains("restored the store from S3"), "{log}");
    holds(&standby, &acked).await;
    let last = acked.last().unwrap().1;
    let after = f.get("/registry/pods/after", None).await.unwrap();
    assert_eq!(after.kvs()[0].mod_revision(), last + 1, "revisions go on from the writer's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_mid_way_goes_on_from_its_database() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "restarted");
    let (first, second) = (TempDir::new("s3-restart-w"), TempDir::new("s3-restart-f"));
    let writer = start(first.path(), &s3, &["--s3-sync"]);
    let mut c = writer.client().await;
    let mut acked = write(&mut c, 0, 100).await;
    let follower = start(second.path(), &s3, &[]);
    logs(&follower, KEPT_CURRENT, Duration::from_secs(30)).await;
    acked.extend(write(&mut c, 100, 100).await);
    // Its copy has the writes: so has its database, or it is about to.
    assert_eq!(everything(&mut follower.client().await).await, everything(&mut c).await);
    follower.signal("KILL");
    drop(follower);

    // Behind the store, but a prefix of it: it goes on from there, it is not refused.
    acked.extend(write(&mut c, 200, 100).await);
    let follower = start(second.path(), &s3, &[]);
    logs(&follower, KEPT_CURRENT, Duration::from_secs(30)).await;
    let log = follower.log();
    assert!(log.contains("the local database holds the S3 store's history up to this revision"), "{log}");
    assert!(!log.contains("emptied"), "{log}");
    acked.extend(write(&mut c, 300, 20).await);
    drop(c);
    writer.signal("KILL");
    logs(&follower, "took the S3 writer lock", Duration::from_secs(30)).await;
    let log = follower.log();
    let segments = logged(&log, CAUGHT_UP, "segments").unwrap_or_else(|| panic!("no catch-up: {log}"));
    assert!(segments < 50, "{segments} segments at the takeover: {log}");
    holds(&follower, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_come_after_a_number_of_segments_too() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "by-count");
    let (dir, restored) = (TempDir::new("s3-count"), TempDir::new("s3-count-r"));
    let flags = ["--s3-sync", "--s3-checkpoint-segments", "40"];
    let mut node = start(dir.path(), &s3, &flags);
    let acked = write(&mut node.client().await, 0, 130).await;
    assert!(node.stop("TERM").await.success(), "{}", node.log());
    let checkpoints = node.log().matches("S3 checkpoint written").count();
    assert!(checkpoints >= 2, "{checkpoints} checkpoints: {}", node.log());

    // A new node restores from the newest checkpoint and the segments after it: at most about
    // 40 of the 130.
    let node = start_writing(restored.path(), &s3, &[]);
    let log = node.log();
    let segments = logged(&log, "restored the store from S3", "segments").unwrap_or_else(|| panic!("{log}"));
    assert!(log.contains("checkpoint=Some(") && segments <= 45, "{segments} segments: {log}");
    holds(&node, &acked).await;

    let err = refused(restored.path(), &s3, &["--s3-checkpoint-segments", "0"]);
    assert!(err.contains("--s3-checkpoint-segments"), "{err}");
}

/// Each node's first segment of its term carries no revision when the store holds nothing: a
/// restore skips the older term's without a warning (nothing in it was lost or late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_held_anything_restores_without_a_warning() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "nothing");
    for round in 0..3 {
        let dir = TempDir::new("s3-nothing");
        let mut node = start_writing(dir.path(), &s3, &[]);
        let log = node.log();
        assert!(!log.contains("skipped a segment"), "round {round}: {log}");
        if round > 0 {
            assert!(log.contains("restored the store from S3"), "round {round}: {log}");
        }
        assert!(node.stop("TERM").await.success(), "{}", node.log());
    }
    let restored = TempDir::new("s3-nothing-r");
    let mut cmd = std::process::Command::new(server_bin());
    cmd.args(["--endpoint", &db_endpoint(restored.path())]).args(&s3).arg("s3-restore");
    let (ok, _, log) = run(&mut cmd);
    assert!(ok && log.contains("restored from S3") && !log.contains("skipped a segment"), "{log}");
}
