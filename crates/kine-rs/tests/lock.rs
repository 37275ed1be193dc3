//! The Lock service (v3lock) over real gRPC: exclusion, release by Unlock and by lease expiry,
//! a withdrawn waiter, etcd's errors, `etcdctl lock` clients mixed in, and two nodes on one
//! NATS bucket.

mod common;
use common::copies::status_of;
use common::*;
use etcd_client::*;
use kine_testkit::nats::NatsServer;
use std::process::Stdio;
use std::time::Duration;

const WAIT: Duration = Duration::from_millis(500);

/// How many keys start with `prefix`, polled until it is `want` (5 s at most).
async fn until_count(c: &mut Client, prefix: &str, want: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = c.get(prefix, Some(GetOptions::new().with_prefix())).await.unwrap().count();
        if n == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{prefix}: {n} keys, waited for {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Locks `name` with `lease` in a task; the task ends when the lock is held.
fn lock_in_task(mut c: Client, name: &'static str, lease: i64) -> tokio::task::JoinHandle<LockResponse> {
    tokio::spawn(async move { c.lock(name, Some(LockOptions::new().with_lease(lease))).await.unwrap() })
}

#[tokio::test]
async fn a_lock_excludes_until_unlocked_or_its_lease_expires() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let a = c.lease_grant(60, None).await.unwrap().id();
    let b = c.lease_grant(60, None).await.unwrap().id();
    let held = c.lock("job", Some(LockOptions::new().with_lease(a))).await.unwrap();
    // etcd's key: the name, "/", the lease id in lower-case hex; created by this request.
    assert_eq!(held.key(), format!("job/{a:x}").as_bytes());
    let kv = c.get(held.key(), None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.lease(), kv.value(), kv.create_revision()), (a, &b""[..], held.header().unwrap().revision()));
    // Locking again with the same lease holds it at once (the same key).
    let again = c.lock("job", Some(LockOptions::new().with_lease(a))).await.unwrap();
    assert_eq!(again.key(), held.key());

    let waiter = lock_in_task(server.client().await, "job", b);
    tokio::time::sleep(WAIT).await;
    assert!(!waiter.is_finished(), "a second lease got a held lock");
    let unlocked = c.unlock(held.key()).await.unwrap().header().unwrap().revision();
    let second = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("waiter woken").unwrap();
    assert_eq!(second.key(), format!("job/{b:x}").as_bytes());
    assert!(second.header().unwrap().revision() >= unlocked);

    // A holder whose lease is not kept alive loses the lock when it expires.
    let short = c.lease_grant(2, None).await.unwrap().id();
    let third = lock_in_task(server.client().await, "job", short);
    c.unlock(second.key()).await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap();
    let fourth = lock_in_task(server.client().await, "job", b);
    tokio::time::sleep(WAIT).await;
    assert!(!fourth.is_finished());
    tokio::time::timeout(Duration::from_secs(10), fourth).await.expect("released by the expiry").unwrap();
    assert!(c.get(third.key(), None).await.unwrap().kvs().is_empty());
}

#[tokio::test]
async fn lock_errors_and_defaults_are_etcds() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let e = c.lock("x", Some(LockOptions::new().with_lease(12345))).await.unwrap_err();
    // etcd's Lock service answers through its own client: Unknown, with the KV error's text.
    assert_eq!(status_of(e), (tonic::Code::Unknown, "etcdserver: requested lease not found".into()));
    // No lease: a new one of 60 s, never kept alive (etcd's server-side session).
    let held = c.lock("x", None).await.unwrap();
    let kv = c.get(held.key(), None).await.unwrap().kvs()[0].clone();
    assert_eq!(held.key(), format!("x/{:x}", kv.lease()).as_bytes());
    let ttl = c.lease_time_to_live(kv.lease(), None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 60);
    // An empty name: the key is "/" and the lease (etcd 3.7 does the same).
    let l = c.lease_grant(60, None).await.unwrap().id();
    let empty = c.lock("", Some(LockOptions::new().with_lease(l))).await.unwrap();
    assert_eq!(empty.key(), format!("/{l:x}").as_bytes());
    // Unlock of a key that does not exist: a delete of nothing, no error.
    let r = c.unlock("x/none").await.unwrap();
    assert_eq!(r.header().unwrap().revision(), c.get("x", None).await.unwrap().header().unwrap().revision());

    // A waiter whose lease expires while it waits: its key is gone when its turn comes.
    let holder = c.lease_grant(60, None).await.unwrap().id();
    let blocked = c.lease_grant(1, None).await.unwrap().id();
    c.unlock(held.key()).await.unwrap();
    let first = c.lock("y", Some(LockOptions::new().with_lease(holder))).await.unwrap();
    let mut other = server.client().await;
    let waiting = tokio::spawn(async move { other.lock("y", Some(LockOptions::new().with_lease(blocked))).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.unlock(first.key()).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap().unwrap_err();
    assert_eq!(status_of(e), (tonic::Code::Unknown, "mutex: session is expired".into()));
}

#[tokio::test]
async fn a_waiter_that_goes_away_is_withdrawn() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let a = c.lease_grant(60, None).await.unwrap().id();
    let b = c.lease_grant(60, None).await.unwrap().id();
    c.lock("w", Some(LockOptions::new().with_lease(a))).await.unwrap();
    let mut gone = server.client().await;
    let r = tokio::time::timeout(WAIT, gone.lock("w", Some(LockOptions::new().with_lease(b)))).await;
    assert!(r.is_err(), "the lock was held");
    drop(gone);
    until_count(&mut c, "w/", 1).await;
    assert_eq!(c.get("w/", Some(GetOptions::new().with_prefix())).await.unwrap().kvs()[0].lease(), a);
}

/// `etcdctl lock NAME -- COMMAND` holds the lock while COMMAND runs.
fn etcdctl_lock(endpoint: &str, name: &str, command: &[&str]) -> std::process::Child {
    std::process::Command::new("etcdctl")
        .args(["--endpoints", endpoint, "lock", name, "--"])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("etcdctl (install-test-deps installs it)")
}

#[tokio::test]
async fn the_lock_service_and_etcdctl_lock_exclude_each_other() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let endpoint = server.url.clone();
    // etcdctl holds it for 2 s; a Lock request waits for that.
    let mut etcdctl = etcdctl_lock(&endpoint, "mixed", &["sleep", "2"]);
    until_count(&mut c, "mixed/", 1).await;
    let lease = c.lease_grant(60, None).await.unwrap().id();
    let started = std::time::Instant::now();
    let held = c.lock("mixed", Some(LockOptions::new().with_lease(lease))).await.unwrap();
    assert!(started.elapsed() > Duration::from_millis(1000), "got the lock while etcdctl held it");
    assert!(etcdctl.wait().unwrap().success());
    // Held through the service: etcdctl waits until it is unlocked.
    let mut etcdctl = etcdctl_lock(&endpoint, "mixed", &["echo", "got it"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(etcdctl.try_wait().unwrap().is_none(), "etcdctl got a held lock");
    c.unlock(held.key()).await.unwrap();
    let out = tokio::task::spawn_blocking(move || etcdctl.wait_with_output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("got it"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_bucket_share_a_lock() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=locks", nats.url());
    let (one, two) = (Server::start(&["--endpoint", &endpoint]), Server::start(&["--endpoint", &endpoint]));
    let (mut c1, c2) = (one.client().await, two.client().await);
    let a = c1.lease_grant(60, None).await.unwrap().id();
    let b = c1.lease_grant(60, None).await.unwrap().id();
    let held = c1.lock("shared", Some(LockOptions::new().with_lease(a))).await.unwrap();
    let waiter = lock_in_task(c2, "shared", b);
    tokio::time::sleep(WAIT).await;
    assert!(!waiter.is_finished(), "the other node granted a held lock");
    c1.unlock(held.key()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken on the other node").unwrap();
    assert_eq!(got.key(), format!("shared/{b:x}").as_bytes());
}
