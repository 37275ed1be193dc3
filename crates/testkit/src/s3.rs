//! A real S3-compatible server for tests: versitygw (Apache-2.0) serving a temporary
//! directory, on a free loopback port, with static root credentials. It verifies SigV4 and
//! implements S3's conditional writes (`If-None-Match`, `If-Match`). The binary comes from
//! `VERSITYGW_BIN`, `PATH`, or `~/go/bin` (`scripts/install-test-deps` installs it); a missing
//! binary is a test failure, never a skip.

use crate::TempDir;
use crate::nats::free_port;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "kine-test-access";
pub const SECRET_KEY: &str = "kine-test-secret-key";
pub const REGION: &str = "us-east-1";

pub fn versitygw_bin() -> PathBuf {
    if let Ok(p) = std::env::var("VERSITYGW_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("versitygw");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let candidate = PathBuf::from(home).join("go/bin/versitygw");
    assert!(
        candidate.is_file(),
        "versitygw not found: set VERSITYGW_BIN or run `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0`"
    );
    candidate
}

pub struct S3Server {
    child: Child,
    /// The address it listens on (127.0.0.1 unless started with `start_on`).
    pub host: String,
    pub port: u16,
    dir: TempDir,
    tls: bool,
}

impl S3Server {
    /// Starts the server with `buckets` created (each a directory of the posix backend).
    pub fn start(buckets: &[&str]) -> S3Server {
        S3Server::start_with("127.0.0.1", buckets, None)
    }

    /// Like [`S3Server::start`], listening on `host` (an address of the host's that clients in
    /// other network namespaces reach).
    pub fn start_on(host: &str, buckets: &[&str]) -> S3Server {
        S3Server::start_with(host, buckets, None)
    }

    /// Like [`S3Server::start`], serving HTTPS with `cert` and `key` (PEM files).
    pub fn start_tls(buckets: &[&str], cert: &std::path::Path, key: &std::path::Path) -> S3Server {
        S3Server::start_with("127.0.0.1", buckets, Some((cert, key)))
    }

    fn start_with(host: &str, buckets: &[&str], tls: Option<(&std::path::Path, &std::path::Path)>) -> S3Server {
        let dir = TempDir::new("s3");
        for b in buckets {
            std::fs::create_dir_all(dir.path().join(b)).expect("create bucket directory");
        }
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).expect("create log");
        let mut command = Command::new(versitygw_bin());
        command.args(["--port", &format!("{host}:{port}")]);
        if let Some((cert, key)) = tls {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        let child = command
            .arg("posix")
            .arg(dir.path())
            .env("ROOT_ACCESS_KEY", ACCESS_KEY)
            .env("ROOT_SECRET_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start versitygw");
        let server = S3Server { child, host: host.to_string(), port, dir, tls: tls.is_some() };
        let started = Instant::now();
        while std::net::TcpStream::connect((host, port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "versitygw did not listen: {}", server.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn endpoint(&self) -> String {
        format!("{}://{}:{}", if self.tls { "https" } else { "http" }, self.host, self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The server process (to stall it with SIGSTOP in fault tests).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
