//! Back from kine-rs to Go kine: `kine-rs migrate --to-go-kine` writes a kine-rs store as Go
//! kine's table (SQLite, PostgreSQL, MySQL), and the real Go kine v0.17.5 started on it serves
//! what kine-rs served — every key with its value and create and mod revision, the same header
//! revision, the same events to a watch from the compact revision — and takes the next write at
//! the next revision. A store Go kine's table cannot hold (two live keys written by one Txn) is
//! refused, and nothing is left behind.

mod common;
#[path = "common/go_kine.rs"]
mod go_kine;
use common::*;
use go_kine::{Compaction, GoKine, Served, served, write_like_kubernetes};
use kine_testkit::mysql::MariaDbServer;
use kine_testkit::postgres::PgServer;
use std::process::Command;

fn migrate(args: &[&str]) -> (bool, String) {
    let (ok, _, err) = run(Command::new(server_bin()).arg("migrate").args(args));
    (ok, err)
}

/// What kine-rs serves, leases as "held or not" (Go kine's lease ids are TTLs, kine-rs's not).
fn comparable(mut s: Served) -> Served {
    for k in s.keys.iter_mut() {
        k.4 = (k.4 != 0) as i64;
    }
    s
}

/// A kine-rs store with a Kubernetes-shaped history: Go kine's, converted, then written to by
/// kine-rs (a lease of kine-rs's own, a compaction), so both kinds of history are in it.
async fn a_kine_rs_store(dir: &std::path::Path) -> (String, i64) {
    let go_kine = format!("sqlite://{}", dir.join("go-kine.db").display());
    let go = GoKine::start_with(&go_kine, dir, &["--compact-min-retain", "10"]).await;
    write_like_kubernetes(&mut go.client().await, 0, 40, Some(Compaction::Sql)).await;
    go.stop().await;
    let kine_rs = format!("sqlite://{}", dir.join("kine-rs.db").display());
    let (ok, err) = migrate(&["--from", &go_kine, "--to", &kine_rs]);
    assert!(ok, "{err}");
    let server = Server::start(&["--endpoint", &kine_rs]);
    let mut c = server.client().await;
    let compacted = write_like_kubernetes(&mut c, 100, 140, None).await;
    assert_eq!(compacted, 0);
    let at = c.put("/registry/masterleases/y", "2", None).await.unwrap().header().unwrap().revision();
    c.compact(at - 5, None).await.unwrap();
    c.put("/registry/after/compaction", "z", None).await.unwrap();
    (kine_rs, at - 5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kine_rs_store_goes_back_to_go_kine_with_its_revisions() {
    let dir = TempDir::new("back-to-go-kine");
    let (kine_rs, compacted) = a_kine_rs_store(dir.path()).await;
    let original = {
        let server = Server::start(&["--endpoint", &kine_rs]);
        comparable(served(&mut server.client().await, compacted).await)
    };
    let pg = PgServer::start();
    let maria = MariaDbServer::start();
    let targets = [format!("sqlite://{}", dir.path().join("back.db").display()), pg.url("back"), maria.url("back")];
    for to in &targets {
        let (ok, err) = migrate(&["--from", &kine_rs, "--to", to, "--to-go-kine"]);
        assert!(ok, "{to}: {err}");
        assert!(err.contains("written as Go kine's table and verified"), "{err}");
        let go = GoKine::start(to, dir.path()).await;
        let mut c = go.client().await;
        assert_eq!(comparable(served(&mut c, compacted).await), original, "Go kine on {to}");
        let next = c.put("/registry/next", "x", None).await.unwrap().header().unwrap().revision();
        assert_eq!(next, original.revision + 1, "Go kine on {to} takes the next revision");
        go.stop().await;
    }
    // Written once: a target holding a table kine is refused.
    let (ok, err) = migrate(&["--from", &kine_rs, "--to", &targets[1], "--to-go-kine"]);
    assert!(!ok && err.contains("holds a table kine already"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_written_by_one_txn_cannot_go_back_and_nothing_is_left() {
    let dir = TempDir::new("back-refused");
    let from = format!("sqlite://{}", dir.path().join("kine-rs.db").display());
    {
        let server = Server::start(&["--endpoint", &from]);
        let mut c = server.client().await;
        let txn = etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::put("/registry/a", "1", None),
            etcd_client::TxnOp::put("/registry/b", "2", None),
        ]);
        c.txn(txn).await.unwrap();
    }
    let back = dir.path().join("back.db");
    let (ok, err) = migrate(&["--from", &from, "--to", &format!("sqlite://{}", back.display()), "--to-go-kine"]);
    assert!(!ok, "{err}");
    assert!(err.contains("\"/registry/a\" and \"/registry/b\" were both written at revision 2"), "{err}");
    assert!(!back.exists(), "a refused conversion left {}", back.display());
}
