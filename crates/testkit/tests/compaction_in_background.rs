//! A compaction records its revision in one short transaction and removes what it superseded
//! afterwards, in batches, apart from the writes (`crates/backend-sql/src/removal.rs`):
//! - on PostgreSQL and MySQL, with the removal held up by another session's lock on an old
//!   version, a compaction without `physical` answers, reads below it are refused, and writes
//!   go on; once the lock goes, the removal finishes; a `physical` compaction answers only
//!   when its versions are gone;
//! - on every SQL backend, a removal left unfinished (a crash after the compact revision was
//!   recorded) is finished by the next start.

use kine_core::backend::Backend;
use kine_core::request::RangeRequest;
use kine_core::{Error, KeyRange};
use kine_testkit::contract::{put, store};
use kine_testkit::session::Session;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Guards against a hang; no test here measures time.
const PATIENCE: Duration = Duration::from_secs(30);

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn read_at(s: &kine_core::store::Store, key: &str, revision: i64) -> kine_core::Result<usize> {
    let req = RangeRequest { revision, ..RangeRequest::new(KeyRange::single(key)) };
    Ok(s.range(req).await?.value.kvs.len())
}

/// `lock` holds a row lock on the log row at revision 2 (the first of key "a"'s 20 versions)
/// in `session`'s open transaction; `versions(key)` counts a key's rows in the log.
async fn writes_go_on_while_a_removal_waits(
    backend: Arc<dyn Backend>,
    mut session: Session,
    lock: &str,
    versions: impl Fn(&str) -> i64,
) {
    let s = store(backend).await;
    for i in 0..20 {
        put(&s, "a", &format!("a{i}")).await;
    }
    let compact_at = put(&s, "b", "b").await;
    session.run(lock);
    let answered = tokio::time::timeout(PATIENCE, s.compact_with(compact_at, false))
        .await
        .expect("a compaction without physical answers while its removal waits for a lock")
        .expect("compact");
    assert_eq!(answered, compact_at);
    assert!(
        matches!(read_at(&s, "a", 5).await, Err(Error::Compacted { compact_revision }) if compact_revision == compact_at)
    );
    assert_eq!(read_at(&s, "a", compact_at).await.unwrap(), 1);
    tokio::time::timeout(PATIENCE, async {
        for i in 0..20 {
            put(&s, "c", &format!("c{i}")).await;
        }
    })
    .await
    .expect("writes go on while the removal waits");
    assert_eq!(versions("a"), 20, "the lock held the removal up, so the writes went on beside it");
    session.run("ROLLBACK;");
    eventually("the removal finishes once the lock is gone", || versions("a") == 1).await;
    // A physical compaction answers when its versions are gone.
    let current = put(&s, "c", "last").await;
    s.compact_with(current, true).await.expect("physical compact");
    assert_eq!(versions("c"), 1, "answered before the removal was done");
}

/// `forget` makes the database look as after a crash between a compaction's two steps: the
/// compact revision recorded at 12, nothing removed.
async fn an_unfinished_removal_resumes_at_start(
    open: impl Fn() -> Arc<dyn Backend>,
    forget: impl Fn(),
    versions: impl Fn(&str) -> i64,
) {
    let backend = open();
    let s = store(backend.clone()).await;
    for i in 0..10 {
        put(&s, "a", &format!("a{i}")).await;
    }
    assert_eq!(put(&s, "b", "b").await, 12);
    backend.close().await;
    drop((s, backend));
    forget();
    assert_eq!(versions("a"), 10);
    let backend = open();
    let s = store(backend.clone()).await;
    assert!(matches!(read_at(&s, "a", 5).await, Err(Error::Compacted { compact_revision: 12 })));
    eventually("the removal owed resumes at start", || versions("a") == 1).await;
    assert_eq!(read_at(&s, "a", 12).await.unwrap(), 1);
    backend.close().await;
}

fn number(text: String) -> i64 {
    text.trim().parse().unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_go_on_while_a_removal_waits() {
    let server = kine_testkit::postgres::PgServer::start();
    let backend = kine_testkit::postgres(&server, "background");
    let lock = "BEGIN; SELECT mod_revision FROM kv WHERE mod_revision = 2 FOR UPDATE;";
    let versions =
        |key: &str| number(server.sql("background", &format!("SELECT count(*) FROM kv WHERE key = '{key}'::bytea")));
    writes_go_on_while_a_removal_waits(backend, server.session("background"), lock, versions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_writes_go_on_while_a_removal_waits() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let backend = kine_testkit::mysql(&server, "background");
    let lock = "BEGIN; SELECT mod_revision FROM kv WHERE mod_revision = 2 FOR UPDATE;";
    let versions =
        |key: &str| number(server.root_sql(&format!("SELECT COUNT(*) FROM background.kv WHERE `key` = '{key}'")));
    writes_go_on_while_a_removal_waits(backend, server.session("background"), lock, versions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_unfinished_removal_resumes_at_start() {
    let server = kine_testkit::postgres::PgServer::start();
    let forget = || {
        server.sql(
            "resume",
            "UPDATE meta SET value = 12 WHERE name = 'compact_revision';
             INSERT INTO meta (name, value) VALUES ('compact_removed', -1)
             ON CONFLICT (name) DO UPDATE SET value = -1",
        );
    };
    let versions =
        |key: &str| number(server.sql("resume", &format!("SELECT count(*) FROM kv WHERE key = '{key}'::bytea")));
    an_unfinished_removal_resumes_at_start(|| kine_testkit::postgres(&server, "resume"), forget, versions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_an_unfinished_removal_resumes_at_start() {
    let server = kine_testkit::mysql::MariaDbServer::start();
    let forget = || {
        server.root_sql(
            "UPDATE resume.meta SET value = 12 WHERE name = 'compact_revision';
             INSERT INTO resume.meta (name, value) VALUES ('compact_removed', -1) ON DUPLICATE KEY UPDATE value = -1",
        );
    };
    let versions =
        |key: &str| number(server.root_sql(&format!("SELECT COUNT(*) FROM resume.kv WHERE `key` = '{key}'")));
    an_unfinished_removal_resumes_at_start(|| kine_testkit::mysql(&server, "resume"), forget, versions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_unfinished_removal_resumes_at_start() {
    let dir = kine_testkit::TempDir::new("resume");
    let path = dir.path().join("state.db");
    let forget = || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "UPDATE meta SET value = 12 WHERE name = 'compact_revision';
             INSERT OR REPLACE INTO meta (name, value) VALUES ('compact_removed', -1);",
        )
        .unwrap();
    };
    let versions = |key: &str| -> i64 {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.query_row("SELECT COUNT(*) FROM kv WHERE key = ?1", [key.as_bytes()], |r| r.get(0)).unwrap()
    };
    an_unfinished_removal_resumes_at_start(|| kine_testkit::sqlite(dir.path()), forget, versions).await;
}
