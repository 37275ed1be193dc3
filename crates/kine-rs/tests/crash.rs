//! Crash safety: concurrent writers against a kine-rs killed with SIGKILL mid-load (on SQLite,
//! and on the embedded NATS server). After a restart every acknowledged write is there, at the
//! revision it was acknowledged with, and the revision history is gap-free.

mod common;
use common::*;
use etcd_client::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_write() {
    let dir = TempDir::new("crash");
    kill_under_load(&db_endpoint(dir.path()), 2).await;
}

/// The same on the embedded NATS server (one server, replicas=1), with nats-server's default
/// durability: it writes every message to the operating system before acknowledging it, and
/// fsyncs every 2 minutes (docs/nats.md says what that means for a power loss).
#[cfg(feature = "embedded-nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_write_on_embedded_nats() {
    let dir = TempDir::new("crash-nats");
    kill_under_load(&format!("nats://?dataDir={}", dir.path().join("js").display()), 2).await;
}

/// With `syncAlways`, JetStream also fsyncs every message before acknowledging it.
#[cfg(feature = "embedded-nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_write_on_embedded_nats_with_sync_always() {
    let dir = TempDir::new("crash-nats-sync");
    kill_under_load(&format!("nats://?syncAlways&dataDir={}", dir.path().join("js").display()), 2).await;
}

/// Writers on `endpoint` while kine-rs is killed with SIGKILL, `rounds` times.
async fn kill_under_load(endpoint: &str, rounds: usize) {
    let endpoint = endpoint.to_string();
    for round in 0..rounds {
        let mut server = Server::start(&["--endpoint", &endpoint]);
        let c = server.client().await;
        let mut writers = Vec::new();
        for t in 0..16 {
            let mut c = c.clone();
            writers.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0.. {
                    let key = format!("/crash/{round}/{t}/{i}");
                    match c.put(key.clone(), format!("{i}"), None).await {
                        Ok(r) => acked.push((key, r.header().unwrap().revision())),
                        Err(_) => break,
                    }
                }
                acked
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        server.child.kill().unwrap(); // SIGKILL
        server.child.wait().unwrap();
        let mut acked = Vec::new();
        for w in writers {
            acked.extend(w.await.unwrap());
        }
        assert!(acked.len() > 50, "the load ran ({} writes acknowledged)", acked.len());

        let server = Server::start(&["--endpoint", &endpoint]);
        let mut c = server.client().await;
        for (key, rev) in &acked {
            let r = c.get(key.as_str(), None).await.unwrap();
            assert_eq!(r.kvs().len(), 1, "acknowledged write {key} (revision {rev}) lost in round {round}");
            assert_eq!(r.kvs()[0].mod_revision(), *rev, "{key}");
        }
        // Gap-free: every revision from 2 to the current one holds exactly one write here.
        let current = c.get("x", None).await.unwrap().header().unwrap().revision();
        let mut w = c.watch("/crash/", Some(WatchOptions::new().with_prefix().with_start_revision(2))).await.unwrap();
        let mut expected = 2;
        while expected <= current {
            let r = tokio::time::timeout(Duration::from_secs(10), w.message()).await.unwrap().unwrap().unwrap();
            for e in r.events() {
                assert_eq!(e.kv().unwrap().mod_revision(), expected, "revision gap or duplicate");
                expected += 1;
            }
        }
        drop(server);
    }
}
