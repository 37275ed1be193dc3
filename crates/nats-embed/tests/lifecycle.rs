//! The safe API around the linked-in nats-server: start, ready, info, idempotent shutdown,
//! and one server per process. (One test: a process holds one server for its lifetime.)

use kine_nats_embed::{Credentials, Options, Readiness};
use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

#[test]
fn start_ready_shutdown_once() {
    let dir = std::env::temp_dir().join(format!("kine-nats-embed-{}", std::process::id()));
    let options = Options {
        host: None,
        port: None,
        loopback_only: false,
        config_file: None,
        store_dir: None,
        default_store_dir: dir.clone(),
        credentials: Credentials::UserPassword("u".into(), "p".into()),
        stdout_logging: false,
        sync_always: true,
        sync_interval: None,
        max_payload: Some(3 << 20),
    };
    let server = kine_nats_embed::start(&options).expect("start");
    assert_eq!(server.wait_ready(Duration::from_secs(20)), Readiness::Ready);
    let info = server.info().expect("info");
    assert_eq!(info.listen_host, "127.0.0.1");
    assert!(info.listen_port > 0);
    assert_eq!(info.client_url, format!("nats://127.0.0.1:{}", info.listen_port));
    assert!(info.uses_given_credentials());
    assert!(info.store_dir.starts_with(dir.to_str().unwrap()), "{}", info.store_dir);
    assert!(info.sync_always);
    assert_eq!(info.max_payload, 3 << 20);

    // The given user and password are required.
    let connect = |creds: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", info.listen_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        s.write_all(format!("CONNECT {{\"verbose\":false{creds}}}\r\nPING\r\n").as_bytes()).unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        line
    };
    assert!(connect("").contains("Authorization Violation"));
    assert!(connect(",\"user\":\"u\",\"pass\":\"p\"").starts_with("PONG"));

    // A second server in the same process is refused.
    let err = kine_nats_embed::start(&options).err().expect("second start must fail");
    assert!(err.contains("already started"), "{err}");

    server.shutdown();
    server.shutdown();
    assert!(std::net::TcpStream::connect(("127.0.0.1", info.listen_port)).is_err());
    assert!(server.info().is_err());
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
