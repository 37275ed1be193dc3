//! 1,000 watchers resuming at once from old revisions right after a restart, as kube-apiserver's
//! watch cache and its clients do when the datastore comes back: every watcher gets every event
//! from its start revision on, exactly once and in order, while writes go on; on SQLite and on
//! the embedded NATS server.

mod common;
use common::*;
use etcd_client::{Client, EventType, WatchOptions};
use std::time::Duration;

const KEYS: usize = 50;
/// Revisions written before the restart (2..=HISTORY+1).
const HISTORY: i64 = 400;
/// Revisions written while the watchers resume.
const LIVE: i64 = 100;
const CONNECTIONS: usize = 20;
const WATCHERS_PER_CONNECTION: usize = 50;

async fn write(client: &mut Client, from: i64, n: i64) {
    // One revision per request: every tenth deletes the key the one before it wrote.
    for i in from..from + n {
        if i % 10 == 9 {
            client.delete(format!("/resume/{}", (i - 1) as usize % KEYS), None).await.unwrap();
        } else {
            client.put(format!("/resume/{}", i as usize % KEYS), format!("v{i}"), None).await.unwrap();
        }
    }
}

/// Runs the scenario on the datastore `endpoint` (a fresh one).
async fn resume_after_restart(endpoint: &str) {
    let mut server = Server::start(&["--endpoint", endpoint]);
    let mut c = server.client().await;
    write(&mut c, 0, HISTORY).await;
    let last = c.get("/resume/", None).await.unwrap().header().unwrap().revision();
    assert_eq!(last, HISTORY + 1);
    drop(c);
    assert!(server.stop("TERM").await.success());
    let server = Server::start(&["--endpoint", endpoint]);
    let end = last + LIVE;
    // Each watcher resumes from its own old revision, spread over the whole history.
    let mut tasks = Vec::new();
    for conn in 0..CONNECTIONS {
        let client = server.client().await;
        for w in 0..WATCHERS_PER_CONNECTION {
            let n = conn * WATCHERS_PER_CONNECTION + w;
            let start = 2 + (n as i64 * 7) % HISTORY;
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let opts = WatchOptions::new().with_prefix().with_start_revision(start);
                let mut stream = client.watch("/resume/", Some(opts)).await.expect("watch");
                let mut seen = Vec::new();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
                while seen.last().copied().unwrap_or(0) < end {
                    let resp = tokio::time::timeout_at(deadline, stream.message())
                        .await
                        .unwrap_or_else(|_| panic!("watcher {n} from {start}: stalled at {:?}", seen.last()))
                        .expect("watch stream")
                        .expect("watch stream open");
                    assert!(!resp.canceled(), "watcher {n} canceled: {}", resp.cancel_reason());
                    for e in resp.events() {
                        let kv = e.kv().unwrap();
                        let expect_delete = (kv.mod_revision() - 2) % 10 == 9;
                        assert_eq!(e.event_type() == EventType::Delete, expect_delete, "rev {}", kv.mod_revision());
                        seen.push(kv.mod_revision());
                    }
                }
                assert_eq!(seen, (start..=end).collect::<Vec<_>>(), "watcher {n} from {start}");
            }));
        }
    }
    // Writes go on while they catch up.
    let mut writer = server.client().await;
    write(&mut writer, HISTORY, LIVE).await;
    for t in tasks {
        t.await.unwrap();
    }
    let log = server.log();
    assert!(!log.lines().any(|l| l.contains(" ERROR ")), "kine-rs logged errors:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_watchers_resume_after_a_restart_on_sqlite() {
    let dir = TempDir::new("watch-resume");
    resume_after_restart(&db_endpoint(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_watchers_resume_after_a_restart_on_embedded_nats() {
    let dir = TempDir::new("watch-resume-nats");
    resume_after_restart(&format!("nats://?dataDir={}", dir.path().display())).await;
}
