//! Every committed fuzz input — the seeds, and each input that once made a target fail
//! (`crates/fuzz/regressions/<target>/`) — through its target: none may panic or hang. This is
//! how a fuzzer's finding stays fixed in the ordinary test suite.

use std::path::Path;

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else { continue };
        for entry in dir.flatten() {
            let bytes = std::fs::read(entry.path()).expect("read an input");
            found.push((format!("{kind}/{target}/{}", entry.file_name().to_string_lossy()), bytes));
        }
    }
    found.sort();
    found
}

fn replay(target: &str, f: fn(&[u8])) {
    let all = inputs(target);
    assert!(
        !all.is_empty(),
        "no seeds for {target}: run `cargo run -p kine-fuzz --bin fuzz-seeds -- crates/fuzz/seeds`"
    );
    for (name, bytes) in all {
        eprintln!("{name}");
        f(&bytes);
    }
}

#[test]
fn grpc_inputs() {
    replay("grpc", kine_fuzz::grpc);
}

#[test]
fn http_inputs() {
    replay("http", kine_fuzz::http);
    // The harness reaches the handler: real answers come back over the pipe.
    let answer = |request: &str| String::from_utf8_lossy(&kine_fuzz::http_exchange(request.as_bytes())).into_owned();
    let metrics = answer("GET /metrics HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n");
    assert!(
        metrics.starts_with("HTTP/1.1 200 OK") && metrics.contains("etcd_debugging_mvcc_current_revision"),
        "{metrics}"
    );
    let health = answer("GET /health HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n");
    assert!(health.starts_with("HTTP/1.1 200 OK") && health.ends_with(r#"{"health":"true","reason":""}"#), "{health}");
    let bad = answer("GET /health?lag=soon HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n");
    assert!(bad.starts_with("HTTP/1.1 400 Bad Request") && bad.contains("lag=soon"), "{bad}");
    let post = answer("POST /metrics HTTP/1.1\r\nHost: k\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed"), "{post}");
    assert!(answer("garbage\r\n\r\n").starts_with("HTTP/1.1 400"), "hyper refuses what is not HTTP");
}

#[test]
fn endpoint_inputs() {
    replay("endpoints", kine_fuzz::endpoints);
}

#[test]
fn nats_message_inputs() {
    replay("nats_message", kine_fuzz::nats_message);
}

#[test]
fn bbolt_inputs() {
    replay("bbolt", |data| {
        let _ = kine_fuzz::bbolt(data);
    });
    // The seeds are real snapshots (kine-rs's and etcd's), which the check accepts.
    for (name, bytes) in inputs("bbolt").into_iter().filter(|(n, _)| n.starts_with("seeds/")) {
        kine_fuzz::bbolt(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn snapshot_inputs() {
    replay("snapshot", kine_fuzz::snapshot);
    // The seeds are real snapshots, so that the fuzzer starts deep inside the parser.
    for (name, bytes) in inputs("snapshot").into_iter().filter(|(n, _)| n.starts_with("seeds/")) {
        use sha2::Digest;
        let mut file = bytes[1..].to_vec();
        file.extend_from_slice(&sha2::Sha256::digest(&bytes[1..]));
        kine_core::snapshot::decode(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
