//! A real nats-server with JetStream for tests, on a free loopback port. The binary comes from
//! `NATS_SERVER_BIN`, `PATH`, or `~/go/bin` (where `go install` puts it); a missing binary is
//! a test failure, never a skip.

use crate::TempDir;
use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
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

/// A port nothing listens on, below the kernel's ephemeral range: a server killed and started
/// again on it must find it free, and a port from the ephemeral range can meanwhile become the
/// local end of some outgoing connection (seen in CI: a restarted nats-server could not bind).
/// A port is handed out once per process: two tests running at once never get the same one
/// before either has bound it (seen in CI: etcd found its port taken).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.max(10_001));
    for _ in 0..1000 {
        let port = from + (kine_core::id::random_u64() % u64::from(to - from)) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    let port = TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local addr").port();
    given.insert(port);
    port
}

/// A nats-server process; killed on drop.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    pub dir: TempDir,
    config: Option<PathBuf>,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let dir = TempDir::new("nats");
        let port = free_port();
        let child = Self::spawn(port, &dir, None);
        NatsServer { child, port, dir, config: None }
    }

    /// A server that also reads `config` (nats-server config syntax, e.g. a `leafnodes` block).
    pub fn start_with_config(config: &str) -> NatsServer {
        let dir = TempDir::new("nats");
        let port = free_port();
        let path = dir.path().join("server.conf");
        std::fs::write(&path, config).expect("write nats-server config");
        let child = Self::spawn(port, &dir, Some(&path));
        NatsServer { child, port, dir, config: Some(path) }
    }

    fn spawn(port: u16, dir: &TempDir, config: Option<&PathBuf>) -> Child {
        let mut cmd = Command::new(nats_server_bin());
        if let Some(config) = config {
            cmd.arg("-c").arg(config);
        }
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).expect("create the nats-server log");
        let mut child = cmd
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("nats-server did not start on port {port}:\n{log}");
            }
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
        self.child = Self::spawn(self.port, &self.dir, self.config.as_ref());
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 3-node nats-server cluster with JetStream, routes on loopback.
pub struct NatsCluster {
    pub nodes: Vec<ClusterNode>,
}

pub struct ClusterNode {
    child: Option<Child>,
    pub port: u16,
    pub cluster_port: u16,
    pub name: String,
    pub dir: TempDir,
    routes: String,
}

impl ClusterNode {
    fn spawn(&mut self) {
        let child = Command::new(nats_server_bin())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-n",
                &self.name,
                "--cluster_name",
                "kine-test",
            ])
            .args(["--cluster", &format!("nats://127.0.0.1:{}", self.cluster_port), "--routes", &self.routes, "-sd"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.path().join("server.log"))
                    .expect("open the nats-server log"),
            )
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
    }

    /// The running server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts a node that is not running, and waits until it accepts connections.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "nats-server {} is already running", self.name);
        self.spawn();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                panic!(
                    "nats-server {} did not start:\n{}",
                    self.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl NatsCluster {
    pub fn start() -> NatsCluster {
        NatsCluster::start_partly(3)
    }

    /// A 3-node cluster of which only the first `running` nodes are started (the others with
    /// [`ClusterNode::start`]).
    pub fn start_partly(running: usize) -> NatsCluster {
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let routes = ports.iter().map(|(_, c)| format!("nats://127.0.0.1:{c}")).collect::<Vec<_>>().join(",");
        let mut nodes: Vec<ClusterNode> = ports
            .iter()
            .enumerate()
            .map(|(i, (port, cluster_port))| ClusterNode {
                child: None,
                port: *port,
                cluster_port: *cluster_port,
                name: format!("n{}", i + 1),
                dir: TempDir::new("nats-cluster"),
                routes: routes.clone(),
            })
            .collect();
        for n in nodes.iter_mut().take(running) {
            n.start();
        }
        NatsCluster { nodes }
    }

    /// `nats://` URL list naming every node, starting with node `first`.
    pub fn urls(&self, first: usize) -> String {
        (0..self.nodes.len())
            .map(|i| format!("nats://127.0.0.1:{}", self.nodes[(first + i) % self.nodes.len()].port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }
}
