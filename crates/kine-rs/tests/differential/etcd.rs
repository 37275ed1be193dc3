//! A real etcd (3.6 or 3.7) on loopback, for differential tests. The binary comes from
//! `ETCD_BIN` (3.6) or `ETCD37_BIN` (3.7), or `~/go/bin/etcd-3.6` / `~/go/bin/etcd-3.7`
//! (`scripts/install-test-deps` builds them from the Go module proxy); a missing binary is a
//! test failure, never a skip.

use kine_testkit::TempDir;
use kine_testkit::nats::free_port;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd versions compared against, and the `--emulated-etcd-version` kine-rs runs with for
/// each (the releases the binaries are built at).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V3_6,
    V3_7,
}

impl Version {
    #[allow(dead_code)]
    pub fn emulated(self) -> &'static str {
        match self {
            Version::V3_6 => "3.6.16",
            Version::V3_7 => "3.7.3",
        }
    }

    fn bin(self) -> PathBuf {
        match self {
            Version::V3_6 => tool("ETCD_BIN", "etcd-3.6"),
            Version::V3_7 => tool("ETCD37_BIN", "etcd-3.7"),
        }
    }

    /// etcd's offline tool of the same release.
    #[allow(dead_code)]
    pub fn etcdutl(self) -> PathBuf {
        match self {
            Version::V3_6 => tool("ETCDUTL_BIN", "etcdutl-3.6"),
            Version::V3_7 => tool("ETCDUTL37_BIN", "etcdutl-3.7"),
        }
    }
}

fn tool(var: &str, name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(var) {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let candidate = PathBuf::from(home).join("go/bin").join(name);
    assert!(
        candidate.is_file(),
        "{name} not found: set {var} or run scripts/install-test-deps (it builds ~/go/bin/{name})"
    );
    candidate
}

/// An etcd process with a fresh data directory; killed on drop.
pub struct Etcd {
    child: Child,
    pub url: String,
    dir: Option<TempDir>,
}

impl Etcd {
    pub fn start(version: Version) -> Etcd {
        Self::start_with(version, &[])
    }

    /// An etcd on an existing data directory (one `etcdutl snapshot restore` wrote for the member
    /// `name` with the peer URL `http://127.0.0.1:{peer}`).
    #[allow(dead_code)]
    pub fn start_on(version: Version, dir: TempDir, data: &std::path::Path, name: &str, peer: u16) -> Etcd {
        let port = free_port();
        let client = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(version.bin());
        cmd.args(["--name", name, "--data-dir"])
            .arg(data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}"), "--log-level", "warn"]);
        Self::spawn(cmd, dir, port, client)
    }

    /// With more flags (`--auth-token …`).
    pub fn start_with(version: Version, extra: &[&str]) -> Etcd {
        let dir = TempDir::new("etcd");
        let (port, peer) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(version.bin());
        cmd.args(["--name", "default", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}"), "--log-level", "warn"])
            .args(extra);
        Self::spawn(cmd, dir, port, client)
    }

    fn spawn(mut cmd: Command, dir: TempDir, port: u16, client: String) -> Etcd {
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
        let mut child = cmd.stdout(Stdio::null()).stderr(log).spawn().expect("spawn etcd");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default();
                panic!("etcd did not start on port {port}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Listening is not ready: until its cluster version is decided, etcd answers /version
        // with "not_decided" (seen in CI on a loaded machine), and some requests differ.
        while !cluster_version_decided(port) {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default();
                panic!("etcd on port {port} never decided its cluster version:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Etcd { child, url: client, dir: Some(dir) }
    }
}

/// Whether etcd's `/version` names a cluster version.
fn cluster_version_decided(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    if conn.write_all(b"GET /version HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.contains("\"etcdcluster\":\"3.")
}

impl Etcd {
    /// Stops etcd with SIGTERM (it commits its backend and exits) and hands over its directory
    /// (the data directory is `data` in it).
    #[allow(dead_code)]
    pub fn stop(mut self) -> TempDir {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
        self.dir.take().expect("the directory is handed over once")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
