//! A small write-load generator for measurements (not a test): N concurrent etcd clients each
//! put unique keys for a fixed time, then it prints throughput and latency percentiles.
//!
//! cargo run --release -p kine-rs --example loadgen -- http://127.0.0.1:2379 64 10 256
//! (endpoint, clients, seconds, value bytes)

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let endpoint = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:2379".into());
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let seconds: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10);
    let size: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(256);
    let client = etcd_client::Client::connect([endpoint.as_str()], None).await.expect("connect");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for t in 0..clients {
        let mut c = client.clone();
        let value = vec![b'x'; size];
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let start = Instant::now();
                c.put(format!("/load/{t}/{i}"), value.clone(), None).await.expect("put");
                latencies.push(start.elapsed());
                i += 1;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    println!(
        "clients={clients} seconds={seconds} value_bytes={size} writes={} writes_per_s={:.0} p50={:?} p99={:?}",
        all.len(),
        all.len() as f64 / seconds as f64,
        pct(0.50),
        pct(0.99)
    );
}
