//! Nodes on S3 durability (`--s3-bucket`) against a test S3 server.

use super::*;
use kine_testkit::s3::{ACCESS_KEY, REGION, S3Server, SECRET_KEY};
use std::process::Command;

/// The S3 flags of a node on `folder` of bucket `kine`, with a 2-s writer lock lease.
pub fn s3_args(server: &S3Server, folder: &str) -> Vec<String> {
    s3_flags(&server.endpoint(), folder, "2s")
}

/// The S3 flags of a node on `folder` of bucket `kine` at `endpoint`, with the writer lock's
/// `lease`.
pub fn s3_flags(endpoint: &str, folder: &str, lease: &str) -> Vec<String> {
    [
        "--s3-bucket",
        "kine",
        "--s3-folder",
        folder,
        "--s3-endpoint",
        endpoint,
        "--s3-region",
        REGION,
        "--s3-access-key",
        ACCESS_KEY,
        "--s3-secret-key",
        SECRET_KEY,
        "--s3-lock-lease",
        lease,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn start(dir: &std::path::Path, s3: &[String], extra: &[&str]) -> Server {
    let endpoint = db_endpoint(dir);
    let mut args: Vec<&str> = vec!["--endpoint", &endpoint];
    args.extend(s3.iter().map(String::as_str));
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// [`start`], returning once the node writes: one that finds the writer lock still held (a
/// killed writer's, until its lease runs out) serves a read-only copy first.
pub fn start_writing(dir: &std::path::Path, s3: &[String], extra: &[&str]) -> Server {
    let node = start(dir, s3, extra);
    let begun = std::time::Instant::now();
    while !node.log().contains("shipping the datastore to S3") && !node.log().contains("took the S3 writer lock") {
        assert!(begun.elapsed() < std::time::Duration::from_secs(30), "the node does not write: {}", node.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    node
}

/// kine-rs with these flags fails at start; its stderr.
pub fn refused(dir: &std::path::Path, s3: &[String], extra: &[&str]) -> String {
    let endpoint = db_endpoint(dir);
    let mut cmd = Command::new(server_bin());
    cmd.args(["--endpoint", &endpoint, "--listen-address", "127.0.0.1:0"]).args(s3).args(extra);
    let (ok, _, stderr) = run(&mut cmd);
    assert!(!ok, "kine-rs started: {stderr}");
    stderr
}
