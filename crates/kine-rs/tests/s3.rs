//! S3 durability of the SQLite datastore (`--s3-bucket`), end to end against a real
//! S3-compatible server (versitygw): a node whose disk is lost comes back from the bucket with
//! every key, past revisions, leases and users; a clean stop hands the writer lock over at
//! once; a database behind the bucket, the lost disk's database once the store was restored
//! elsewhere, another store's database, and bad flags are refused with errors that name the
//! problem.

mod common;
use common::s3::*;
use common::*;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use kine_testkit::s3::{ACCESS_KEY, REGION, S3Server, SECRET_KEY};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_disk_comes_back_from_s3() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "cluster");
    let (first, second) = (TempDir::new("s3-first"), TempDir::new("s3-second"));

    // Writes acknowledged only once they are in S3.
    let node = start(first.path(), &s3, &["--s3-sync"]);
    let mut c = node.client().await;
    for i in 0..50 {
        c.put(format!("/registry/pods/p{i}"), format!("v{i}"), None).await.unwrap();
    }
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("/registry/leases/l", "held", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    c.delete("/registry/pods/p3", None).await.unwrap();
    let txn = Txn::new()
        .when([Compare::mod_revision("/registry/pods/p4", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("/registry/pods/p4", "v4b", None), TxnOp::put("/registry/pods/new", "n", None)]);
    c.txn(txn).await.unwrap();
    let past = c.get("/", Some(GetOptions::new().with_prefix())).await.unwrap().header().unwrap().revision();
    c.put("/registry/pods/p5", "v5b", None).await.unwrap();
    c.compact(past - 10, None).await.unwrap();
    c.user_add("alice", "secret", None).await.unwrap();
    let before = everything(&mut c).await;
    let at_past = keys_at(&mut c, past).await;
    drop(c);
    node.signal("KILL");
    drop(node);

    // A node on an empty data directory restores the store: keys, a past revision, the lease
    // and its key, the compact revision, the user. (While the killed writer's lease runs, it
    // follows: its database is filled then, and the takeover finds it current.)
    let node = start_writing(second.path(), &s3, &[]);
    let log = node.log();
    let filled = log.contains("the local database holds the S3 store") && log.contains("caught up with the S3 store");
    assert!(log.contains("restored the store from S3") || filled, "{log}");
    let mut c = node.client().await;
    assert_eq!(everything(&mut c).await, before);
    assert_eq!(keys_at(&mut c, past).await, at_past);
    let compacted = c.get("/", Some(GetOptions::new().with_revision(past - 11))).await.unwrap_err().to_string();
    assert!(compacted.contains("required revision has been compacted"), "{compacted}");
    let leases = c.leases().await.unwrap();
    assert_eq!(leases.leases().iter().map(|l| l.id()).collect::<Vec<_>>(), vec![lease]);
    let users = c.user_list().await.unwrap();
    assert_eq!(users.users(), ["alice"]);

    // It writes on; without --s3-sync the change is in S3 within the ship interval.
    c.put("/registry/pods/after", "x", None).await.unwrap();
    let after = everything(&mut c).await;
    drop(c);
    let mut node = node;
    assert!(node.stop("TERM").await.success(), "{}", node.log());
    assert!(node.log().contains("writer lock released"), "{}", node.log());

    // The database it left, in step with the bucket, serves again at once: the lock was released.
    let copy = TempDir::new("s3-copy");
    for f in std::fs::read_dir(second.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join(f.file_name().unwrap())).unwrap();
    }
    let started = std::time::Instant::now();
    let mut node = start(second.path(), &s3, &[]);
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "waited for the lock: {}", node.log());
    assert!(!node.log().contains("restored"), "{}", node.log());
    let mut c = node.client().await;
    assert_eq!(everything(&mut c).await, after);
    c.put("/registry/pods/later", "y", None).await.unwrap();
    drop(c);
    assert!(node.stop("TERM").await.success(), "{}", node.log());

    // A copy of that database from before its last write is behind the bucket: refused.
    let err = refused(copy.path(), &s3, &[]);
    assert!(err.contains("behind the S3 prefix"), "{err}");
    // The lost disk's database, if it comes back, is the store before the restore: refused.
    let err = refused(first.path(), &s3, &[]);
    assert!(err.contains("holds another store"), "{err}");

    // Another store's database on this folder is refused.
    let other = TempDir::new("s3-other");
    let mut lone = start(other.path(), &[], &[]);
    lone.client().await.put("x", "y", None).await.unwrap();
    assert!(lone.stop("TERM").await.success());
    let err = refused(other.path(), &s3, &[]);
    assert!(err.contains("holds another store"), "{err}");
}

#[tokio::test]
async fn bad_s3_settings_are_refused_at_start() {
    let server = S3Server::start(&["kine"]);
    let dir = TempDir::new("s3-bad");
    let good = s3_args(&server, "bad");
    let with = |flag: &str, value: &str| {
        let mut args = good.clone();
        let i = args.iter().position(|a| a == flag).unwrap();
        args[i + 1] = value.to_string();
        args
    };
    let err = refused(dir.path(), &with("--s3-bucket", "missing"), &[]);
    assert!(err.contains("--s3-bucket") && err.contains("NoSuchBucket"), "{err}");
    let err = refused(dir.path(), &with("--s3-secret-key", "wrong"), &[]);
    assert!(err.contains("--s3-bucket") && err.contains("SignatureDoesNotMatch"), "{err}");
    // Without keys in flags or in this machine's AWS settings.
    let no_keys: Vec<String> = good[..good.len() - 6].to_vec();
    let refused_without_keys = |extra: &[&str]| {
        let mut cmd = Command::new(server_bin());
        cmd.args(["--endpoint", &db_endpoint(dir.path()), "--listen-address", "127.0.0.1:0"]).args(&no_keys);
        without_aws_credentials(&mut cmd).args(extra);
        let (ok, _, err) = run(&mut cmd);
        assert!(!ok, "kine-rs started: {err}");
        err
    };
    let err = refused_without_keys(&[]);
    assert!(err.contains("no S3 credentials") && err.contains("--s3-access-key"), "{err}");
    let err = refused_without_keys(&["--s3-access-key", ACCESS_KEY]);
    assert!(err.contains("--s3-access-key needs --s3-secret-key"), "{err}");
    let err = refused_without_keys(&["--s3-session-token", "t"]);
    assert!(err.contains("--s3-session-token needs --s3-access-key"), "{err}");
    let err = refused(dir.path(), &good, &["--s3-ca-bundle", "/nonexistent/ca.pem"]);
    assert!(err.contains("--s3-ca-bundle: cannot read /nonexistent/ca.pem"), "{err}");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "garbage").unwrap();
    let err = refused(dir.path(), &good, &["--s3-ca-bundle", not_pem.to_str().unwrap()]);
    assert!(err.contains("--s3-ca-bundle") && err.contains("no certificate"), "{err}");
    let mut cmd = Command::new(server_bin());
    cmd.args(["--endpoint", "memory://", "--listen-address", "127.0.0.1:0"]).args(&good);
    let (ok, _, err) = run(&mut cmd);
    assert!(!ok && err.contains("works with the SQLite datastore"), "{err}");
}

/// No AWS credentials reach `cmd` from this machine's environment or files (nor from EC2's
/// instance metadata, which is not here).
fn without_aws_credentials(cmd: &mut Command) -> &mut Command {
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
        .env("AWS_CONFIG_FILE", "/nonexistent/config")
        .env("AWS_EC2_METADATA_DISABLED", "true")
}

/// An S3 server with a private CA (`--s3-ca-bundle`), and keys from an AWS profile file instead
/// of flags: the store is shipped and restored as with plain HTTP and static keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_ca_bundle_and_keys_from_an_aws_profile() {
    let certs = TempDir::new("s3-tls-certs");
    kine_testkit::certs::make_certs(certs.path());
    let server = S3Server::start_tls(&["kine"], &certs.path().join("server.crt"), &certs.path().join("server.key"));
    let profile = certs.path().join("credentials");
    std::fs::write(
        &profile,
        format!("[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[kine]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"),
    )
    .unwrap();
    let ca = certs.path().join("ca.crt");
    let s3: Vec<String> = s3_args(&server, "tls")[..8]
        .iter()
        .cloned()
        .chain(["--s3-ca-bundle".into(), ca.display().to_string()])
        .collect();
    let command = || {
        let mut cmd = Command::new(server_bin());
        without_aws_credentials(&mut cmd).env("AWS_SHARED_CREDENTIALS_FILE", &profile).env("AWS_PROFILE", "kine");
        cmd
    };
    let (first, second) = (TempDir::new("s3-tls-first"), TempDir::new("s3-tls-second"));
    let endpoint = db_endpoint(first.path());
    let mut args: Vec<&str> = vec!["--endpoint", &endpoint, "--s3-sync"];
    args.extend(s3.iter().map(String::as_str));
    let mut node = Server::start_command(command(), &args);
    let mut c = node.client().await;
    for i in 0..20 {
        c.put(format!("/registry/pods/p{i}"), "v", None).await.unwrap();
    }
    let before = everything(&mut c).await;
    drop(c);
    assert!(node.stop("TERM").await.success(), "{}", node.log());

    let endpoint = db_endpoint(second.path());
    let mut args: Vec<&str> = vec!["--endpoint", &endpoint];
    args.extend(s3.iter().map(String::as_str));
    let node = Server::start_command(command(), &args);
    let mut c = node.client().await;
    assert_eq!(everything(&mut c).await, before, "{}", node.log());
    drop(c);
    drop(node);

    // Without the bundle the test CA is unknown; the error says so.
    let mut cmd = command();
    cmd.args(["--endpoint", &db_endpoint(second.path()), "--listen-address", "127.0.0.1:0"]).args(&s3[..8]);
    let (ok, _, err) = run(&mut cmd);
    assert!(!ok && err.contains("--s3-bucket") && err.contains("UnknownIssuer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_replace_the_segments_before_them() {
    use kine_objstore::{ObjectStore, S3Config, S3Store, StaticKeys};
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "checkpoints");
    let (dir, restored) = (TempDir::new("s3-cp"), TempDir::new("s3-cp-restored"));
    let mut node = start(dir.path(), &s3, &["--s3-checkpoint-interval", "1s", "--s3-ship-interval", "100ms"]);
    let mut c = node.client().await;
    for i in 0..40 {
        c.put(format!("/k/{}", i % 7), format!("v{i}"), None).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let before = everything(&mut c).await;
    let mut at = std::collections::BTreeMap::new();
    for rev in 1..=before.0 {
        at.insert(rev, keys_at(&mut c, rev).await);
    }
    drop(c);
    assert!(node.stop("TERM").await.success(), "{}", node.log());
    assert!(node.log().matches("S3 checkpoint written").count() >= 2, "{}", node.log());

    let config = S3Config {
        bucket: "kine".into(),
        folder: "checkpoints".into(),
        endpoint: Some(server.endpoint()),
        region: REGION.into(),
        keys: Some(StaticKeys::new(ACCESS_KEY, SECRET_KEY)),
        ca_bundle: None,
    };
    let store = S3Store::connect(&config).await.unwrap();
    let (manifest, _) = kine_durable::manifest::read(&store, None).await.unwrap().unwrap();
    let newest = manifest.checkpoint.expect("a checkpoint in the manifest");
    // Kept: the newest checkpoint and the one before it, and the segments after that one.
    let folders: std::collections::BTreeSet<String> =
        store.list("checkpoint/").await.unwrap().iter().map(|n| n[..n.rfind('/').unwrap() + 1].to_string()).collect();
    assert_eq!(folders.len(), 2, "{folders:?}");
    assert_eq!(folders.last(), Some(&newest.object));
    let kept_from = folders.first().unwrap().clone();
    let segments = store.list("wal/").await.unwrap();
    let first = segments.first().and_then(|n| kine_durable::segment::parse_name(n)).unwrap();
    assert!(first.1 > 1, "the first segments were removed: {segments:?} (the oldest checkpoint kept: {kept_from})");

    let node = start(restored.path(), &s3, &[]);
    assert!(node.log().contains(&format!("checkpoint=Some({})", newest.revision)), "{}", node.log());
    assert_eq!(everything(&mut node.client().await).await, before);
    drop(node);

    // Point in time: `s3-restore` into a new database, up to a revision between the two
    // checkpoints kept (from the older one) and up to the newest.
    let previous = manifest.previous.expect("the checkpoint before the newest");
    for (revision, from) in [(previous.revision + 1, previous.revision), (before.0, newest.revision)] {
        let target = TempDir::new("s3-pitr");
        let endpoint = db_endpoint(target.path());
        let mut cmd = Command::new(server_bin());
        cmd.args(["--endpoint", &endpoint]).args(&s3).args(["s3-restore", "--revision", &revision.to_string()]);
        let (ok, _, log) = run(&mut cmd);
        assert!(ok && log.contains(&format!("checkpoint=Some({from})")), "{log}");
        let (ok, _, err) = run(&mut cmd);
        assert!(!ok && err.contains("exists; s3-restore writes a new database"), "{err}");
        let copy = Server::start(&["--endpoint", &endpoint]);
        let mut c = copy.client().await;
        assert_eq!(everything(&mut c).await, (revision, at[&revision].clone()), "restored up to {revision}");
    }
    let target = TempDir::new("s3-pitr-old");
    let mut cmd = Command::new(server_bin());
    cmd.args(["--endpoint", &db_endpoint(target.path())]).args(&s3).args(["s3-restore", "--revision", "2"]);
    let (ok, _, err) = run(&mut cmd);
    assert!(!ok && err.contains("before the oldest checkpoint kept"), "{err}");
    assert!(!target.path().join("state.db").exists(), "a failed restore leaves no database behind");
}

/// The keys of the next watch response that has events.
async fn next_keys(watch: &mut etcd_client::WatchStream) -> Vec<String> {
    loop {
        let m = watch.message().await.unwrap().expect("a watch message");
        if !m.events().is_empty() {
            return m.events().iter().map(|e| String::from_utf8_lossy(e.kv().unwrap().key()).into_owned()).collect();
        }
    }
}

/// S3 stalls (SIGSTOP of the server): with --s3-sync a write fails with etcd's timeout instead
/// of hanging, and once S3 answers again it is shipped with everything after it; S3 stalled
/// past the writer lock's lease makes the node stop (it can no longer prove it is the writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_s3_fails_writes_cleanly_and_loses_nothing() {
    let server = S3Server::start(&["kine"]);
    let mut s3 = s3_args(&server, "stall");
    let lease = s3.iter().position(|a| a == "--s3-lock-lease").unwrap();
    s3[lease + 1] = "10s".into();
    let (dir, restored) = (TempDir::new("s3-stall"), TempDir::new("s3-stall-restored"));
    let pid = server.pid().to_string();
    let signal = |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());

    let node = start(dir.path(), &s3, &["--s3-sync", "--request-timeout", "2s"]);
    let mut c = node.client().await;
    let mut watch = c.watch("/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    c.put("/a", "1", None).await.unwrap();
    assert_eq!(next_keys(&mut watch).await, ["/a"]);
    signal("-STOP");
    let started = std::time::Instant::now();
    let err = c.put("/b", "2", None).await.unwrap_err().to_string();
    assert!(err.contains("request timed out"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "{:?}", started.elapsed());
    // Committed locally but not in S3: neither read nor watched (a node dying now loses it).
    let read = c.get("/b", None).await;
    assert!(read.as_ref().is_err_and(|e| e.to_string().contains("request timed out")), "{read:?}\n{}", node.log());
    let stale = c.get("/", Some(GetOptions::new().with_prefix().with_serializable())).await.unwrap();
    assert_eq!(stale.kvs().len(), 1, "a serializable read is as of the newest revision shipped: {stale:?}");
    assert_eq!(stale.header().unwrap().revision(), stale.kvs()[0].mod_revision());
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(500), next_keys(&mut watch)).await;
    assert!(quiet.is_err(), "the watch delivered an unshipped change: {quiet:?}");
    signal("-CONT");
    assert_eq!(next_keys(&mut watch).await, ["/b"]);
    c.put("/c", "3", None).await.unwrap();
    let after = everything(&mut c).await;
    assert_eq!(after.1.len(), 3, "the timed-out write was committed locally: {after:?}");
    drop(c);
    node.signal("KILL");
    drop(node);
    let node = start_writing(restored.path(), &s3, &[]);
    assert_eq!(everything(&mut node.client().await).await, after, "{}", node.log());

    // Stalled past the lease (10 s): the writer stops with an error naming the lock.
    signal("-STOP");
    let mut node = node;
    let status = node.stop_by_itself(std::time::Duration::from_secs(30)).await;
    signal("-CONT");
    assert!(!status.success(), "{}", node.log());
    assert!(node.log().contains("S3 writer lock was not renewed within its lease"), "{}", node.log());
}

/// A node that never wrote loses its disk: the next one, on an empty database, takes the prefix.
#[tokio::test]
async fn an_empty_database_takes_over_a_prefix_that_never_wrote() {
    let server = S3Server::start(&["kine"]);
    let s3 = s3_args(&server, "unused");
    let (first, second) = (TempDir::new("s3-unused"), TempDir::new("s3-unused-next"));
    let node = start(first.path(), &s3, &[]);
    node.signal("KILL");
    drop(node);
    let node = start_writing(second.path(), &s3, &[]);
    let mut c = node.client().await;
    c.put("k", "v", None).await.unwrap();
    assert_eq!(everything(&mut c).await.0, 2, "{}", node.log());
}
