//! `kine-rs migrate` into NATS (embedded, an external server, a 3-node cluster with R3), from
//! NATS into NATS, and back out: the copy, served, answers as the original did, at the same
//! revisions; a history whose revision of several keys cannot be written where it was starts
//! at that revision; a store whose keys cannot be held at their revisions is refused with
//! nothing written; a copy killed with SIGKILL (copying the keys, copying the history)
//! continues when run again.

mod common;
use common::answers::{Answers, answers, migrate};
use common::history::{load_one_change_per_revision, watched};
use common::*;
use etcd_client::{Txn, TxnOp};
use kine_testkit::nats::{NatsCluster, NatsServer};
use std::process::Command;
use std::time::Instant;

/// An SQLite store with a Kubernetes-like history, a lease and a user: (endpoint, compact
/// revision, a revision after it, its answers).
async fn loaded_sqlite(dir: &std::path::Path) -> (String, i64, i64, Answers) {
    let sqlite = db_endpoint(dir);
    let (compact, middle) = {
        let server = Server::start(&["--endpoint", &sqlite]);
        let mut c = server.client().await;
        let marks = load_one_change_per_revision(&mut c).await;
        c.user_add("reader", "readerpw", None).await.unwrap();
        c.role_add("configmap-reader").await.unwrap();
        c.user_grant_role("reader", "configmap-reader").await.unwrap();
        marks
    };
    let original = answers(&sqlite, compact, middle).await;
    assert!(original.below_compact.contains("required revision has been compacted"), "{}", original.below_compact);
    assert_eq!((original.leases.len(), original.users.len()), (1, 1));
    (sqlite, compact, middle, original)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_into_embedded_nats_and_back_with_its_history() {
    let dir = TempDir::new("migrate-nats");
    let (sqlite, compact, middle, original) = loaded_sqlite(dir.path()).await;
    let store = TempDir::new("migrate-nats-store");
    let nats = format!("nats://?dataDir={}", store.path().display());
    // A dry run creates nothing.
    let (ok, out, err) =
        run(Command::new(server_bin()).args(["migrate", "--dry-run", "--from", &sqlite, "--to", &nats]));
    assert!(ok && out.contains("the copy starts an embedded server there"), "{out}{err}");
    assert!(!store.path().join("jetstream").exists(), "a dry run created the store");
    let started = Instant::now();
    let (ok, err) = migrate(&sqlite, &nats, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    eprintln!("SQLite → embedded NATS ({} revisions): {:?}", original.revision, started.elapsed());
    assert_eq!(answers(&nats, compact, middle).await, original);
    // Run again: checked, and nothing to add.
    let (ok, err) = migrate(&sqlite, &nats, &[]);
    assert!(ok && err.contains("continuing") && err.contains("copied and verified"), "{err}");

    // Back out of NATS into SQLite, with the same answers.
    let back = format!("sqlite://{}", dir.path().join("back.db").display());
    let (ok, err) = migrate(&nats, &back, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    assert_eq!(answers(&back, compact, middle).await, original);

    // NATS into NATS: an external server's bucket.
    let external = NatsServer::start();
    let again = format!("{}?noEmbed&bucket=again", external.url());
    let (ok, err) = migrate(&nats, &again, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    assert_eq!(answers(&again, compact, middle).await, original);

    // The NATS copy takes the next write at the next revision.
    let server = Server::start(&["--endpoint", &nats]);
    let put = server.client().await.put("/next", "x", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), original.revision + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_into_a_three_node_nats_cluster() {
    let dir = TempDir::new("migrate-nats");
    let (sqlite, compact, middle, original) = loaded_sqlite(dir.path()).await;
    let cluster = NatsCluster::start();
    let to = format!("nats://127.0.0.1:{}?noEmbed&bucket=moved&replicas=3", cluster.nodes[0].port);
    let started = Instant::now();
    let (ok, err) = migrate(&sqlite, &to, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    eprintln!("SQLite → 3-node NATS cluster, R3 ({} revisions): {:?}", original.revision, started.elapsed());
    // Served through another node of the cluster.
    let other = format!("nats://127.0.0.1:{}?noEmbed&bucket=moved&replicas=3", cluster.nodes[1].port);
    assert_eq!(answers(&other, compact, middle).await, original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_of_several_keys_that_does_not_fit_starts_the_history() {
    let dir = TempDir::new("migrate-nats");
    let sqlite = db_endpoint(dir.path());
    let (txn, expected, at_txn, events) = {
        let server = Server::start(&["--endpoint", &sqlite]);
        let mut c = server.client().await;
        for i in 0..20 {
            c.put(format!("/registry/cm/{i:05}"), "v", None).await.unwrap();
        }
        let compact = c.put("/registry/cm/00000", "w", None).await.unwrap().header().unwrap().revision();
        c.compact(compact, None).await.unwrap();
        for i in 0..5 {
            c.put(format!("/registry/cm/{i:05}"), "after", None).await.unwrap();
        }
        // Three keys at one revision, right after revisions of one change each: NATS would
        // need the two sequences before it (their changes are overwritten by it, so the keys
        // at it fit).
        let puts = ["/registry/cm/00003", "/registry/cm/00004", "/registry/t/0"].map(|k| TxnOp::put(k, "txn", None));
        let txn = c.txn(Txn::new().and_then(puts)).await.unwrap().header().unwrap().revision();
        for i in 5..9 {
            c.put(format!("/registry/cm/{i:05}"), "later", None).await.unwrap();
        }
        let expected = everything(&mut c).await;
        let events = watched(&mut c, "/registry/", txn - 1, expected.0).await;
        (txn, expected, keys_at(&mut c, txn).await, events)
    };
    let nats = NatsServer::start();
    let to = format!("{}?noEmbed&bucket=auto", nats.url());
    // A bucket a kine-rs serves is refused.
    let busy = format!("{}?noEmbed&bucket=busy", nats.url());
    let node = Server::start(&["--endpoint", &busy, "--name", "busy-node"]);
    let (ok, err) = migrate(&sqlite, &busy, &[]);
    assert!(!ok && err.contains("--to is being served by kine-rs busy-node"), "{err}");
    drop(node);
    let (ok, out, err) = run(Command::new(server_bin()).args(["migrate", "--dry-run", "--from", &sqlite, "--to", &to]));
    assert!(
        ok && out.contains(&format!("keys at revision {txn} ")) && out.contains("the copy creates it"),
        "{out}{err}"
    );
    let (ok, err) = migrate(&sqlite, &to, &[]);
    assert!(ok && err.contains("copied and verified"), "{err}");
    assert!(
        err.contains("the history is copied from this revision on") && err.contains(&format!("revision={txn}")),
        "{err}"
    );
    let server = Server::start(&["--endpoint", &to]);
    let mut c = server.client().await;
    assert_eq!(everything(&mut c).await, expected);
    assert_eq!(keys_at(&mut c, txn).await, at_txn);
    assert_eq!(watched(&mut c, "/registry/", txn - 1, expected.0).await, events);
    let before = c.get("/registry/cm/00000", Some(etcd_client::GetOptions::new().with_revision(txn - 1))).await;
    assert!(before.is_err_and(|e| e.to_string().contains("compacted")), "compacted at revision {txn}");
    drop(server);

    // Keys sharing a mod revision with no room before it: refused, nothing written.
    let dense = format!("sqlite://{}", dir.path().join("dense.db").display());
    {
        let server = Server::start(&["--endpoint", &dense]);
        let puts: Vec<TxnOp> = (0..3).map(|i| TxnOp::put(format!("/d/{i}"), "x", None)).collect();
        server.client().await.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    let to = format!("{}?noEmbed&bucket=dense", nats.url());
    let (ok, _, err) = run(Command::new(server_bin()).args(["migrate", "--dry-run", "--from", &dense, "--to", &to]));
    assert!(!ok && err.contains("share mod revision 2"), "{err}");
    let (ok, err) = migrate(&dense, &to, &[]);
    assert!(!ok && err.contains("\"/d/0\", \"/d/1\", \"/d/2\" share mod revision 2"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    let server = Server::start(&["--endpoint", &to]);
    assert_eq!(everything(&mut server.client().await).await, (1, vec![]));
}

/// `kine-rs inspect status` of a store: (revision, compact revision, keys), if it can be read.
fn status(endpoint: &str) -> Option<(i64, i64, i64)> {
    let (ok, out, _) =
        run(Command::new(server_bin()).args(["--endpoint", endpoint, "inspect", "--output", "json", "status"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).ok().filter(|_| ok)?;
    Some((v["revision"].as_i64()?, v["compact_revision"].as_i64()?, v["keys"].as_i64()?))
}

/// A copy into NATS killed (SIGKILL) while it copies the keys continues where it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_into_nats_killed_midway_continues() {
    let dir = TempDir::new("migrate-nats");
    let from = db_endpoint(dir.path());
    let keys: i64 = 20_000;
    let hash_kv = |endpoint: String| async move {
        let server = Server::start(&["--endpoint", &endpoint]);
        let mut c = server.client().await;
        let revision = c.get("/", None).await.unwrap().header().unwrap().revision();
        (revision, c.hash_kv(revision).await.unwrap().hash())
    };
    {
        let server = Server::start(&["--endpoint", &from]);
        let mut tasks = Vec::new();
        for t in 0..8 {
            let mut c = server.client().await;
            tasks.push(tokio::spawn(async move {
                for i in (t..keys).step_by(8) {
                    c.put(format!("/big/{i:06}"), vec![b'v'; 2000], None).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    let (revision, hash) = hash_kv(from.clone()).await;
    let nats = NatsServer::start();
    // Killed while it copies the keys (--current-only: all of them at the source's revision).
    let to = killed_midway(&from, &nats, "keys", &["--current-only"], |(_, compacted, n)| {
        n > 0 && n < keys && compacted < revision
    });
    let (ok, err) = migrate(&from, &to, &["--current-only"]);
    assert!(ok && err.contains("continuing an earlier copy of the keys"), "{err}");
    assert_eq!(status(&to), Some((revision, revision, keys)));
    assert_eq!(hash_kv(to).await, (revision, hash), "the same keys at the same revision");

    // Killed while it copies the history (the source was never compacted: all of it).
    let to = killed_midway(&from, &nats, "history", &[], |(current, _, _)| current > 1 && current < revision);
    let (ok, err) = migrate(&from, &to, &[]);
    assert!(ok && err.contains("holds a copy of --from up to this revision; continuing"), "{err}");
    assert_eq!(hash_kv(to).await, (revision, hash), "the same keys at the same revision");
}

/// Runs `migrate --from from --to <a new bucket> [extra]` and kills it (SIGKILL) as soon as
/// the target's `(revision, compact revision, keys)` are `midway`; the target. Up to six tries.
fn killed_midway(
    from: &str,
    nats: &NatsServer,
    name: &str,
    extra: &[&str],
    midway: impl Fn((i64, i64, i64)) -> bool,
) -> String {
    for attempt in 0..6 {
        let to = format!("{}?noEmbed&bucket={name}{attempt}", nats.url());
        let mut copy = Command::new(server_bin())
            .args(["migrate", "--from", from, "--to", &to])
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        while copy.try_wait().unwrap().is_none() {
            if status(&to).is_some_and(&midway) {
                copy.kill().unwrap();
                let _ = copy.wait();
                return to;
            }
        }
        eprintln!("attempt {attempt}: the copy finished before it could be stopped midway");
    }
    panic!("six copies finished before one could be stopped midway");
}
