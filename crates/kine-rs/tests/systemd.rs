//! kine-rs under systemd: the readiness protocol a `Type=notify` unit relies on (`READY=1` once
//! clients can connect, `STOPPING=1` when shutdown begins; on a socket path and in the abstract
//! namespace), and the unit shipped in `packaging/systemd/kine-rs.service`, which
//! `systemd-analyze verify` must pass without a warning.

mod common;
use common::*;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

/// The next message on `socket`, within 30 s (`what` and kine-rs's log name a failure).
fn next(socket: &UnixDatagram, what: &str, log: &str) -> String {
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 512];
    match socket.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(e) => panic!("no {what} from kine-rs within 30 s ({e}); its log:\n{log}"),
    }
}

async fn ready_then_stopping(socket: &UnixDatagram, notify_socket: &str) {
    let dir = TempDir::new("notify");
    let mut cmd = Command::new(server_bin());
    cmd.env("NOTIFY_SOCKET", notify_socket);
    let mut server = Server::start_command(cmd, &["--endpoint", &db_endpoint(dir.path())]);
    assert_eq!(next(socket, "READY=1", &server.log()), "READY=1");
    // Ready means serving: a client's first request is answered.
    server.client().await.put("k", "v", None).await.unwrap();
    let status = server.stop("TERM").await;
    assert_eq!(next(socket, "STOPPING=1", &server.log()), "STOPPING=1");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_and_stopping_are_told_to_systemd() {
    let dir = TempDir::new("notify-socket");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    ready_then_stopping(&socket, path.to_str().unwrap()).await;

    use std::os::linux::net::SocketAddrExt;
    let name = format!("kine-rs-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    ready_then_stopping(&socket, &format!("@{name}")).await;
}

#[test]
fn the_shipped_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/systemd/kine-rs.service"))
        .expect("packaging/systemd/kine-rs.service");
    assert!(unit.contains("ExecStart=/usr/local/bin/kine-rs\n") && unit.contains("Type=notify\n"));
    // The binary under test in place of the installed one (verify checks that it exists).
    let dir = TempDir::new("unit");
    let path = dir.path().join("kine-rs.service");
    std::fs::write(&path, unit.replace("ExecStart=/usr/local/bin/kine-rs", &format!("ExecStart={}", server_bin())))
        .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (apt-get install systemd; run by scripts/install-test-deps)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {:?}\n{said}", out.status);
}
