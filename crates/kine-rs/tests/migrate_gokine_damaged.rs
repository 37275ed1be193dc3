//! Go kine datastores as they are found in the field, and conversions cut short:
//! - Go kine's old bug of several `compact_rev_key` rows (two Go kine processes starting at once
//!   each wrote one, in the middle of the history), and the hole its next start leaves when it
//!   deletes the extra row: the copy serves what Go kine serves on the same file;
//! - a truncated SQLite file: refused naming the file, the file untouched, no target left;
//! - `migrate --to-go-kine` killed with SIGKILL while it writes: nothing is left at the target's
//!   path (the file is written beside it and renamed once complete), and a rerun gives Go kine
//!   the whole store.

mod common;
#[path = "common/go_kine.rs"]
mod go_kine;
use common::*;
use go_kine::{Compaction, GoKine, served, write_like_kubernetes};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn migrate(args: &[&str]) -> (bool, String) {
    let (ok, _, err) = run(Command::new(server_bin()).arg("migrate").args(args));
    (ok, err)
}

fn sqlite(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

/// Whether `path` holds a `kine` table (Go kine's), opened read-only.
fn has_kine_table(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    let db = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    db.query_row("SELECT count(*) FROM sqlite_master WHERE name = 'kine'", [], |r| r.get::<_, i64>(0)).unwrap() > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_compact_rows_and_the_hole_they_leave_are_served_as_go_kine_serves_them() {
    let dir = TempDir::new("gokine-damaged");
    let damaged = dir.path().join("state.db");
    let go = GoKine::start_with(&sqlite(&damaged), dir.path(), &["--compact-min-retain", "10"]).await;
    let compacted = write_like_kubernetes(&mut go.client().await, 0, 60, Some(Compaction::Sql)).await;
    go.stop().await;

    // A second `compact_rev_key` row (with an older compact revision) where a change after the
    // compaction was: Go kine's bug, as two processes starting together left it.
    let db = rusqlite::Connection::open(&damaged).unwrap();
    let max: i64 = db.query_row("SELECT max(id) FROM kine", [], |r| r.get(0)).unwrap();
    let hole = (compacted + max) / 2;
    let changed = db
        .execute(
            "UPDATE kine SET name = 'compact_rev_key', created = 1, deleted = 0, create_revision = 0, \
             prev_revision = 1, lease = 0, value = x'', old_value = x'' WHERE id = ?1",
            [hole],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let duplicates: i64 =
        db.query_row("SELECT count(*) FROM kine WHERE name = 'compact_rev_key'", [], |r| r.get(0)).unwrap();
    assert_eq!(duplicates, 2);
    drop(db);

    // What Go kine serves on that file: its start removes the extra row (a hole at its id).
    let holed = dir.path().join("holed.db");
    std::fs::copy(&damaged, &holed).unwrap();
    let go = GoKine::start_with(&sqlite(&holed), dir.path(), &["--compact-min-retain", "10"]).await;
    let expected = served(&mut go.client().await, compacted).await;
    go.stop().await;
    assert!(!expected.events.iter().any(|e| e.0 == hole), "revision {hole} carries no change on Go kine");
    assert_eq!(expected.revision, max);

    // Both files, the one with two compact rows and the one with the hole, copy into kine-rs
    // and are served as Go kine serves them.
    for (name, from) in [("duplicates", &damaged), ("hole", &holed)] {
        let before = std::fs::read(from).unwrap();
        let to = dir.path().join(format!("kine-rs-{name}.db"));
        let (ok, err) = migrate(&["--from", &sqlite(from), "--to", &sqlite(&to)]);
        assert!(ok, "{name}: {err}");
        assert_eq!(std::fs::read(from).unwrap(), before, "{name}: Go kine's file changed");
        let line = err.lines().find(|l| l.contains("reading Go kine's table")).unwrap_or_default();
        let copied_at: i64 = line
            .split_once("compact_revision=")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .unwrap_or(-1);
        if name == "duplicates" {
            // The newest of the compact rows counts, as for Go kine.
            assert_eq!(copied_at, compacted, "{err}");
        } else {
            // Go kine's start deleted both compact rows (its fix of the bug finds no revision in
            // either): it reports no compaction; the rows the compaction removed say where the
            // history is complete, and the copy is compacted there.
            assert!(err.contains("history_complete_from"), "{err}");
            assert!(copied_at > 1 && copied_at <= compacted, "compacted at {copied_at} ({compacted}): {err}");
        }
        let server = Server::start(&["--endpoint", &sqlite(&to)]);
        let mut c = server.client().await;
        assert_eq!(served(&mut c, compacted).await, expected, "{name}");
        let below = c.get("/registry/", Some(etcd_client::GetOptions::new().with_revision(copied_at - 1))).await;
        assert!(below.is_err_and(|e| e.to_string().contains("compacted")), "{name}: below {copied_at}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_sqlite_file_is_refused_naming_it_and_left_as_it_was() {
    let dir = TempDir::new("gokine-truncated");
    let file = dir.path().join("state.db");
    let go = GoKine::start(&sqlite(&file), dir.path()).await;
    let mut c = go.client().await;
    for i in 0..300 {
        c.put(format!("/registry/configmaps/default/cm-{i:04}"), vec![7u8; 2048], None).await.unwrap();
    }
    go.stop().await;
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(&file, &whole[..whole.len() * 2 / 5]).unwrap();
    let truncated = std::fs::read(&file).unwrap();
    let to = dir.path().join("kine-rs.db");
    let (ok, err) = migrate(&["--from", &sqlite(&file), "--to", &sqlite(&to)]);
    assert!(!ok, "a truncated file was copied: {err}");
    assert!(err.contains(&file.display().to_string()), "the message names the file: {err}");
    assert!(err.contains("malformed") || err.contains("not a database"), "the message says what is wrong: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), truncated, "the source was changed");
    assert!(!has_kine_table(&to), "a target was left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_into_go_kine_killed_midway_leaves_nothing_a_rerun_refuses() {
    let dir = TempDir::new("to-gokine-killed");
    let store = sqlite(&dir.path().join("kine-rs.db"));
    let (keys, value) = (4000, vec![3u8; 900]);
    {
        let server = Server::start(&["--endpoint", &store]);
        let c = server.client().await;
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (mut c, value) = (c.clone(), value.clone());
                tokio::spawn(async move {
                    for i in (w..keys).step_by(8) {
                        c.put(format!("/registry/pods/default/p-{i:05}"), value.clone(), None).await.unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
    }
    let back = dir.path().join("back.db");
    let (mut killed, mut attempts) = (false, 0);
    // Killed as soon as the target file has grown (the rows are being written); a run that
    // finished first (a fast machine) is started again on a new file, up to 5 times.
    while !killed && attempts < 5 {
        attempts += 1;
        let _ = std::fs::remove_file(&back);
        let mut child = Command::new(server_bin())
            .args(["migrate", "--from", &store, "--to", &sqlite(&back), "--to-go-kine"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "the conversion failed");
                break;
            }
            // The file is written as `back.db.kine-rs-partial` (and its WAL) until it is complete.
            let partial = |suffix: &str| dir.path().join(format!("back.db.kine-rs-partial{suffix}"));
            if std::fs::metadata(partial("")).is_ok_and(|m| m.len() > 1 << 19)
                || std::fs::metadata(partial("-wal")).is_ok_and(|m| m.len() > 1 << 19)
            {
                child.kill().unwrap();
                child.wait().unwrap();
                killed = true;
                break;
            }
            assert!(Instant::now() < deadline, "the conversion did not finish within 120 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(killed, "the conversion always finished before it could be killed");
    assert!(!back.exists(), "a killed conversion left {} behind", back.display());

    let (ok, err) = migrate(&["--from", &store, "--to", &sqlite(&back), "--to-go-kine"]);
    assert!(ok, "the rerun after SIGKILL: {err}");
    let original = {
        let server = Server::start(&["--endpoint", &store]);
        served(&mut server.client().await, 0).await
    };
    let go = GoKine::start(&sqlite(&back), dir.path()).await;
    let got = served(&mut go.client().await, 0).await;
    // Go kine writes a key of its own at its start; the pods are the store's, at their revisions.
    let pods = |s: &go_kine::Served| s.keys.iter().filter(|k| k.0.starts_with(b"/registry/pods/")).cloned().collect();
    let pods_got: Vec<go_kine::Key> = pods(&got);
    assert_eq!(pods_got.len(), keys);
    assert_eq!(pods_got, pods(&original));
    assert!(got.revision >= original.revision);
}

/// MariaDB commits a table's creation at once: a conversion killed after it leaves an empty
/// `kine` table, which a rerun replaces (Go kine's start always writes a row, so an empty table
/// is never Go kine's data); a table with rows is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_kine_table_a_killed_conversion_left_in_mariadb_is_replaced() {
    let dir = TempDir::new("to-gokine-mariadb");
    let store = sqlite(&dir.path().join("kine-rs.db"));
    {
        let server = Server::start(&["--endpoint", &store]);
        let mut c = server.client().await;
        for i in 0..20 {
            c.put(format!("/registry/pods/default/p-{i:02}"), "pod", None).await.unwrap();
        }
    }
    let maria = kine_testkit::mysql::MariaDbServer::start();
    maria.root_sql("CREATE DATABASE back; CREATE TABLE back.kine (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY)");
    let (ok, err) = migrate(&["--from", &store, "--to", &maria.url("back"), "--to-go-kine"]);
    assert!(ok, "{err}");
    assert!(err.contains("dropping the empty table kine"), "{err}");
    let go = GoKine::start(&maria.url("back"), dir.path()).await;
    let got = served(&mut go.client().await, 0).await;
    assert_eq!(got.keys.iter().filter(|k| k.0.starts_with(b"/registry/pods/")).count(), 20);
    go.stop().await;
    let (ok, err) = migrate(&["--from", &store, "--to", &maria.url("back"), "--to-go-kine"]);
    assert!(!ok && err.contains("holds a table kine already"), "a table with rows is refused: {err}");
}
