//! `kine-rs migrate` between SQLite, PostgreSQL and MariaDB, and from NATS: each copy, served, answers as the
//! original did (keys, reads at past revisions, the compact revision, watches from it, the
//! lease and its key, users and roles) and takes the next write at the next revision; a second
//! run brings a copy up to date; a target that holds another store is refused untouched.

mod common;
#[path = "differential/etcd.rs"]
mod etcd;
use common::answers::{Answers, answers, answers_of, migrate};
use common::history::load;
use common::*;
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::nats::NatsServer;
use kine_testkit::postgres::PgServer;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_between_every_sql_datastore_with_its_history() {
    let dir = TempDir::new("migrate");
    let sqlite = db_endpoint(dir.path());
    let (compact, middle) = {
        let server = Server::start(&["--endpoint", &sqlite]);
        let mut c = server.client().await;
        let marks = load(&mut c).await;
        c.user_add("reader", "readerpw", None).await.unwrap();
        c.role_add("configmap-reader").await.unwrap();
        c.user_grant_role("reader", "configmap-reader").await.unwrap();
        marks
    };
    let original = answers(&sqlite, compact, middle).await;
    assert!(original.below_compact.contains("required revision has been compacted"), "{}", original.below_compact);
    assert_eq!(original.leases.len(), 1);
    assert_eq!(original.users, ["reader"]);

    // SQLite → PostgreSQL → MariaDB → SQLite, each copy from the one before.
    let pg = PgServer::start();
    let maria = MariaDbServer::start();
    let again = format!("sqlite://{}", dir.path().join("again.db").display());
    let chain = [sqlite.clone(), pg.url("moved"), maria.url("moved"), again];

    // A target a kine-rs serves is refused.
    let busy = pg.url("busy");
    let node = Server::start(&["--endpoint", &busy, "--name", "busy-node"]);
    let (ok, err) = migrate(&sqlite, &busy, &[]);
    assert!(!ok && err.contains("--to is being served by kine-rs busy-node"), "{err}");
    drop(node);

    for pair in chain.windows(2) {
        let (ok, err) = migrate(&pair[0], &pair[1], &[]);
        assert!(ok, "{} → {}: {err}", pair[0], pair[1]);
        assert!(err.contains("copied and verified"), "{err}");
        assert_eq!(answers(&pair[1], compact, middle).await, original, "{} → {}", pair[0], pair[1]);
    }

    // Written to after the copy, the original runs ahead; a second run brings the copy up to
    // date, and the copy takes the next write at the next revision.
    {
        let server = Server::start(&["--endpoint", &sqlite]);
        let mut c = server.client().await;
        c.put("/registry/cm/00001", "after the copy", None).await.unwrap();
        c.delete("/registry/cm/00002", None).await.unwrap();
    }
    let (ok, err) = migrate(&sqlite, &chain[1], &[]);
    assert!(ok && err.contains("continuing"), "{err}");
    let ahead = answers(&sqlite, compact, middle).await;
    assert_eq!(ahead.revision, original.revision + 2);
    assert_eq!(answers(&chain[1], compact, middle).await, ahead);
    let server = Server::start(&["--endpoint", &chain[1]]);
    let put = server.client().await.put("/next", "x", None).await.unwrap();
    drop(server);
    assert_eq!(put.header().unwrap().revision(), ahead.revision + 1);
}

/// Loads a kine-rs on `endpoint` (history, a lease, a user) and reads its answers while it serves.
async fn loaded(endpoint: &str) -> (Server, i64, i64, Answers) {
    let server = Server::start(&["--endpoint", endpoint]);
    let mut c = server.client().await;
    let (compact, middle) = load(&mut c).await;
    c.user_add("reader", "readerpw", None).await.unwrap();
    let answers = answers_of(&mut c, compact, middle).await;
    assert_eq!((answers.leases.len(), answers.users.len()), (1, 1));
    (server, compact, middle, answers)
}

/// A NATS bucket moves into SQLite with its history: from an external server while kine-rs
/// serves it, and from a stopped node's store through the embedded server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_bucket_moves_to_sqlite_with_its_history() {
    let nats = NatsServer::start();
    let from = format!("{}?noEmbed&bucket=moving", nats.url());
    let (server, compact, middle, original) = loaded(&from).await;
    let dir = TempDir::new("migrate");
    let to = db_endpoint(dir.path());
    let (ok, err) = migrate(&from, &to, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    drop(server);
    assert_eq!(answers(&to, compact, middle).await, original);

    let store = TempDir::new("migrate-nats");
    let from = format!("nats://?dataDir={}", store.path().display());
    let (mut server, compact, middle, original) = loaded(&from).await;
    let to = format!("sqlite://{}", dir.path().join("embedded.db").display());
    let (ok, err) = migrate(&from, &to, &[]);
    assert!(!ok && err.contains("--from: the NATS store") && err.contains("is in use by another process"), "{err}");
    assert!(server.stop("TERM").await.success());
    let (ok, err) = migrate(&from, &to, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    assert_eq!(answers(&to, compact, middle).await, original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_current_keys_when_asked() {
    let dir = TempDir::new("migrate");
    let from = db_endpoint(dir.path());
    let (revision, keys) = {
        let server = Server::start(&["--endpoint", &from]);
        let mut c = server.client().await;
        load(&mut c).await;
        everything(&mut c).await
    };
    let to = format!("sqlite://{}", dir.path().join("current.db").display());
    let (ok, err) = migrate(&from, &to, &["--current-only"]);
    assert!(ok, "{err}");
    let server = Server::start(&["--endpoint", &to]);
    let mut c = server.client().await;
    assert_eq!(everything(&mut c).await, (revision, keys), "same keys, same revisions");
    let before = c.get("/registry/cm/00001", Some(etcd_client::GetOptions::new().with_revision(revision - 1))).await;
    assert!(before.is_err_and(|e| e.to_string().contains("compacted")), "compacted at the copied revision");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_holding_another_store_is_refused_untouched() {
    let dir = TempDir::new("migrate");
    let from = db_endpoint(dir.path());
    let to = format!("sqlite://{}", dir.path().join("other.db").display());
    for (endpoint, value) in [(&from, "original"), (&to, "another")] {
        let server = Server::start(&["--endpoint", endpoint]);
        let mut c = server.client().await;
        for i in 0..10 {
            c.put(format!("/k/{i}"), value, None).await.unwrap();
        }
    }
    let held = |endpoint: String| async move {
        let server = Server::start(&["--endpoint", &endpoint]);
        everything(&mut server.client().await).await
    };
    let before = held(to.clone()).await;
    let (ok, err) = migrate(&from, &to, &[]);
    assert!(!ok && err.contains("differs from --from's: it holds another store"), "{err}");
    assert_eq!(held(to.clone()).await, before, "the target was changed");

    // Ahead of the source: another store too.
    {
        let server = Server::start(&["--endpoint", &to]);
        server.client().await.put("/k/ahead", "x", None).await.unwrap();
    }
    let (ok, err) = migrate(&from, &to, &[]);
    assert!(!ok && err.contains("past --from's 11: it holds another store"), "{err}");

    for (from_, to_, says) in [
        (from.as_str(), from.as_str(), "--from and --to name the same datastore"),
        ("sqlite:///nonexistent/state.db", to.as_str(), "--from: cannot read it"),
    ] {
        let (ok, err) = migrate(from_, to_, &[]);
        assert!(!ok && err.contains(says), "{from_} → {to_}: {err}");
    }
}

/// `kine-rs inspect status` of a store: (revision, compact revision, keys), if it can be read.
fn status(endpoint: &str) -> Option<(i64, i64, i64)> {
    let (ok, out, _) =
        run(Command::new(server_bin()).args(["--endpoint", endpoint, "inspect", "--output", "json", "status"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).ok().filter(|_| ok)?;
    Some((v["revision"].as_i64()?, v["compact_revision"].as_i64()?, v["keys"].as_i64()?))
}

/// A copy killed while it copies the keys continues where it stopped when run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_killed_midway_continues() {
    let dir = TempDir::new("migrate");
    let from = db_endpoint(dir.path());
    let hash_kv = |endpoint: String| async move {
        let server = Server::start(&["--endpoint", &endpoint]);
        let mut c = server.client().await;
        let revision = c.get("/", None).await.unwrap().header().unwrap().revision();
        (revision, c.hash_kv(revision).await.unwrap().hash())
    };
    let keys = 30_000;
    {
        let server = Server::start(&["--endpoint", &from]);
        let mut c = server.client().await;
        for batch in 0..300 {
            let puts: Vec<_> = (0..100)
                .map(|i| etcd_client::TxnOp::put(format!("/big/{:06}", batch * 100 + i), vec![b'v'; 2000], None))
                .collect();
            c.txn(etcd_client::Txn::new().and_then(puts)).await.unwrap();
        }
    }
    let (revision, hash) = hash_kv(from.clone()).await;
    // Up to five tries to catch the copy between its first and its last batch of keys.
    for attempt in 0..5 {
        let to = format!("sqlite://{}", dir.path().join(format!("copy{attempt}.db")).display());
        let mut copy = Command::new(server_bin())
            .args(["migrate", "--current-only", "--from", &from, "--to", &to])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut caught = false;
        while copy.try_wait().unwrap().is_none() {
            if let Some((_, compacted, n)) = status(&to)
                && n > 0
                && n < keys
                && compacted < revision
            {
                copy.kill().unwrap();
                caught = true;
                break;
            }
        }
        let _ = copy.wait();
        if !caught {
            continue;
        }
        let (ok, err) = migrate(&from, &to, &["--current-only"]);
        assert!(ok && err.contains("continuing an earlier copy of the keys"), "{err}");
        assert_eq!(status(&to), Some((revision, revision, keys)));
        assert_eq!(hash_kv(to).await, (revision, hash), "the same keys at the same revision");
        return;
    }
    panic!("five copies of 30,000 keys each finished before one could be stopped midway");
}

/// A live etcd's store, copied over its gRPC API, answers on kine-rs as it did on etcd (users and
/// roles excepted: etcd's API never gives password hashes).
async fn from_live_etcd(version: etcd::Version) {
    let etcd = etcd::Etcd::start(version);
    let mut c = etcd_client::Client::connect([etcd.url.as_str()], None).await.unwrap();
    let (compact, middle) = load(&mut c).await;
    let original = answers_of(&mut c, compact, middle).await;
    assert!(original.below_compact.contains("required revision has been compacted"), "{}", original.below_compact);
    let dir = TempDir::new("migrate");
    let to = db_endpoint(dir.path());
    let (ok, err) = migrate(&etcd.url, &to, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    assert_eq!(answers(&to, compact, middle).await, original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_etcd_3_6_moves_to_kine_rs_with_its_history() {
    from_live_etcd(etcd::Version::V3_6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_etcd_3_7_moves_to_kine_rs_with_its_history() {
    from_live_etcd(etcd::Version::V3_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_says_what_it_would_copy_and_writes_nothing() {
    let dir = TempDir::new("migrate");
    let from = db_endpoint(dir.path());
    let (current, compact) = {
        let server = Server::start(&["--endpoint", &from]);
        let mut c = server.client().await;
        let (compact, _) = load(&mut c).await;
        (everything(&mut c).await.0, compact)
    };
    let dry = |to: &str, extra: &[&str]| {
        run(Command::new(server_bin()).args(["migrate", "--dry-run", "--from", &from, "--to", to]).args(extra))
    };
    let path = dir.path().join("copy.db");
    let to = format!("sqlite://{}", path.display());
    let (ok, out, err) = dry(&to, &[]);
    assert!(ok, "{err}");
    // The keys at the compact revision: all 2,500 but the one deleted there.
    let plan = format!(
        "would copy: 2499 keys at revision {compact} (each with its create and mod revision), {} revisions of \
         history after it ({}..{current}), 1 leases",
        current - compact,
        compact + 1
    );
    assert!(out.contains(&plan), "expected {plan:?} in:\n{out}");
    assert!(out.contains("does not exist: the copy creates it") && out.contains("nothing was written"), "{out}");
    assert!(!path.exists(), "a dry run created {}", path.display());

    let (ok, err) = migrate(&from, &to, &[]);
    assert!(ok, "{err}");
    let (ok, out, err) = dry(&to, &[]);
    assert!(ok && out.contains(&format!("a kine-rs store at revision {current}: up to date")), "{out}{err}");
    // Go kine's table goes into a new file only: refused as the copy would refuse it.
    let (ok, _, err) = dry(&to, &["--to-go-kine"]);
    assert!(!ok && err.contains("exists: Go kine's table is written into a new file"), "{err}");

    // A PostgreSQL database that does not exist yet is left so.
    let pg = PgServer::start();
    let (ok, out, err) = dry(&pg.url("dry"), &[]);
    assert!(ok && out.contains("the database does not exist: the copy creates it"), "{out}{err}");
    let databases = pg.sql("postgres", "SELECT datname FROM pg_database");
    assert!(!databases.lines().any(|l| l.trim() == "dry"), "a dry run created the database: {databases}");
}
