//! Watchers as Kubernetes reflectors run them: one watch of the whole prefix per node, resumed
//! after any error from the revision after the last event it delivered.

use crate::history::Event;
use crate::workload::decode;
use etcd_client::{Client, EventType, WatchOptions};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one watcher delivered.
#[derive(Default)]
pub struct Delivered {
    /// Every event, in the order it arrived.
    pub events: Vec<Event>,
    /// The newest revision the watcher is known to have caught up to (events or progress).
    pub caught_up: i64,
    /// How many times the watch was restarted after an error.
    pub resumes: u64,
    /// Errors other than the stream ending (e.g. a compacted revision: a gap the reflector
    /// would have to relist to cover).
    pub failures: Vec<String>,
}

pub struct Watcher {
    pub node: usize,
    pub delivered: Arc<Mutex<Delivered>>,
    /// The revision the watcher has delivered everything up to (shared with the compactor).
    pub progress: Arc<AtomicI64>,
}

impl Watcher {
    /// Starts watching `prefix` on `client` from `start` (the first revision of the workload).
    pub fn spawn(node: usize, client: Client, prefix: String, start: i64, stop: Arc<AtomicBool>) -> Watcher {
        let delivered = Arc::new(Mutex::new(Delivered { caught_up: start - 1, ..Default::default() }));
        let progress = Arc::new(AtomicI64::new(start - 1));
        let (d, p) = (delivered.clone(), progress.clone());
        tokio::spawn(async move {
            let mut next = start;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = watch_from(client.clone(), &prefix, &mut next, &d, &p, &stop).await {
                    d.lock().unwrap().failures.push(e);
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                d.lock().unwrap().resumes += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Watcher { node, delivered, progress }
    }

    pub fn caught_up(&self) -> i64 {
        self.delivered.lock().unwrap().caught_up
    }

    /// The events delivered and the revision they are complete up to, read together: read one
    /// after the other, an event arriving in between would seem missing.
    pub fn snapshot(&self) -> (Vec<Event>, i64) {
        let d = self.delivered.lock().unwrap();
        (d.events.clone(), d.caught_up)
    }
}

/// One watch stream, until it ends. Connection errors end it quietly (the caller resumes);
/// a cancellation by the server (a compacted start revision) is returned as an error.
async fn watch_from(
    mut client: Client,
    prefix: &str,
    next: &mut i64,
    delivered: &Mutex<Delivered>,
    progress: &AtomicI64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let options = WatchOptions::new().with_prefix().with_start_revision(*next).with_progress_notify();
    let Ok(Ok(mut stream)) = tokio::time::timeout(Duration::from_secs(3), client.watch(prefix, Some(options))).await
    else {
        return Ok(());
    };
    while !stop.load(Ordering::Relaxed) {
        let message = match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
            Err(_) => {
                // Ask for progress so that a quiet stream still says how far it got.
                let _ = stream.request_progress().await;
                continue;
            }
            Ok(Ok(Some(m))) => m,
            Ok(_) => return Ok(()),
        };
        if message.canceled() {
            return Err(format!(
                "watch from {} canceled: {} (compact revision {})",
                *next,
                message.cancel_reason(),
                message.compact_revision()
            ));
        }
        let mut d = delivered.lock().unwrap();
        for e in message.events() {
            let Some(kv) = e.kv() else { continue };
            let value = match e.event_type() {
                EventType::Put => Some(decode(kv.value()).unwrap_or(u64::MAX)),
                EventType::Delete => None,
            };
            let revision = kv.mod_revision();
            d.events.push(Event { revision, key: String::from_utf8_lossy(kv.key()).into_owned(), value });
            *next = (*next).max(revision + 1);
        }
        let header = message.header().map(|h| h.revision()).unwrap_or(0);
        // A response with events is complete up to its last event; a progress notification
        // (no events) up to its header revision.
        // The creation answer carries the current revision, not the watcher's position.
        let upto = match (message.created(), message.events().is_empty()) {
            (true, true) => continue,
            (_, true) => header,
            (_, false) => *next - 1,
        };
        if upto > d.caught_up {
            d.caught_up = upto;
            *next = (*next).max(upto + 1);
            progress.store(upto, Ordering::Relaxed);
        }
    }
    Ok(())
}
