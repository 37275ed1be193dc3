//! Fuzz targets: everything kine-rs parses from outside. Each function takes arbitrary bytes and
//! must return normally (an error answer is fine); a panic or a hang is a finding. The binaries
//! in `src/bin` run them under cargo-afl (`scripts/fuzz`); `tests/replay.rs` runs every committed
//! seed and regression input through them in the ordinary test suite.

/// The check `kine-rs snapshot restore` makes of an etcd snapshot's bbolt file before bbolt
/// maps it (the binary's own source: it needs nothing but std).
#[path = "../../kine-rs/src/etcd_snapshot/verify.rs"]
mod bbolt_verify;
mod grpc;
mod http;
pub use grpc::grpc;
pub use http::{http, http_exchange};

use std::time::Duration;

/// A panic in a task of its own would only end that task (a closed stream, a dropped
/// connection): the targets that serve in tasks abort instead, so that the fuzzer sees it.
fn abort_on_panic() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        hook(info);
        std::process::abort();
    }));
}

/// An endpoint URL or DSN as a user types it (`--endpoint`): the NATS URL parser and the MySQL
/// DSN parser (and its redaction for logs).
pub fn endpoints(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = kine_backend_nats::config::parse(&text, parse_duration);
    let _ = kine_backend_sql::parse_mysql_dsn(&text, false);
    let _ = kine_backend_sql::parse_mysql_dsn(&text, true);
    let _ = kine_backend_sql::redact_mysql_dsn(&text);
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    text.strip_suffix('s').and_then(|n| n.parse().ok()).map(Duration::from_secs).ok_or_else(|| "bad".into())
}

/// A message read from a NATS KV stream (another writer may have put anything there): subject
/// and header lines, a blank line, then the payload.
pub fn nats_message(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (head, payload) = match text.split_once("\n\n") {
        Some((h, p)) => (h.to_string(), p.as_bytes().to_vec()),
        None => (text.to_string(), Vec::new()),
    };
    let mut lines = head.lines();
    let subject = lines.next().unwrap_or("").to_string();
    let mut headers = async_nats::HeaderMap::new();
    let mut any = false;
    for line in lines {
        if let Some((k, v)) = line.split_once(':')
            && let (Ok(name), Ok(value)) =
                (k.trim().parse::<async_nats::HeaderName>(), v.trim().parse::<async_nats::HeaderValue>())
        {
            headers.insert(name, value);
            any = true;
        }
    }
    let seq = data.len() as i64;
    let _ = kine_backend_nats::message::decode("kine", &subject, any.then_some(&headers), &payload, seq);
    let _ = kine_backend_nats::message::batch_position(any.then_some(&headers));
}

/// A snapshot file given to `kine-rs snapshot restore`. Odd first byte: the rest is a body whose
/// sha256 is appended here, so that the fuzzer gets past the checksum into the parser.
pub fn snapshot(data: &[u8]) {
    let Some((&mode, body)) = data.split_first() else { return };
    if mode % 2 == 0 {
        let _ = kine_core::snapshot::decode(body);
    } else {
        use sha2::Digest;
        let mut file = body.to_vec();
        file.extend_from_slice(&sha2::Sha256::digest(body));
        let _ = kine_core::snapshot::decode(&file);
    }
}

/// An etcd snapshot's bbolt file (the sha256 already stripped), through the structure check
/// that stands between `kine-rs snapshot restore` and bbolt: it must answer, never panic or loop.
pub fn bbolt(data: &[u8]) -> Result<(), String> {
    bbolt_verify::check(data, data.len() as u64)
}
