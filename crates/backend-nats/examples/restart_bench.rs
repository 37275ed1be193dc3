//! Measures how long a kine-rs NATS backend takes to load a bucket holding many revisions
//! (not a test). It fills the bucket with `revisions` puts spread over `keys` keys (published
//! in kine-rs's message format, pipelined), optionally compacts, then times a fresh open.
//!
//! cargo run --release -p kine-backend-nats --example restart_bench -- nats://127.0.0.1:4222 bench 10000 1000000 [compact]

use kine_backend_nats::{NatsBackend, NatsOptions, message};
use kine_core::backend::Backend;
use kine_core::{Event, EventKind, KeyValue};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).cloned().unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let bucket = args.get(2).cloned().unwrap_or_else(|| "bench".into());
    let keys: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let revisions: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let compact = args.get(5).is_some_and(|s| s == "compact");
    let endpoint = format!("{url}?bucket={bucket}");
    let config =
        kine_backend_nats::config::parse(&endpoint, |_| Ok(Duration::from_millis(500))).map_err(anyhow::Error::msg)?;
    let options = NatsOptions::new(config);
    let backend = NatsBackend::open(options.clone()).await?;
    backend.close().await;

    let client = async_nats::connect(&url).await?;
    let js = async_nats::jetstream::new(client);
    let started = Instant::now();
    let mut versions = vec![(0i64, 0i64); keys];
    let mut pending = Vec::with_capacity(1_000);
    for i in 0..revisions {
        let k = i % keys;
        let seq = i as i64 + 2; // the init marker is sequence 1
        let (create, version) = &mut versions[k];
        if *version == 0 {
            *create = seq;
        }
        *version += 1;
        let key = format!("/registry/bench/{k:08}").into_bytes();
        let event = Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: key.clone(),
                create_revision: *create,
                mod_revision: seq,
                version: *version,
                value: vec![b'x'; 200],
                lease: 0,
            },
            prev_kv: None,
        };
        let (headers, payload) = message::encode(&event);
        pending.push(js.publish_with_headers(message::subject(&bucket, &key), headers, payload).await?);
        if pending.len() == 1_000 {
            for ack in pending.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in pending.drain(..) {
        ack.await?;
    }
    println!("filled {revisions} revisions over {keys} keys in {:.1} s", started.elapsed().as_secs_f64());

    if compact {
        let backend = NatsBackend::open(options.clone()).await?;
        let current = backend.revisions().await?.current;
        let started = Instant::now();
        backend.compact(current - 1000).await?;
        println!("compacted to {} in {:.1} s", current - 1000, started.elapsed().as_secs_f64());
        backend.close().await;
    }

    let started = Instant::now();
    let backend = NatsBackend::open(options).await?;
    let elapsed = started.elapsed();
    let revs = backend.revisions().await?;
    println!(
        "open (connect + load the retained messages): {:.2} s; revision {} compacted {}",
        elapsed.as_secs_f64(),
        revs.current,
        revs.compacted
    );
    backend.close().await;
    Ok(())
}
