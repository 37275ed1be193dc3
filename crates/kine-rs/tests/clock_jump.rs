//! The host clock jumps under kine-rs (libfaketime moves its wall clock an hour forward, then
//! an hour back, while it runs): leases expire by elapsed time only. A lease kept alive survives
//! both jumps, a lease left alone expires after its TTL — not at the forward jump (etcd's
//! behaviour: no mass expiry) and not never after the backward one.
//!
//! Needs libfaketime (Debian package faketime; install-test-deps installs it); fails without it.

mod common;
use common::*;
use etcd_client::{Client, GetOptions};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// kine-rs with its wall clock offset by the contents of `offset_file` (re-read on every call).
fn start_with_fake_clock(dir: &Path, offset_file: &Path) -> Server {
    assert!(Path::new(LIBFAKETIME).exists(), "{LIBFAKETIME} missing: install the Debian package faketime");
    let mut cmd = Command::new(server_bin());
    cmd.env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", offset_file)
        .env("FAKETIME_NO_CACHE", "1")
        // A host clock step moves the wall clock only; the monotonic clock goes on.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let endpoint = db_endpoint(dir);
    Server::start_command(cmd, &["--endpoint", &endpoint, "--debug"])
}

/// kine-rs's idea of the time, in seconds since the epoch: the timestamp of its newest log
/// line (with `--debug` every request logs; hyper's cached Date header would not follow a
/// backward jump).
async fn server_clock(client: &mut Client, server: &Server) -> i64 {
    client.get("/clock/probe", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = server.log();
    let stamp = log
        .lines()
        .rev()
        .find_map(|l| l.split_whitespace().next().filter(|w| w.len() > 20 && w.ends_with('Z')))
        .expect("a timestamped log line")
        .to_string();
    let out = Command::new("date").args(["-d", &stamp, "+%s"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("a time: {stamp}"))
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

async fn exists(client: &mut Client, key: &str) -> bool {
    client.get(key, Some(GetOptions::new().with_count_only())).await.unwrap().count() == 1
}

/// Waits until `key` is gone; returns how long that took from `since`.
async fn gone_after(client: &mut Client, key: &str, since: Instant, limit: Duration) -> Duration {
    while exists(client, key).await {
        assert!(since.elapsed() < limit, "{key} still present after {:?}", since.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_by_elapsed_time_across_clock_jumps() {
    let dir = TempDir::new("clock");
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let server = start_with_fake_clock(dir.path(), &offset);
    let mut client = server.client().await;

    // One lease kept alive every second, one left alone.
    let kept = client.lease_grant(6, None).await.unwrap().id();
    let left = client.lease_grant(6, None).await.unwrap().id();
    let granted = Instant::now();
    client.put("/clock/kept", "v", Some(etcd_client::PutOptions::new().with_lease(kept))).await.unwrap();
    client.put("/clock/left", "v", Some(etcd_client::PutOptions::new().with_lease(left))).await.unwrap();
    let (mut keeper, mut answers) = client.lease_keep_alive(kept).await.unwrap();
    let keep_alive = tokio::spawn(async move {
        loop {
            if keeper.keep_alive().await.is_err() || answers.message().await.ok().flatten().is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    // An hour forward. kine-rs sees it (its log's timestamps move), the lease left alone does not
    // expire at once: its TTL still counts down from the grant.
    std::fs::write(&offset, "+3600\n").unwrap();
    let skew = server_clock(&mut client, &server).await - now();
    assert!((3590..=3610).contains(&skew), "kine-rs's clock is {skew} s off, not an hour: libfaketime not in effect");
    assert!(exists(&mut client, "/clock/left").await, "the forward jump expired a lease at once");
    let ttl = client.lease_time_to_live(left, None).await.unwrap().ttl();
    assert!((1..=6).contains(&ttl), "TTL after the jump: {ttl}");
    let expired = gone_after(&mut client, "/clock/left", granted, Duration::from_secs(15)).await;
    assert!(expired >= Duration::from_secs(5), "expired after {expired:?}, before its 6 s TTL");

    // An hour back (two hours from the previous setting): a new lease left alone still expires
    // after its TTL, and the kept one is still alive.
    std::fs::write(&offset, "-3600\n").unwrap();
    let skew = server_clock(&mut client, &server).await - now();
    assert!((-3610..=-3590).contains(&skew), "kine-rs's clock is {skew} s off, not an hour back");
    let late = client.lease_grant(4, None).await.unwrap().id();
    let granted = Instant::now();
    client.put("/clock/late", "v", Some(etcd_client::PutOptions::new().with_lease(late))).await.unwrap();
    let expired = gone_after(&mut client, "/clock/late", granted, Duration::from_secs(15)).await;
    assert!(expired >= Duration::from_secs(3), "expired after {expired:?}, before its 4 s TTL");
    assert!(exists(&mut client, "/clock/kept").await, "a lease kept alive expired across the jumps");
    let ttl = client.lease_time_to_live(kept, None).await.unwrap().ttl();
    assert!((1..=6).contains(&ttl), "TTL of the kept lease: {ttl}");
    keep_alive.abort();
}
