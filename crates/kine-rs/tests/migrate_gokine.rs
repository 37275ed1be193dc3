//! Go kine v0.17.5's datastores into kine-rs with `kine-rs migrate --from <the URL Go kine was
//! started with>`: Go kine writes a Kubernetes-shaped history (creates, updates and deletes as
//! kube-apiserver makes them, a key on a lease, a compaction); the copy, served by kine-rs,
//! answers as Go kine answered (every key with its value, create and mod revision and lease,
//! the same header revision, the same events to a watch from the compact revision), a watch
//! opened at Go kine's last revision goes on there, and Go kine's database is untouched. A run
//! while Go kine still writes copies what had settled; a run after it stopped brings the copy
//! up to date.

mod common;
#[path = "common/go_kine.rs"]
mod go_kine;
use common::*;
use etcd_client::WatchOptions;
use go_kine::{Compaction, GoKine, served, write_like_kubernetes};
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::postgres::PgServer;
use std::process::Command;
use std::time::Duration;

/// `kine-rs migrate --from --to`: (success, stderr).
fn migrate(from: &str, to: &str) -> (bool, String) {
    let (ok, _, err) = run(Command::new(server_bin()).args(["migrate", "--from", from, "--to", to]));
    (ok, err)
}

/// Go kine on `endpoint` writes; its answers; Go kine stopped; the copy into `to`, served by
/// kine-rs, answers the same; a watch from Go kine's last revision goes on on kine-rs.
async fn moves_with_its_revisions(endpoint: &str, to: &str, how: Compaction, untouched: impl Fn() -> String) -> i64 {
    let logs = TempDir::new("gokine-logs");
    let go = GoKine::start_with(endpoint, logs.path(), &["--compact-min-retain", "10"]).await;
    let mut c = go.client().await;
    let compacted = write_like_kubernetes(&mut c, 0, 60, Some(how)).await;
    assert!(compacted > 2);
    let original = served(&mut c, compacted).await;
    go.stop().await;
    let before = untouched();
    let (ok, err) = migrate(endpoint, to);
    assert!(ok, "{err}");
    assert!(err.contains("reading Go kine's") && err.contains("copied and verified"), "{err}");
    assert!(err.contains("--to serves every key Go kine serves"), "{err}");
    assert_eq!(untouched(), before, "Go kine's database changed");
    let server = Server::start(&["--endpoint", to]);
    let mut c = server.client().await;
    assert_eq!(served(&mut c, compacted).await, original);
    let below =
        c.get("/registry/masterleases/x", Some(etcd_client::GetOptions::new().with_revision(compacted - 1))).await;
    assert!(below.is_err_and(|e| e.to_string().contains("compacted")), "Go kine's compact revision");
    // A client that held Go kine's last revision watches on from it.
    let options = WatchOptions::new().with_prefix().with_start_revision(original.revision + 1);
    let mut watch = c.watch("/registry/", Some(options)).await.unwrap();
    let next = c.put("/registry/after", "the switch", None).await.unwrap().header().unwrap().revision();
    assert_eq!(next, original.revision + 1);
    loop {
        let got = tokio::time::timeout(Duration::from_secs(10), watch.message()).await.unwrap().unwrap().unwrap();
        assert!(!got.canceled(), "the watch from Go kine's last revision was cancelled: {}", got.cancel_reason());
        if let Some(e) = got.events().first() {
            assert_eq!(e.kv().unwrap().mod_revision(), next);
            break;
        }
    }
    compacted
}

/// k3s's case: Go kine's SQLite file, with the URL parameters k3s gives it; a first copy while
/// Go kine still writes, a second after it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kine_sqlite_database_moves_with_its_revisions() {
    let dir = TempDir::new("gokine-sqlite");
    let path = dir.path().join("state.db");
    let endpoint =
        format!("sqlite://{}?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate", path.display());
    let to = format!("sqlite://{}", dir.path().join("kine-rs.db").display());
    let untouched = || {
        let wal = path.with_extension("db-wal");
        format!("{:?} {:?}", std::fs::read(&path).ok().map(|b| b.len()), std::fs::read(&wal).ok())
    };
    let compacted = moves_with_its_revisions(&endpoint, &to, Compaction::Sql, untouched).await;

    // Live: a copy while Go kine writes, then the rest once it stopped.
    let live = format!("sqlite://{}", dir.path().join("live.db").display());
    let go = GoKine::start_with(&endpoint, dir.path(), &["--compact-min-retain", "10"]).await;
    let mut c = go.client().await;
    let writer = {
        let mut c = c.clone();
        tokio::spawn(async move { write_like_kubernetes(&mut c, 100, 160, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, err) = migrate(&endpoint, &live);
    assert!(ok, "{err}");
    writer.await.unwrap();
    let last = served(&mut c, compacted).await;
    go.stop().await;
    let (ok, err) = migrate(&endpoint, &live);
    assert!(ok && err.contains("continuing"), "{err}");
    let server = Server::start(&["--endpoint", &live]);
    assert_eq!(served(&mut server.client().await, compacted).await, last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kine_postgres_database_moves_with_its_revisions() {
    let pg = PgServer::start();
    let dir = TempDir::new("gokine-pg");
    let to = format!("sqlite://{}", dir.path().join("kine-rs.db").display());
    let untouched = || pg.sql("gokine", "SELECT COUNT(*), MAX(id), SUM(LENGTH(value)) FROM kine");
    moves_with_its_revisions(&pg.url("gokine"), &to, Compaction::Sql, untouched).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kine_mariadb_database_moves_with_its_revisions() {
    let maria = MariaDbServer::start();
    let pg = PgServer::start();
    let untouched = || maria.root_sql("SELECT COUNT(*), MAX(id), SUM(LENGTH(value)) FROM gokine.kine");
    moves_with_its_revisions(&maria.url("gokine"), &pg.url("kiners"), Compaction::Sql, untouched).await;
}

/// Go kine on a nats-server (its bucket: revisions are stream sequences, a delete costs two) and
/// on its own embedded server (`nats://HOST:PORT?dataDir=…`: the same URL, read once Go kine
/// stopped through an embedded server kine-rs starts on that store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kine_nats_bucket_moves_with_its_revisions() {
    let nats = kine_testkit::nats::NatsServer::start();
    let dir = TempDir::new("gokine-nats");
    let external = format!("{}?noEmbed&bucket=gokine", nats.url());
    let to = format!("sqlite://{}", dir.path().join("from-external.db").display());
    // The stream's state, read over NATS: unchanged by the copy.
    let stream_state = || {
        let rt = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| {
            rt.block_on(async {
                let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
                let mut stream = js.get_stream("KV_gokine").await.unwrap();
                let state = stream.info().await.unwrap().state.clone();
                format!("{} {} {}", state.messages, state.last_sequence, state.bytes)
            })
        })
    };
    moves_with_its_revisions(&external, &to, Compaction::Nats, stream_state).await;

    let port = kine_testkit::nats::free_port();
    let embedded = format!("nats://127.0.0.1:{port}?dataDir={}", dir.path().join("go-kine-nats").display());
    let to = format!("sqlite://{}", dir.path().join("from-embedded.db").display());
    let store = dir.path().join("go-kine-nats");
    // Reading a store takes a nats-server on it (kine-rs's embedded one, which keeps its lock
    // file `kine-rs.lock` there): the store's other entries stay as Go kine left them.
    let untouched = || {
        let mut names: Vec<String> = std::fs::read_dir(&store)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.retain(|n| n != "kine-rs.lock");
        names.sort();
        names.join(",")
    };
    moves_with_its_revisions(&embedded, &to, Compaction::Nats, untouched).await;
}

/// k3s's SQLite into kine-rs's embedded NATS store: Go kine writes one change per revision, so
/// every revision is kept in the bucket too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kine_sqlite_database_moves_into_nats_with_its_revisions() {
    let dir = TempDir::new("gokine-sqlite-nats");
    let path = dir.path().join("state.db");
    let endpoint =
        format!("sqlite://{}?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate", path.display());
    let store = TempDir::new("gokine-nats-store");
    let to = format!("nats://?dataDir={}", store.path().display());
    let untouched = || format!("{:?}", std::fs::read(&path).ok().map(|b| b.len()));
    moves_with_its_revisions(&endpoint, &to, Compaction::Sql, untouched).await;
}
