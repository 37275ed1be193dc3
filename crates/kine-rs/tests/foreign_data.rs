//! Never an empty store beside someone else's data (issue #41): the real Go kine v0.17.5 writes
//! keys into SQLite, PostgreSQL, MariaDB and a NATS bucket; kine-rs, started on the same URL
//! (to serve, and `kine-rs inspect`), refuses naming what it found and the command that
//! converts it (`kine-rs migrate --from <the URL>`), and the datastore is left byte for byte
//! as it was (the SQLite files; the tables, row counts and databases; the stream's state and
//! the streams). Beside its own store kine-rs serves its own data and warns about Go kine's
//! table. etcd's data directory, a file that is no database and a truncated database are
//! refused naming the file, unchanged.

mod common;
#[allow(dead_code)] // 3.7 is not started here
#[path = "differential/etcd.rs"]
mod etcd;
#[path = "common/go_kine.rs"]
mod go_kine;

use common::*;
use go_kine::GoKine;
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::nats::NatsServer;
use kine_testkit::postgres::PgServer;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs kine-rs with `args` (in `dir`), which must stop by itself with a failure (a refusal
/// comes before anything is served); its stderr.
fn refused(dir: Option<&Path>, args: &[&str]) -> String {
    let mut cmd = Command::new(server_bin());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    if !args.contains(&"inspect") {
        cmd.args(["--listen-address", "127.0.0.1:0"]);
    }
    let mut child = cmd
        .args(args)
        .env("KINE_METRICS_BIND_ADDRESS", "0")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kine-rs");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("stderr");
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!status.success(), "kine-rs {args:?} succeeded; it should refuse:\n{stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
            return stderr;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("stderr");
            panic!(
                "kine-rs {args:?} still runs after 90 s; it should refuse:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every file under `dir` and its bytes (Go kine's own logs left out).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut all = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            if path.is_dir() {
                all.insert(format!("{name}/"), Vec::new());
                stack.push(path);
            } else if !name.starts_with("go-kine-") {
                all.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    all
}

fn assert_unchanged(before: &BTreeMap<String, Vec<u8>>, after: &BTreeMap<String, Vec<u8>>, what: &str) {
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(before), names(after), "{what}: files were created or removed");
    for (name, bytes) in before {
        assert!(after[name] == *bytes, "{what}: {name} changed");
    }
}

/// Go kine's writes, as a client makes them: creates, a conditional update and a conditional
/// delete (Txns of the shapes Go kine serves). Returns the revision Go kine reports at the end.
async fn write_keys(c: &mut etcd_client::Client) -> i64 {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    for i in 0..5 {
        c.put(format!("/registry/configmaps/default/cm-{i}"), format!("value {i}"), None).await.unwrap();
    }
    let key = "/registry/configmaps/default/cm-1";
    let rev = c.get(key, None).await.unwrap().kvs()[0].mod_revision();
    let update = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::put(key, "updated", None)])
        .or_else([TxnOp::get(key, None)]);
    assert!(c.txn(update).await.unwrap().succeeded());
    let key = "/registry/configmaps/default/cm-2";
    let rev = c.get(key, None).await.unwrap().kvs()[0].mod_revision();
    let delete = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None)])
        .or_else([TxnOp::get(key, None)]);
    assert!(c.txn(delete).await.unwrap().succeeded());
    let all = c.get("/registry/configmaps/", Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(all.kvs().len(), 4, "Go kine holds the keys written");
    all.header().unwrap().revision()
}

/// The refusal names the flag and the URL, what was found, and the one command that converts it.
fn assert_go_kine_refusal(stderr: &str, endpoint_shown: &str, found: &str) {
    assert!(stderr.contains(&format!("--endpoint {endpoint_shown}: {found}")), "{stderr}");
    assert!(stderr.contains("kine-rs does not serve Go kine's data, nor create its own store beside it"), "{stderr}");
    let quoted = if endpoint_shown.contains(['?', '*', '(', '&']) {
        format!("'{endpoint_shown}'")
    } else {
        endpoint_shown.to_string()
    };
    assert!(
        stderr.contains(&format!("kine-rs migrate --from {quoted} --to <a new datastore> (docs/operations.md")),
        "{stderr}"
    );
    assert!(!stderr.contains("password"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_kine_on_sqlite_is_refused_and_left_as_it_was() {
    let dir = TempDir::new("foreign-sqlite");
    let go = GoKine::start("sqlite://state.db", dir.path()).await;
    let revision = write_keys(&mut go.client().await).await;
    go.stop().await;
    let before = files(dir.path());
    assert!(before.contains_key("state.db"), "{:?}", before.keys());
    // Go kine's rows: every revision is one row (nothing compacted).
    let found = format!("this SQLite database holds Go kine's data: table kine, {revision} rows, revision {revision}");

    let stderr = refused(Some(dir.path()), &["--endpoint", "sqlite://state.db"]);
    assert_go_kine_refusal(&stderr, "sqlite://state.db", &found);
    assert_unchanged(&before, &files(dir.path()), "serving");

    // `kine-rs inspect` refuses it too (it reads kine-rs's stores only).
    let stderr = refused(Some(dir.path()), &["--endpoint", "sqlite://state.db", "inspect", "list"]);
    assert_go_kine_refusal(&stderr, "sqlite://state.db", &found);
    assert_unchanged(&before, &files(dir.path()), "inspect");
}

/// Go kine's default database is kine-rs's default too (`./db/state.db`): kine-rs started with
/// no endpoint in Go kine's directory refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_kine_s_default_database_is_refused_by_kine_rs_s_default_endpoint() {
    let dir = TempDir::new("foreign-default");
    let go = GoKine::start("", dir.path()).await;
    write_keys(&mut go.client().await).await;
    go.stop().await;
    let before = files(dir.path());
    assert!(before.contains_key("db/state.db"), "{:?}", before.keys());
    let stderr = refused(Some(dir.path()), &[]);
    assert!(
        stderr.contains("--endpoint \"\" (sqlite://./db/state.db): this SQLite database holds Go kine's data"),
        "{stderr}"
    );
    assert!(stderr.contains("kine-rs migrate --from sqlite://./db/state.db --to <a new datastore>"), "{stderr}");
    assert_unchanged(&before, &files(dir.path()), "serving");
}

/// A database converted in place earlier, or both programs pointed at one file: kine-rs serves
/// its own store, never Go kine's table, and says so at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_kine_rs_s_store_go_kine_s_table_is_not_served_and_warned_about() {
    let dir = TempDir::new("foreign-beside");
    let mut node = Server::start_in(Some(dir.path()), &["--endpoint", "sqlite://state.db"]);
    node.client().await.put("/kine-rs/own", "served", None).await.unwrap();
    assert!(node.stop("SIGTERM").await.success());
    let go = GoKine::start("sqlite://state.db", dir.path()).await;
    let go_revision = write_keys(&mut go.client().await).await;
    go.stop().await;

    let node = Server::start_in(Some(dir.path()), &["--endpoint", "sqlite://state.db"]);
    let mut c = node.client().await;
    let own = c.get("/kine-rs/own", None).await.unwrap();
    assert_eq!(own.kvs()[0].value(), b"served");
    let theirs = c.get("/registry/", Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert!(theirs.kvs().is_empty(), "Go kine's keys are not served");
    let log = node.log();
    assert!(
        log.contains(&format!(
            "this SQLite database holds Go kine's table kine (up to revision {go_revision}) beside kine-rs's store: \
             kine-rs serves its own store and not table kine; a Go kine writing to kine meanwhile is a split brain"
        )),
        "{log}"
    );
    assert_eq!(log.matches("holds Go kine's table").count(), 1, "one warning: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_kine_on_postgresql_is_refused_and_left_as_it_was() {
    let pg = PgServer::start();
    let dir = TempDir::new("foreign-pg");
    let url = pg.url("gokine");
    let go = GoKine::start(&url, dir.path()).await;
    let revision = write_keys(&mut go.client().await).await;
    go.stop().await;
    let state = || {
        (
            pg.sql("postgres", "SELECT datname FROM pg_database ORDER BY 1"),
            pg.sql(
                "gokine",
                "SELECT table_schema, table_name FROM information_schema.tables \
                 WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2",
            ),
            pg.sql("gokine", "SELECT count(*), max(id) FROM kine"),
        )
    };
    let before = state();
    assert_eq!(before.1.trim(), "public|kine", "Go kine's table alone");
    let rows = before.2.trim().split('|').next().unwrap().to_string();
    let shown = url.replace(kine_testkit::postgres::PASSWORD, "***");
    let found =
        format!("PostgreSQL database gokine holds Go kine's data: table kine, {rows} rows, revision {revision}");

    let stderr = refused(None, &["--endpoint", &url]);
    assert_go_kine_refusal(&stderr, &shown, &found);
    assert_eq!(state(), before, "the database after kine-rs");
    let stderr = refused(None, &["--endpoint", &url, "inspect", "status"]);
    assert_go_kine_refusal(&stderr, &shown, &found);
    assert_eq!(state(), before, "the database after kine-rs inspect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_kine_on_mariadb_is_refused_and_left_as_it_was() {
    let db = MariaDbServer::start();
    let dir = TempDir::new("foreign-mysql");
    let url = db.url("gokine");
    let go = GoKine::start(&url, dir.path()).await;
    let revision = write_keys(&mut go.client().await).await;
    go.stop().await;
    let state = || {
        (
            db.root_sql("SHOW DATABASES"),
            db.root_sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'gokine' ORDER BY 1"),
            db.root_sql("SELECT COUNT(*), MAX(id) FROM gokine.kine"),
        )
    };
    let before = state();
    assert_eq!(before.1.trim(), "kine", "Go kine's table alone");
    let rows = before.2.split_whitespace().next().unwrap().to_string();
    let shown = url.replace(kine_testkit::mysql::PASSWORD, "***");
    let found = format!("MySQL database gokine holds Go kine's data: table kine, {rows} rows, revision {revision}");

    let stderr = refused(None, &["--endpoint", &url]);
    assert_go_kine_refusal(&stderr, &shown, &found);
    assert_eq!(state(), before, "the database after kine-rs");
    let stderr = refused(None, &["--endpoint", &url, "inspect", "status"]);
    assert_go_kine_refusal(&stderr, &shown, &found);
    assert_eq!(state(), before, "the database after kine-rs inspect");
}

/// The streams of the server, and the bucket's stream's state.
async fn nats_state(url: &str, stream: &str) -> (Vec<String>, String) {
    use futures_util::StreamExt;
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let mut names = Vec::new();
    let mut listed = js.stream_names();
    while let Some(name) = listed.next().await {
        names.push(name.unwrap());
    }
    names.sort();
    let mut s = js.get_stream(stream).await.unwrap();
    let info = s.info().await.unwrap();
    let st = &info.state;
    (
        names,
        format!("messages={} bytes={} first={} last={}", st.messages, st.bytes, st.first_sequence, st.last_sequence),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_kine_s_nats_bucket_is_refused_and_left_as_it_was() {
    let nats = NatsServer::start();
    let dir = TempDir::new("foreign-nats");
    let endpoint = format!("{}?noEmbed&bucket=gokine", nats.url());
    let go = GoKine::start(&endpoint, dir.path()).await;
    let revision = write_keys(&mut go.client().await).await;
    go.stop().await;
    let before = nats_state(&nats.url(), "KV_gokine").await;
    assert_eq!(before.0, vec!["KV_gokine".to_string()], "Go kine's stream alone");
    let messages = before.1.split_whitespace().next().unwrap().trim_start_matches("messages=").to_string();
    let last = before.1.rsplit("last=").next().unwrap().to_string();
    assert!(last.parse::<i64>().unwrap() >= revision, "{before:?} {revision}");
    let found = format!(
        "NATS bucket gokine is Go kine's (stream KV_gokine: {messages} messages, last sequence {last}; S2-compressed \
         JSON records under base58 key tokens, such as key /registry/health at revision 1), not kine-rs's"
    );

    let stderr = refused(None, &["--endpoint", &endpoint]);
    assert_go_kine_refusal(&stderr, &endpoint, &found);
    assert_eq!(nats_state(&nats.url(), "KV_gokine").await, before, "the server's streams after kine-rs");
    let stderr = refused(None, &["--endpoint", &endpoint, "inspect", "status"]);
    assert_go_kine_refusal(&stderr, &endpoint, &found);
    assert_eq!(nats_state(&nats.url(), "KV_gokine").await, before, "the server's streams after kine-rs inspect");

    // A bucket of some other program's: neither kine-rs's nor Go kine's, and said so.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "KV_other".into(),
        subjects: vec!["$KV.other.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("$KV.other.settings", "plain text".into()).await.unwrap().await.unwrap();
    let other = format!("{}?noEmbed&bucket=other", nats.url());
    let before = nats_state(&nats.url(), "KV_other").await;
    let stderr = refused(None, &["--endpoint", &other]);
    assert!(
        stderr.contains(&format!(
            "--endpoint {other}: NATS bucket other (stream KV_other) holds data that is neither kine-rs's (no kine-rs \
             marker at its start) nor Go kine's: its message at sequence 1 (subject $KV.other.settings): the payload \
             is neither S2-compressed nor plain JSON (1 message, last sequence 1); kine-rs does not write to it: use \
             another bucket (?bucket=NAME)"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("kine-rs migrate"), "{stderr}");
    assert_eq!(nats_state(&nats.url(), "KV_other").await, before);
}

/// etcd's data directory or its bbolt file given as a SQLite database: named as etcd's, with
/// the command that takes an etcd member's `member/snap/db`.
#[tokio::test]
async fn etcd_s_data_directory_is_named_as_etcd_s_and_left_as_it_was() {
    let etcd = etcd::Etcd::start(etcd::Version::V3_6);
    let mut c = etcd_client::Client::connect([etcd.url.as_str()], None).await.unwrap();
    c.put("/registry/in-etcd", "x", None).await.unwrap();
    let dir = etcd.stop();
    let data = dir.path().join("data");
    let before = files(&data);
    assert!(before.contains_key("member/snap/db"), "{:?}", before.keys());
    for (path, found) in [
        (data.join("member/snap/db"), "is inside etcd's data directory"),
        (data.clone(), "is etcd's data directory (it holds member/snap/db), not a SQLite database"),
        (data.join("member/snap/state.db"), "is inside etcd's data directory"),
    ] {
        let endpoint = format!("sqlite://{}", path.display());
        let stderr = refused(None, &["--endpoint", &endpoint]);
        assert!(stderr.contains(&format!("--endpoint {endpoint}: {} {found}", path.display())), "{stderr}");
        assert!(
            stderr.contains(
                "kine-rs does not serve etcd's files; `kine-rs snapshot restore` takes an etcd member's member/snap/db"
            ),
            "{stderr}"
        );
        assert!(stderr.contains("(README, \"Backups\")"), "{stderr}");
        assert_unchanged(&before, &files(&data), &endpoint);
    }
    // The bbolt file copied elsewhere is still etcd's.
    let copy = dir.path().join("copy.db");
    std::fs::copy(data.join("member/snap/db"), &copy).unwrap();
    let endpoint = format!("sqlite://{}", copy.display());
    let stderr = refused(None, &["--endpoint", &endpoint, "inspect", "status"]);
    assert!(
        stderr.contains(&format!(
            "{} is an etcd database file (bbolt, as etcd's member/snap/db), not a SQLite database",
            copy.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("kine-rs snapshot restore"), "{stderr}");
}

/// A file that is no database, and a database cut short: an error naming the file, nothing
/// written to it, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_are_no_database_are_refused_naming_them() {
    let dir = TempDir::new("foreign-files");
    let random = dir.path().join("random.db");
    let mut rng = kine_testkit::Rng::new(41);
    let bytes: Vec<u8> = (0..10_000).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(&random, &bytes).unwrap();

    // A real kine-rs database, then half of it.
    let whole = dir.path().join("whole.db");
    let mut node = Server::start(&["--endpoint", &format!("sqlite://{}", whole.display())]);
    let mut c = node.client().await;
    for i in 0..200 {
        c.put(format!("/k/{i}"), vec![b'v'; 2000], None).await.unwrap();
    }
    assert!(node.stop("SIGTERM").await.success());
    let full = std::fs::read(&whole).unwrap();
    let cut = dir.path().join("cut.db");
    std::fs::write(&cut, &full[..full.len() / 2 / 4096 * 4096]).unwrap();

    let before = files(dir.path());
    let cases = [
        (
            &random,
            "is not a SQLite database (10,000 bytes that do not begin with SQLite's header); nothing was written to it",
        ),
        (&cut, "is a damaged SQLite database (truncated: its header counts"),
    ];
    for (path, found) in cases {
        let endpoint = format!("sqlite://{}", path.display());
        for args in [vec!["--endpoint", endpoint.as_str()], vec!["--endpoint", endpoint.as_str(), "inspect", "status"]]
        {
            let stderr = refused(None, &args);
            assert!(stderr.contains(&format!("--endpoint {endpoint}: {} {found}", path.display())), "{stderr}");
        }
    }
    assert_unchanged(&before, &files(dir.path()), "after kine-rs");
}
