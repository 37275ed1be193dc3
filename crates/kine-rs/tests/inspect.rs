//! `kine-rs inspect` on SQLite, PostgreSQL, MariaDB and NATS (an external server, and a stopped
//! node's embedded one), while kine-rs serves the datastore and after it stopped: every answer
//! is checked against what the server itself answers over the etcd API (keys at a revision, the
//! events of a watch from the compact revision), and the stopped datastore is unchanged by it
//! (SQLite's files; the SQL databases' rows; the NATS streams' contents and settings).

mod common;
use base64::Engine as _;
use common::*;
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::nats::NatsServer;
use kine_testkit::postgres::PgServer;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// `kine-rs inspect --output json ARGS` on `endpoint`: each line's JSON, or the error.
fn inspect(endpoint: &str, args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let mut cmd = Command::new(server_bin());
    cmd.args(["--endpoint", endpoint, "inspect", "--output", "json"]).args(args);
    let (ok, out, err) = run(&mut cmd);
    if !ok {
        return Err(err);
    }
    Ok(out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect())
}

fn bytes(v: &serde_json::Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(v.as_str().expect("base64 text")).expect("base64")
}

fn int(v: &serde_json::Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("{v} is not an integer"))
}

/// A printed version as the tests' `Kv` tuple.
fn kv(o: &serde_json::Value) -> Kv {
    (
        bytes(&o["key"]),
        bytes(&o["value"]),
        int(&o["create_revision"]),
        int(&o["mod_revision"]),
        int(&o["version"]),
        int(&o["lease"]),
    )
}

/// The keys of `keys_at` that differ between two revisions: key → (change, from, to mod revision).
fn expected_diff(from: &[Kv], to: &[Kv]) -> BTreeMap<Vec<u8>, (String, Option<i64>, Option<i64>)> {
    let a: BTreeMap<_, _> = from.iter().map(|k| (k.0.clone(), k.3)).collect();
    let b: BTreeMap<_, _> = to.iter().map(|k| (k.0.clone(), k.3)).collect();
    let mut out = BTreeMap::new();
    for (key, rev) in &a {
        match b.get(key) {
            None => drop(out.insert(key.clone(), ("deleted".into(), Some(*rev), None))),
            Some(r) if r != rev => drop(out.insert(key.clone(), ("changed".into(), Some(*rev), Some(*r)))),
            _ => {}
        }
    }
    for (key, rev) in &b {
        if !a.contains_key(key) {
            out.insert(key.clone(), ("created".into(), None, Some(*rev)));
        }
    }
    out
}

/// Every inspect answer against the server's (which may have stopped since: `server` holds
/// its answers read before).
struct Served {
    revision: i64,
    compact: i64,
    middle: i64,
    keys: Vec<Kv>,
    at_compact: Vec<Kv>,
    at_middle: Vec<Kv>,
    history: Vec<(i64, String, Vec<u8>, Vec<u8>)>,
}

fn answers_as_served(dir: &str, s: &Served) {
    let status = &inspect(dir, &["status"]).unwrap()[0];
    assert_eq!(int(&status["revision"]), s.revision, "{status}");
    assert_eq!(int(&status["compact_revision"]), s.compact, "{status}");
    assert_eq!(int(&status["keys"]), s.keys.len() as i64, "{status}");
    assert_eq!(int(&status["leases"]), 1, "{status}");

    let list: Vec<Kv> = inspect(dir, &["list", "--values"]).unwrap().iter().map(kv).collect();
    assert_eq!(list, s.keys);
    let at: Vec<Kv> =
        inspect(dir, &["list", "--values", "--revision", &s.middle.to_string()]).unwrap().iter().map(kv).collect();
    assert_eq!(at, s.at_middle);
    let prefixed = inspect(dir, &["list", "/registry/leases/"]).unwrap();
    assert_eq!(prefixed.len(), 1);
    assert_eq!(bytes(&prefixed[0]["key"]), b"/registry/leases/x");
    assert!(prefixed[0].get("value").is_none(), "values only with --values");
    assert_eq!(int(&prefixed[0]["value_size"]), 4);

    let got = &inspect(dir, &["get", "/registry/cm/00001"]).unwrap()[0];
    assert_eq!(bytes(&got["value"]), b"changed again");
    let old = &inspect(dir, &["get", "/registry/cm/00003", "--revision", &s.middle.to_string()]).unwrap()[0];
    assert_eq!(bytes(&old["value"]), b"back");

    // The history: each key's version at the compact revision, then every event since.
    let history = inspect(dir, &["history", "/registry/", "--prefix", "--values"]).unwrap();
    let (kept, events) = history.split_at(s.at_compact.len());
    assert_eq!(kept.iter().map(|e| kv(&e["kv"])).collect::<Vec<_>>(), s.at_compact);
    let events: Vec<_> = events
        .iter()
        .map(|e| {
            (
                int(&e["revision"]),
                e["type"].as_str().unwrap().to_string(),
                bytes(&e["kv"]["key"]),
                bytes(&e["kv"]["value"]),
            )
        })
        .collect();
    assert_eq!(events, s.history);
    // Updated before the compaction, deleted after it.
    let one = inspect(dir, &["history", "/registry/cm/00000", "--values"]).unwrap();
    let one: Vec<_> = one.iter().map(|e| (e["type"].as_str().unwrap().to_string(), bytes(&e["kv"]["value"]))).collect();
    assert_eq!(one, [("PUT".to_string(), b"updated 0".to_vec()), ("DELETE".to_string(), vec![])]);

    let diff = inspect(dir, &["diff", &s.compact.to_string(), &s.revision.to_string()]).unwrap();
    let diff: BTreeMap<_, _> = diff
        .iter()
        .map(|d| {
            let rev = |side: &serde_json::Value| side.get("mod_revision").map(int);
            (bytes(&d["key"]), (d["change"].as_str().unwrap().to_string(), rev(&d["from"]), rev(&d["to"])))
        })
        .collect();
    assert_eq!(diff, expected_diff(&s.at_compact, &s.keys));
    assert!(
        diff.values().any(|d| d.0 == "created")
            && diff.values().any(|d| d.0 == "deleted")
            && diff.values().any(|d| d.0 == "changed")
    );

    // etcd's answer below the compact revision; a future revision; a missing key.
    let below = inspect(dir, &["list", "--revision", &(s.compact - 1).to_string()]).unwrap_err();
    assert!(below.contains("required revision has been compacted"), "{below}");
    let future = inspect(dir, &["get", "/registry/cm/00001", "--revision", &(s.revision + 1).to_string()]).unwrap_err();
    assert!(future.contains("required revision is a future revision"), "{future}");
    let missing = inspect(dir, &["get", "/registry/cm/00000"]).unwrap_err();
    assert!(missing.contains("key \"/registry/cm/00000\" not found at the current revision"), "{missing}");
}

/// The database files' contents: the database and its WAL. (`-shm`, SQLite's shared-memory
/// index of the WAL, is no data: every reader of a WAL database updates it, and SQLite rebuilds
/// it from the WAL when needed.)
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| !e.file_name().to_string_lossy().ends_with("-shm"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// A kine-rs on `endpoint` loaded with [`history::load`]; inspect answers as it does while it serves
/// (or, given `refused`, is refused with that text) and after it stopped, when `unchanged` (the
/// datastore's state, read around the second round) must not change.
async fn served_then_stopped<F, Fut>(endpoint: &str, refused: Option<&str>, unchanged: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let mut server = Server::start(&["--endpoint", endpoint]);
    let mut c = server.client().await;
    let (compact, middle) = history::load(&mut c).await;
    let (revision, keys) = everything(&mut c).await;
    let served = Served {
        revision,
        compact,
        middle,
        at_compact: keys_at(&mut c, compact).await,
        at_middle: keys_at(&mut c, middle).await,
        history: history::watched(&mut c, "/registry/", compact, revision).await,
        keys,
    };
    assert!(served.keys.len() > 2000 && served.at_compact.len() > 2000, "more than two pages");
    match refused {
        None => answers_as_served(endpoint, &served),
        Some(says) => {
            let err = inspect(endpoint, &["status"]).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }

    drop(c);
    assert!(server.stop("TERM").await.success());
    let before = unchanged().await;
    answers_as_served(endpoint, &served);
    assert!(before == unchanged().await, "inspect changed the stopped datastore");

    // Served again, it takes writes as before: inspect left nothing behind.
    let again = Server::start(&["--endpoint", endpoint]);
    let put = again.client().await.put("/after", "inspect", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), revision + 1);
}

#[tokio::test]
async fn inspect_reads_sqlite_served_and_stopped_as_the_server_does() {
    let dir = TempDir::new("inspect");
    served_then_stopped(&db_endpoint(dir.path()), None, || std::future::ready(format!("{:?}", files(dir.path()))))
        .await;
}

/// Every table of the kine-rs store, whole (rows in a fixed order).
const DUMP: [&str; 5] = [
    "SELECT mod_revision, sub, key, create_revision, version, lease, deleted, value FROM kv ORDER BY mod_revision, sub",
    "SELECT key, mod_revision, sub FROM live ORDER BY key",
    "SELECT name, value FROM meta ORDER BY name",
    "SELECT id, ttl FROM lease ORDER BY id",
    "SELECT id, data FROM kine_rs_members ORDER BY id",
];

#[tokio::test]
async fn inspect_reads_postgres_served_and_stopped_as_the_server_does() {
    let pg = PgServer::start();
    served_then_stopped(&pg.url("inspect"), None, || std::future::ready(DUMP.map(|q| pg.sql("inspect", q)).join("\n")))
        .await;
}

#[tokio::test]
async fn inspect_reads_mariadb_served_and_stopped_as_the_server_does() {
    let db = MariaDbServer::start();
    served_then_stopped(&db.url("inspect"), None, || {
        std::future::ready(
            DUMP.map(|q| db.root_sql(&format!("USE inspect; {}", q.replace(" key", " `key`")))).join("\n"),
        )
    })
    .await;
}

/// The state of a bucket's two streams (what they hold, and the settings kine-rs may change).
async fn streams(nats: &NatsServer, bucket: &str) -> String {
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mut out = String::new();
    for name in [format!("KV_{bucket}"), format!("KV_{bucket}-meta")] {
        let info = js.get_stream(&name).await.unwrap().info().await.unwrap().clone();
        let (s, c) = (&info.state, &info.config);
        out += &format!(
            "{name}: {} messages {}..{} {} bytes; window {:?} history {} replicas {}\n",
            s.messages,
            s.first_sequence,
            s.last_sequence,
            s.bytes,
            c.duplicate_window,
            c.max_messages_per_subject,
            c.num_replicas
        );
    }
    out
}

#[tokio::test]
async fn inspect_reads_a_nats_bucket_served_and_stopped_as_the_server_does() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=inspect", nats.url());
    served_then_stopped(&endpoint, None, || streams(&nats, "inspect")).await;
}

/// Without `?noEmbed`, inspect starts the embedded server on a stopped node's store; a store
/// a node still runs on is refused (two NATS servers must never open the same files).
#[tokio::test]
async fn inspect_reads_a_stopped_embedded_nats_store_and_refuses_a_running_one() {
    let dir = TempDir::new("inspect-nats");
    let endpoint = format!("nats://?dataDir={}", dir.path().display());
    let locked = format!("the NATS store {} is in use by another process", dir.path().display());
    // The store's state is checked by serving it again afterwards (the embedded server rewrites
    // its own files when it stops, so they are not compared).
    served_then_stopped(&endpoint, Some(&locked), || std::future::ready(String::new())).await;
}

#[test]
fn inspect_refuses_what_it_cannot_read_and_creates_nothing() {
    let dir = TempDir::new("inspect");
    let endpoint = db_endpoint(dir.path());
    let err = inspect(&endpoint, &["status"]).unwrap_err();
    assert!(err.contains("--endpoint: cannot read it: SQLite database") && err.contains("No such file"), "{err}");
    assert!(files(dir.path()).is_empty(), "nothing created");

    std::fs::write(dir.path().join("state.db"), b"not a database").unwrap();
    let err = inspect(&endpoint, &["list"]).unwrap_err();
    assert!(
        err.contains("state.db is not a SQLite database (14 bytes that do not begin with SQLite's header)"),
        "{err}"
    );

    let err = inspect("memory://", &["status"]).unwrap_err();
    assert!(err.contains("nothing to read"), "{err}");

    // A NATS server without the bucket, or with an empty one: nothing is created or written.
    let nats = NatsServer::start();
    let missing = format!("{}?noEmbed&bucket=missing", nats.url());
    let err = inspect(&missing, &["status"]).unwrap_err();
    assert!(err.contains("no bucket missing on this NATS server (stream KV_missing not found)"), "{err}");
    let stopped = TempDir::new("inspect-nats");
    let embedded = format!("nats://?dataDir={}", stopped.path().display());
    let err = inspect(&embedded, &["list"]).unwrap_err();
    assert!(err.contains(&format!("no NATS store in {} (dataDir)", stopped.path().display())), "{err}");
    assert!(files(stopped.path()).is_empty(), "created {:?}", files(stopped.path()).keys());
    let err = inspect("nats://?serverConfig=/etc/hosts", &["list"]).unwrap_err();
    assert!(err.contains("serverConfig /etc/hosts: kine-rs starts an embedded NATS server"), "{err}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let names: Vec<String> = futures_util::TryStreamExt::try_collect(js.stream_names()).await.unwrap();
        assert!(names.is_empty(), "created {names:?}");
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "KV_empty".into(),
            subjects: vec!["$KV.empty.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    });
    let err = inspect(&format!("{}?noEmbed&bucket=empty", nats.url()), &["status"]).unwrap_err();
    assert!(err.contains("bucket empty is empty: no kine-rs store has been written in it"), "{err}");
    let count = rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        js.get_stream("KV_empty").await.unwrap().info().await.unwrap().state.messages
    });
    assert_eq!(count, 0, "inspect wrote into the empty bucket");
}

/// A database that does not exist is not created; one without a kine-rs store gets no tables.
#[test]
fn inspect_creates_no_sql_database_or_table() {
    let pg = PgServer::start();
    let err = inspect(&pg.url("missing"), &["status"]).unwrap_err();
    assert!(err.contains("database \"missing\" does not exist"), "{err}");
    assert!(!err.contains(kine_testkit::postgres::PASSWORD), "the password leaked: {err}");
    assert_eq!(pg.sql("postgres", "SELECT count(*) FROM pg_database WHERE datname = 'missing'").trim(), "0");
    pg.sql("postgres", "CREATE DATABASE other");
    let err = inspect(&pg.url("other"), &["list"]).unwrap_err();
    assert!(err.contains("no kine-rs store in this database (it has no meta table)"), "{err}");
    assert_eq!(pg.sql("other", "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").trim(), "0");

    let db = MariaDbServer::start();
    let err = inspect(&db.url("missing"), &["status"]).unwrap_err();
    assert!(err.contains("Unknown database 'missing'"), "{err}");
    assert!(db.root_sql("SHOW DATABASES LIKE 'missing'").trim().is_empty(), "created");
    db.root_sql("CREATE DATABASE other");
    let err = inspect(&db.url("other"), &["list"]).unwrap_err();
    assert!(err.contains("no kine-rs store in this database (it has no meta table)"), "{err}");
    assert!(db.root_sql("SHOW TABLES FROM other").trim().is_empty(), "tables created");
}
