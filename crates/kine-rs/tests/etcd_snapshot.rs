//! Snapshots in etcd's own format, against real etcd 3.6 and 3.7: a snapshot saved from kine-rs
//! (`etcdctl snapshot save`) is read by `etcdctl`/`etcdutl snapshot status`, restored by
//! `etcdutl snapshot restore` into a data directory that etcd serves with the same keys,
//! revisions, leases, users and roles; a snapshot saved from etcd restores into kine-rs the same
//! way; and a
//! damaged file is refused with a clear error. (etcd's format needs the Go shim, which holds
//! bbolt: the default build.)
#![cfg(feature = "embedded-nats")]

mod common;
#[path = "differential/etcd.rs"]
mod etcd;

use common::*;
use etcd::{Etcd, Version};
use etcd_client::*;
use kine_testkit::TempDir;
use kine_testkit::nats::{NatsServer, free_port};
use std::path::Path;
use std::process::Command;

/// Keys enough for several bbolt pages and a branch level, a value larger than a page, binary
/// keys, two keys written by one Txn, overwrites, a leased key, and a delete as the last write.
/// Returns the lease.
async fn populate(c: &mut Client) -> i64 {
    for i in 0..1500 {
        c.put(format!("/registry/configmaps/ns/{i:05}"), format!("value-{i}"), None).await.unwrap();
    }
    for i in (0..1500).step_by(7) {
        c.put(format!("/registry/configmaps/ns/{i:05}"), "updated", None).await.unwrap();
    }
    c.put(vec![0u8, 255, 1], vec![0u8, 0, 200], None).await.unwrap();
    c.put("big", vec![b'x'; 100_000], None).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("leased", "v", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    c.txn(Txn::new().and_then([TxnOp::put("t1", "a", None), TxnOp::put("t2", "b", None)])).await.unwrap();
    c.put("gone", "soon", None).await.unwrap();
    c.delete("gone", None).await.unwrap();
    lease
}

/// Users and roles, then auth on: `root`, and `reader` who may read the configmaps only.
async fn secure(c: &mut Client) {
    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("configmap-reader").await.unwrap();
    let perm = Permission::read("/registry/configmaps/").with_prefix();
    c.role_grant_permission("configmap-reader", perm).await.unwrap();
    c.user_add("reader", "readerpw", None).await.unwrap();
    c.user_grant_role("reader", "configmap-reader").await.unwrap();
    c.auth_enable().await.unwrap();
}

async fn as_user(url: &str, user: &str, password: &str) -> Client {
    Client::connect([url], Some(ConnectOptions::new().with_user(user, password))).await.unwrap()
}

/// The users, roles and auth switch came along: `reader` reads what its role allows and
/// nothing else, a wrong password and anonymous requests are refused.
async fn assert_secured(url: &str) {
    let mut reader = as_user(url, "reader", "readerpw").await;
    let got = reader.get("/registry/configmaps/ns/00001", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"value-1");
    let denied = reader.put("/registry/configmaps/ns/00001", "x", None).await.unwrap_err().to_string();
    assert!(denied.contains("permission denied"), "{denied}");
    let mut anonymous = Client::connect([url], None).await.unwrap();
    let refused = anonymous.get("big", None).await.unwrap_err().to_string();
    assert!(refused.contains("user name is empty"), "{refused}");
    let wrong = Client::connect([url], Some(ConnectOptions::new().with_user("reader", "nope"))).await.err();
    assert!(wrong.is_some_and(|e| e.to_string().contains("authentication failed")), "a wrong password is refused");
}

/// `etcdctl snapshot save`, as root when auth is on. etcdctl 3.4 gives the whole command,
/// sign-in included, 5 s by default: a debug build on a busy machine may need more.
fn save(url: &str, file: &Path, root: bool) {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3").args(["--endpoints", url, "--command-timeout", "60s"]);
    if root {
        cmd.args(["--user", "root:rootpw"]);
    }
    let (ok, out, err) = run(cmd.args(["snapshot", "save"]).arg(file));
    assert!(ok && format!("{out}{err}").contains("Snapshot saved"), "etcdctl snapshot save failed: {out}{err}");
}

/// `etcdutl snapshot status -w json`: (revision, totalKey).
fn etcdutl_status(version: Version, file: &Path) -> (i64, i64) {
    let (ok, out, err) = run(Command::new(version.etcdutl()).args(["snapshot", "status", "-w", "json"]).arg(file));
    assert!(ok, "etcdutl {version:?} snapshot status failed: {out}{err}");
    let status: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    (status["revision"].as_i64().unwrap(), status["totalKey"].as_i64().unwrap())
}

/// What the store a snapshot was taken from served.
struct Source {
    revision: i64,
    kvs: Vec<Kv>,
    /// Past revisions, and the keys at each.
    past: Vec<i64>,
    history: Vec<Vec<Kv>>,
    compacted: Option<i64>,
    lease: i64,
}

/// The restored store (`c`, a root client of `url`) serves what the source did: the same keys
/// at the same revision, the same keys at past revisions, "compacted" below the compaction,
/// the lease and its key, the users and roles; its next write gets the next revision.
async fn serves_as_the_source_did(c: &mut Client, url: &str, source: &Source, who: &str) {
    assert_eq!(
        everything(c).await,
        (source.revision, source.kvs.clone()),
        "{who} serves the same keys at the same revision"
    );
    for (at, expected) in source.past.iter().zip(&source.history) {
        assert_eq!(&keys_at(c, *at).await, expected, "{who} at revision {at}");
    }
    if let Some(at) = source.compacted {
        let refused = c.get("big", Some(GetOptions::new().with_revision(at - 1))).await.unwrap_err().to_string();
        assert!(refused.contains("required revision has been compacted"), "{refused}");
    }
    assert_secured(url).await;
    let ttl = c.lease_time_to_live(source.lease, Some(LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
    assert_eq!((ttl.granted_ttl(), ttl.keys().to_vec()), (600, vec![b"leased".to_vec()]));
    let r = c.put("next", "1", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), source.revision + 1);
}

/// A snapshot of a store compacted at `compacted` (or never) serves in etcd with the history
/// etcd would hold: every revision since the compaction.
async fn kine_rs_snapshot_serves_in_etcd(version: Version, compacted: Option<i64>, nats: bool) {
    let nats = nats.then(NatsServer::start);
    // Cheap password hashes (etcd verifies any cost); the etcd-to-kine-rs tests keep etcd's own.
    let (server, dir) = match &nats {
        Some(nats) => {
            let endpoint = format!("{}?noEmbed", nats.url());
            (Server::start(&["--endpoint", &endpoint, "--bcrypt-cost", "4"]), TempDir::new("nats-snapshot"))
        }
        None => sqlite_server(&["--bcrypt-cost", "4"]),
    };
    let mut c = server.client().await;
    let lease = populate(&mut c).await;
    if let Some(at) = compacted {
        c.compact(at, None).await.unwrap();
    }
    let (revision, kvs) = everything(&mut c).await;
    let first = compacted.unwrap_or(2);
    let past = [first, first + 1, 1500, 1600, revision - 3, revision - 1];
    let mut history = Vec::new();
    for at in past {
        history.push(keys_at(&mut c, at).await);
    }
    secure(&mut c).await;
    let file = dir.path().join("kine-rs.db");
    save(&server.url, &file, true);

    // etcd's tools read it: etcdctl 3.4 checks the bbolt file and hashes it; etcdutl also
    // decodes every key (the history since the compaction: the last revision is a delete's).
    let (ok, out, err) = run(Command::new("etcdctl").env("ETCDCTL_API", "3").args(["snapshot", "status"]).arg(&file));
    assert!(ok, "etcdctl snapshot status failed: {out}{err}");
    assert_eq!(etcdutl_status(version, &file), (revision, kvs.len() as i64));

    // etcdutl turns it into a member's data directory, and etcd serves it as it was.
    let etcd_dir = TempDir::new("etcd-restored");
    let data = etcd_dir.path().join("data");
    let peer = free_port();
    let peer_url = format!("http://127.0.0.1:{peer}");
    let (ok, out, err) = run(Command::new(version.etcdutl())
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&data)
        .args(["--name", "restored", "--initial-cluster", &format!("restored={peer_url}")])
        .args(["--initial-advertise-peer-urls", &peer_url]));
    assert!(ok, "etcdutl {version:?} snapshot restore failed: {out}{err}");
    let etcd = Etcd::start_on(version, etcd_dir, &data, "restored", peer);
    let mut e = as_user(&etcd.url, "root", "rootpw").await;
    let source = Source { revision, kvs, past: past.to_vec(), history, compacted, lease };
    serves_as_the_source_did(&mut e, &etcd.url, &source, &format!("etcd {version:?}")).await;
}

#[tokio::test]
async fn a_kine_rs_snapshot_restores_into_etcd_3_6() {
    kine_rs_snapshot_serves_in_etcd(Version::V3_6, None, false).await;
}

#[tokio::test]
async fn a_kine_rs_snapshot_restores_into_etcd_3_7() {
    kine_rs_snapshot_serves_in_etcd(Version::V3_7, Some(1000), false).await;
}

/// On NATS a Txn writing n keys spends n revisions (n - 1 without events): etcd takes the gaps.
#[tokio::test]
async fn a_kine_rs_snapshot_from_nats_restores_into_etcd_3_7() {
    kine_rs_snapshot_serves_in_etcd(Version::V3_7, Some(1000), true).await;
}

/// `kine-rs snapshot restore` of `file` into a new SQLite database, served; a root client.
async fn restore_and_serve(file: &Path, dir: &Path, name: &str) -> (Server, Client) {
    let endpoint = format!("sqlite://{}", dir.join(format!("{name}.sqlite")).display());
    let (ok, _, err) = run(Command::new(server_bin()).args(["--endpoint", &endpoint, "snapshot", "restore"]).arg(file));
    assert!(ok && err.contains("snapshot restored"), "kine-rs snapshot restore of {} failed: {err}", file.display());
    let server = Server::start(&["--endpoint", &endpoint]);
    let client = as_user(&server.url, "root", "rootpw").await;
    (server, client)
}

/// A snapshot of etcd compacted at `compacted` (or never) serves in kine-rs with its history.
async fn etcd_snapshot_serves_in_kine_rs(version: Version, compacted: Option<i64>) {
    let etcd = Etcd::start(version);
    let mut e = Client::connect([etcd.url.as_str()], None).await.unwrap();
    let lease = populate(&mut e).await;
    if let Some(at) = compacted {
        e.compact(at, None).await.unwrap();
    }
    let (revision, kvs) = everything(&mut e).await;
    let first = compacted.unwrap_or(2);
    let past = [first, first + 1, 1500, 1600, revision - 3, revision - 1];
    let mut history = Vec::new();
    for at in past {
        history.push(keys_at(&mut e, at).await);
    }
    secure(&mut e).await;
    let dir = TempDir::new("etcd-snapshot");
    let file = dir.path().join("etcd.db");
    save(&etcd.url, &file, true);
    let etcd_dir = etcd.stop();
    // A stopped member's own file restores the same way as a snapshot.
    let member_db = etcd_dir.path().join("data/member/snap/db");
    let (member_server, mut member) = restore_and_serve(&member_db, dir.path(), "member").await;
    assert_eq!(everything(&mut member).await, (revision, kvs.clone()), "from etcd {version:?}'s member db");
    drop(member_server);

    let (server, mut c) = restore_and_serve(&file, dir.path(), "snapshot").await;
    let source = Source { revision, kvs, past: past.to_vec(), history, compacted, lease };
    serves_as_the_source_did(&mut c, &server.url, &source, &format!("kine-rs from etcd {version:?}")).await;
}

#[tokio::test]
async fn an_etcd_3_6_snapshot_restores_into_kine_rs() {
    etcd_snapshot_serves_in_kine_rs(Version::V3_6, None).await;
}

#[tokio::test]
async fn an_etcd_3_7_snapshot_restores_into_kine_rs() {
    etcd_snapshot_serves_in_kine_rs(Version::V3_7, Some(500)).await;
}

/// A restore of `bytes` fails with a message containing `expect`, exits (no crash), and
/// writes no database.
fn refused(dir: &Path, name: &str, bytes: &[u8], expect: &str) {
    let file = dir.join(name);
    std::fs::write(&file, bytes).unwrap();
    let restored = dir.join(format!("{name}.sqlite"));
    let out = Command::new(server_bin())
        .args(["--endpoint", &format!("sqlite://{}", restored.display()), "snapshot", "restore"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{name}: exit status {:?}: {err}", out.status);
    assert!(err.contains(expect), "{name}: expected {expect:?} in: {err}");
    assert!(!restored.exists(), "{name}: a refused restore writes nothing");
}

fn with_sha256(body: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut f = body.to_vec();
    f.extend_from_slice(&sha2::Sha256::digest(body));
    f
}

#[tokio::test]
async fn damaged_etcd_snapshots_are_refused_clearly() {
    let (server, dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    populate(&mut c).await;
    let file = dir.path().join("good.db");
    save(&server.url, &file, false);
    let good = std::fs::read(&file).unwrap();
    let body = &good[..good.len() - 32];
    let page = u32::from_le_bytes(body[24..28].try_into().unwrap()) as usize;

    let mut flipped = good.clone();
    flipped[3 * page + 40] ^= 0x55;
    refused(dir.path(), "flipped", &flipped, "sha256 does not match");
    refused(dir.path(), "truncated", &body[..body.len() / 2], "truncated");
    refused(dir.path(), "truncated-with-sha", &with_sha256(&body[..body.len() / 2 / 512 * 512]), "truncated");
    let mut metas = body.to_vec();
    metas[16] ^= 1;
    metas[page + 16] ^= 1;
    refused(dir.path(), "metas", &with_sha256(&metas), "both bbolt meta pages are damaged");
    // Pages garbled behind a valid sha256 (a file damaged before it was hashed): bbolt's check
    // or the key decoding finds it.
    let mut garbled = body.to_vec();
    for b in &mut garbled[2 * page..] {
        *b = b.wrapping_mul(31).wrapping_add(7);
    }
    refused(dir.path(), "garbled", &with_sha256(&garbled), "the bbolt file is damaged");

    // The undamaged file restores.
    let restored = dir.path().join("ok.sqlite");
    let (ok, _, err) = run(Command::new(server_bin())
        .args(["--endpoint", &format!("sqlite://{}", restored.display()), "snapshot", "restore"])
        .arg(&file));
    assert!(ok, "{err}");
}
