//! A real etcd (3.6) on loopback, for differential tests. The binary comes from `ETCD_BIN`, or
//! `~/go/bin/etcd-3.6` (`scripts/install-test-deps` builds it from the Go module proxy); a
//! missing binary is a test failure, never a skip.

use kine_testkit::TempDir;
use kine_testkit::nats::free_port;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn etcd_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ETCD_BIN") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let candidate = PathBuf::from(home).join("go/bin/etcd-3.6");
    assert!(
        candidate.is_file(),
        "etcd 3.6 not found: set ETCD_BIN or run scripts/install-test-deps (it builds ~/go/bin/etcd-3.6)"
    );
    candidate
}

/// An etcd process with a fresh data directory; killed on drop.
pub struct Etcd {
    child: Child,
    pub url: String,
    _dir: TempDir,
}

impl Etcd {
    pub fn start() -> Etcd {
        let dir = TempDir::new("etcd");
        let (port, peer) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
        let mut child = Command::new(etcd_bin())
            .args(["--name", "default", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}"), "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default();
                panic!("etcd did not start on port {port}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Etcd { child, url: client, _dir: dir }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
