//! A disk that fills up under kine-rs (a small tmpfs of its own, filled by another file): writes
//! fail with etcd's NOSPACE alarm and error, reads and watches keep working, nothing
//! acknowledged is lost, and once space is freed and the alarm disarmed (`etcdctl alarm
//! disarm`) writes work again; a restart afterwards finds every acknowledged write.
//!
//! The embedded NATS server on a small disk reaches JetStream's storage limit (75% of the disk)
//! first: the same NOSPACE, and compaction — which must work on a full store — makes room.
//!
//! PostgreSQL and MariaDB keep their write-ahead logs on a disk with room, and the tables on the
//! small disk (a tablespace; a database directory): the database refuses to grow the tables
//! with its "disk full" error (SQLSTATE 53100; MariaDB 1114 "The table is full"), which
//! kine-rs turns into the same NOSPACE.
//!
//! Needs root (a tmpfs mount); fails, not skips, without it.

mod common;
use common::*;
use etcd_client::{Client, GetOptions, WatchOptions};
use kine_chaos::SmallDisk;
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::postgres::PgServer;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SPACE_EXCEEDED: &str = "etcdserver: mvcc: database space exceeded";

/// Puts values of `size` bytes on `keys` keys until the datastore refuses for lack of space,
/// recording the acknowledged writes.
async fn fill_up(client: &mut Client, acked: &mut BTreeMap<String, (i64, Vec<u8>)>, size: usize, keys: usize) {
    for i in 0..100_000 {
        let key = format!("/disk/k{:05}", i % keys);
        let value = format!("{i:08}-{}", "x".repeat(size)).into_bytes();
        match client.put(key.as_str(), value.clone(), None).await {
            Ok(r) => {
                acked.insert(key, (r.header().unwrap().revision(), value));
            }
            Err(etcd_client::Error::GRpcStatus(s)) => {
                assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
                assert_eq!(s.message(), SPACE_EXCEEDED);
                return;
            }
            Err(e) => panic!("put {i}: {e}"),
        }
    }
    panic!("100,000 puts fitted on a full disk");
}

async fn put_refused(client: &mut Client) {
    let err = client.put("/disk/refused", "v", None).await.expect_err("a put while NOSPACE is raised");
    match err {
        etcd_client::Error::GRpcStatus(s) => {
            assert_eq!((s.code(), s.message()), (tonic::Code::ResourceExhausted, SPACE_EXCEEDED))
        }
        e => panic!("{e}"),
    }
}

async fn assert_all_present(client: &mut Client, acked: &BTreeMap<String, (i64, Vec<u8>)>) {
    let all = client.get("/disk/", Some(GetOptions::new().with_prefix())).await.unwrap();
    let found: BTreeMap<String, (i64, Vec<u8>)> = all
        .kvs()
        .iter()
        .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), (kv.mod_revision(), kv.value().to_vec())))
        .collect();
    assert_eq!(found.len(), acked.len());
    for (k, v) in acked {
        assert_eq!(found.get(k), Some(v), "{k}: acknowledged write missing or changed");
    }
}

/// The watch delivered every acknowledged write up to `newest`, in revision order.
async fn delivered_everything(
    w: &mut etcd_client::WatchStream,
    name: &str,
    newest: i64,
    acked: &BTreeMap<String, (i64, Vec<u8>)>,
) {
    let mut seen = BTreeMap::new();
    let mut last = 0;
    while last < newest {
        let m = tokio::time::timeout(Duration::from_secs(10), w.message()).await.expect(name).unwrap().unwrap();
        for e in m.events() {
            let kv = e.kv().unwrap();
            assert!(kv.mod_revision() > last, "{name}: out of order");
            last = kv.mod_revision();
            seen.insert(String::from_utf8_lossy(kv.key()).into_owned(), (last, kv.value().to_vec()));
        }
    }
    assert_eq!(&seen, acked, "{name} watch");
}

fn disarm(url: &str) {
    let out = Command::new("etcdctl")
        .args(["--endpoints", url, "alarm", "disarm"])
        .output()
        .expect("etcdctl (install-test-deps installs it)");
    assert!(out.status.success(), "etcdctl alarm disarm: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("alarm:NOSPACE"), "{}", String::from_utf8_lossy(&out.stdout));
}

async fn nospace_raised(client: &mut Client) {
    let alarms = client.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await.unwrap();
    let raised: Vec<_> = alarms.alarms().iter().map(|a| a.alarm()).collect();
    assert!(raised.contains(&etcd_client::AlarmType::Nospace), "{raised:?}");
}

/// kine-rs on a datastore on a small disk of its own, a client, and a watch of `/disk/` from
/// the start (it must see every acknowledged write, before and after the disk fills).
struct OnSmallDisk {
    disk: SmallDisk,
    endpoint: String,
    server: Server,
    client: Client,
    watch: etcd_client::WatchStream,
    _parent: TempDir,
}

impl OnSmallDisk {
    async fn start(name: &str, size_mib: u64, endpoint: impl FnOnce(&Path) -> String) -> OnSmallDisk {
        let parent = TempDir::new(name);
        let disk = SmallDisk::mount(parent.path(), size_mib).expect("a small file system");
        let endpoint = endpoint(&disk.path);
        let server = Server::start(&["--endpoint", &endpoint]);
        let mut client = server.client().await;
        let mut watch = client.watch("/disk/", Some(WatchOptions::new().with_prefix())).await.unwrap();
        assert!(watch.message().await.unwrap().unwrap().created());
        OnSmallDisk { disk, endpoint, server, client, watch, _parent: parent }
    }

    /// A restart on the same store after the episode: nothing lost, nothing half-written.
    async fn restart_and_check(self, acked: &BTreeMap<String, (i64, Vec<u8>)>) {
        let OnSmallDisk { disk, endpoint, server, client, watch, _parent } = self;
        drop((watch, client, server));
        let server = Server::start(&["--endpoint", &endpoint]);
        assert_all_present(&mut server.client().await, acked).await;
        drop(server);
        drop(disk);
    }
}

/// The episode on a datastore whose tables fill the small disk: a few writes, the disk filled
/// by another file, writes until refused with NOSPACE, reads and watches still served, space
/// freed, writes refused until `etcdctl alarm disarm`, then accepted; nothing lost, in order.
async fn full_disk_episode(mut run: OnSmallDisk) {
    let (disk, client) = (&run.disk, &mut run.client);
    let mut acked = BTreeMap::new();

    // Room for a few writes, then a full disk.
    for i in 0..50 {
        let r = client.put(format!("/disk/early{i}"), "v", None).await.unwrap();
        acked.insert(format!("/disk/early{i}"), (r.header().unwrap().revision(), b"v".to_vec()));
    }
    let filler = disk.fill().expect("fill the disk");
    fill_up(client, &mut acked, 900, 3000).await;
    eprintln!("{} writes acknowledged before the disk was full; {} bytes free", acked.len(), disk.free_bytes());

    // NOSPACE is raised, and every further write is refused at once; reads still answer.
    nospace_raised(client).await;
    put_refused(client).await;
    assert_all_present(client, &acked).await;
    let mut replay =
        client.watch("/disk/", Some(WatchOptions::new().with_prefix().with_start_revision(1))).await.unwrap();

    // Space comes back; the alarm stays until disarmed, as in etcd.
    std::fs::remove_file(filler).unwrap();
    put_refused(client).await;
    disarm(&run.server.url);
    let r = client.put("/disk/after", "v", None).await.expect("a put after disarm");
    acked.insert("/disk/after".into(), (r.header().unwrap().revision(), b"v".to_vec()));
    assert_all_present(client, &acked).await;

    // Both watches delivered every acknowledged revision, in order.
    let newest = r.header().unwrap().revision();
    delivered_everything(&mut run.watch, "live", newest, &acked).await;
    delivered_everything(&mut replay, "replay", newest, &acked).await;

    run.restart_and_check(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_raises_nospace_and_recovers_after_disarm() {
    let run = OnSmallDisk::start("disk-full", 24, |d| format!("sqlite://{}", d.join("state.db").display())).await;
    full_disk_episode(run).await;
}

/// The server's user owns `dir` (a database server refuses a directory it does not own).
fn give(dir: &Path, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown the small disk");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tablespace_on_a_full_disk_raises_nospace_and_recovers_after_disarm() {
    let pg = PgServer::start();
    let run = OnSmallDisk::start("pg-full", 24, |d| {
        give(d, pg.os_user());
        pg.sql("postgres", &format!("CREATE TABLESPACE small LOCATION '{}'", d.display()));
        pg.sql("postgres", "CREATE DATABASE kine TABLESPACE small");
        pg.url("kine")
    })
    .await;
    full_disk_episode(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_database_on_a_full_disk_raises_nospace_and_recovers_after_disarm() {
    let db = MariaDbServer::start();
    let run = OnSmallDisk::start("mariadb-full", 24, |d| {
        // A database is a directory of the data directory: this one is on the small disk.
        give(d, db.os_user());
        std::os::unix::fs::symlink(d, db.data_dir().join("kine")).expect("link the database directory");
        db.url("kine")
    })
    .await;
    full_disk_episode(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_nats_store_full_raises_nospace_and_compaction_makes_room() {
    let mut run = OnSmallDisk::start("nats-full", 32, |d| format!("nats://?dataDir={}", d.join("js").display())).await;
    let (disk, client) = (&run.disk, &mut run.client);
    let mut acked = BTreeMap::new();

    // 32 KiB values on 100 keys: JetStream's limit (75% of the 32 MiB disk) comes first.
    fill_up(client, &mut acked, 32 * 1024, 100).await;
    eprintln!("{} keys, {} bytes free on the disk", acked.len(), disk.free_bytes());
    nospace_raised(client).await;
    put_refused(client).await;
    assert_all_present(client, &acked).await;
    let mut replay =
        client.watch("/disk/", Some(WatchOptions::new().with_prefix().with_start_revision(1))).await.unwrap();
    let newest_before = acked.values().map(|v| v.0).max().unwrap();
    delivered_everything(&mut replay, "replay before compaction", newest_before, &acked).await;

    // etcd's way out: compact (on a full store), disarm, write again.
    let status = client.status().await.unwrap();
    let current = status.header().unwrap().revision();
    client.compact(current, None).await.expect("compaction on a full store");
    put_refused(client).await;
    disarm(&run.server.url);
    let r = client.put("/disk/after", "v", None).await.expect("a put after compaction and disarm");
    acked.insert("/disk/after".into(), (r.header().unwrap().revision(), b"v".to_vec()));
    assert_all_present(client, &acked).await;
    delivered_everything(&mut run.watch, "live", r.header().unwrap().revision(), &acked).await;

    run.restart_and_check(&acked).await;
}
