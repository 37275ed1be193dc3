//! The throwaway MariaDB server of `kine_testkit::mysql`: the `kine` user connects over TCP with
//! its password, before and after restarts. Fails (never skips) when MariaDB is not installed.
use kine_testkit::mysql::{MariaDbServer, PASSWORD, USER, binary};
use std::process::Command;

/// `SELECT 1` through the mariadb client over TCP as the kine user.
fn select_one(server: &MariaDbServer) {
    let out = Command::new(binary("mariadb"))
        .args(["--no-defaults", "--protocol=TCP", "-h127.0.0.1", &format!("-P{}", server.port())])
        .args([&format!("-u{USER}"), &format!("-p{PASSWORD}"), "--batch", "--skip-column-names", "-e", "SELECT 1"])
        .output()
        .expect("run the mariadb client");
    assert!(
        out.status.success(),
        "SELECT 1 failed: {}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
}

#[test]
fn start_restart_stop() {
    let mut server = MariaDbServer::start();
    assert!(server.url("kine").ends_with(&format!("@tcp(127.0.0.1:{})/kine", server.port())));
    select_one(&server);
    // Restart while running: a clean stop, then the same port and data (the user survives).
    server.restart();
    select_one(&server);
    // Restart after a crash: InnoDB recovers.
    server.kill();
    server.restart();
    select_one(&server);
    server.stop();
    assert!(server.log().contains("Shutdown complete"), "no clean shutdown in the log:\n{}", server.log());
}
