//! A real nats-server with JetStream for tests, on a free loopback port. The binary comes from
//! `NATS_SERVER_BIN`, `PATH`, or `~/go/bin` (where `go install` puts it); a missing binary is
//! a test failure, never a skip.

use crate::TempDir;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let candidate = PathBuf::from(home).join("go/bin/nats-server");
    assert!(
        candidate.is_file(),
        "nats-server not found: set NATS_SERVER_BIN or run `go install github.com/nats-io/nats-server/v2@v2.15.2`"
    );
    candidate
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local addr").port()
}

/// A nats-server process; killed on drop.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    pub dir: TempDir,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let dir = TempDir::new("nats");
        let port = free_port();
        let child = Self::spawn(port, &dir);
        NatsServer { child, port, dir }
    }

    fn spawn(port: u16, dir: &TempDir) -> Child {
        let child = Command::new(nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// Kills the server (SIGKILL); its data stays for [`NatsServer::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and store directory.
    pub fn restart(&mut self) {
        self.child = Self::spawn(self.port, &self.dir);
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
