//! Starts the real `kine-rs` binary for end-to-end tests and connects etcd clients to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use kine_testkit::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_kine-rs");

/// The binary `Server` starts: this build's, or `KINE_RS_TEST_BIN` (e.g. a release build, to
/// run the end-to-end tests against it).
pub fn server_bin() -> String {
    std::env::var("KINE_RS_TEST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// Starts kine-rs on `endpoint` (a free port, no metrics listener, stderr piped) without
/// waiting for it to serve: for start-up that waits on something.
pub fn spawn_starting(endpoint: &str) -> Child {
    Command::new(BIN)
        .args(["--listen-address", "127.0.0.1:0", "--endpoint", endpoint])
        .env("KINE_METRICS_BIND_ADDRESS", "0")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kine-rs")
}

/// Sends SIGTERM and waits up to `limit` for the exit status; `None` if it was still running
/// then (it is killed).
pub async fn terminate_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let sent = Instant::now();
    Command::new("kill").args(["-s", "TERM", &child.id().to_string()]).status().expect("kill");
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if sent.elapsed() > limit {
            let _ = child.kill();
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running kine-rs process; killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// Everything the process wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts kine-rs with `args` (a listen address on a free port is added unless given).
    pub fn start(args: &[&str]) -> Server {
        Self::start_in(None, args)
    }

    pub fn start_in(dir: Option<&Path>, args: &[&str]) -> Server {
        let mut cmd = Command::new(server_bin());
        if let Some(dir) = dir {
            cmd.current_dir(dir);
        }
        Self::start_command(cmd, args)
    }

    /// Starts kine-rs through `cmd` (the binary itself, or a wrapper such as `ip netns exec`
    /// whose last argument is the binary) with `args`.
    pub fn start_command(mut cmd: Command, args: &[&str]) -> Server {
        if !args.iter().any(|a| a.starts_with("--listen-address")) {
            cmd.args(["--listen-address", "127.0.0.1:0"]);
        }
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).env_remove("RUST_LOG");
        // KINE_TEST_RUST_LOG: the servers' log filter when investigating a test (default: info).
        if let Some(filter) = std::env::var_os("KINE_TEST_RUST_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        // Many servers run at once: no metrics listener unless a test asks for one.
        cmd.env("KINE_METRICS_BIND_ADDRESS", "0");
        let mut child = cmd.spawn().expect("spawn kine-rs");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                {
                    let mut l = sink.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
                if let Some(i) = line.find("clients connect to ") {
                    let url =
                        line[i + "clients connect to ".len()..].split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(url);
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("kine-rs did not become ready; log:\n{}", log.lock().unwrap());
            }
        };
        Server { child, url, log }
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.url.as_str()], None).await.expect("connect etcd client")
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-s", signal, &pid]).status().expect("kill");
    }

    /// Sends a signal and waits for the exit status, without blocking the async runtime (the
    /// test's clients must keep answering the server's HTTP/2 shutdown handshake).
    pub async fn stop(&mut self, signal: &str) -> std::process::ExitStatus {
        self.signal(signal);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                panic!("kine-rs did not exit after {signal}; log:\n{}", self.log.lock().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits up to `limit` for the process to exit on its own; its status.
    pub async fn stop_by_itself(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                panic!("kine-rs still runs after {limit:?}; log:\n{}", self.log.lock().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kine-rs on a fresh SQLite database in its own temp dir.
pub fn sqlite_server(extra: &[&str]) -> (Server, TempDir) {
    let dir = TempDir::new("e2e");
    let endpoint = format!("sqlite://{}", dir.path().join("state.db").display());
    let mut args = vec!["--endpoint", endpoint.as_str()];
    args.extend_from_slice(extra);
    (Server::start(&args), dir)
}

pub fn db_endpoint(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("state.db").display())
}

/// Runs a command, returning (status ok, stdout, stderr).
pub fn run(cmd: &mut Command) -> (bool, String, String) {
    // kine-rs started this way must not take the default metrics port (tests run in parallel).
    let out = cmd.env("KINE_METRICS_BIND_ADDRESS", "0").output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn path_buf(p: &Path) -> PathBuf {
    p.to_path_buf()
}

/// For differential tests: the transcripts etcd (`expected`) and kine-rs (`got`) produced for one
/// script are equal line by line, and the script ran to its end (more than `min_lines` lines).
pub fn assert_same_transcript(expected: &[String], got: &[String], min_lines: usize) {
    for (i, (want, have)) in expected.iter().zip(got).enumerate() {
        assert_eq!(
            want,
            have,
            "line {i} differs (etcd first)\netcd:\n{}\nkine-rs:\n{}",
            expected.join("\n"),
            got.join("\n")
        );
    }
    assert_eq!(expected.len(), got.len());
    assert!(expected.len() > min_lines, "the script ran to its end");
}

/// Runs `op` until it succeeds; only Unavailable (the NATS cluster is still electing a leader)
/// is retried, for up to `limit`. Returns the result and how long that took.
pub async fn until_served<T, F, Fut>(what: &str, limit: Duration, mut op: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let start = Instant::now();
    loop {
        match op().await {
            Ok(v) => return (v, start.elapsed()),
            Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::Unavailable => {
                assert!(start.elapsed() < limit, "{what}: still unavailable after {limit:?}: {}", s.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}
pub mod answers;
pub mod copies;
pub mod history;
pub mod http;
pub mod leader;
#[allow(unused_imports)]
pub use http::http_get;
pub mod s3;
pub mod shared_db;

/// A key as a comparable tuple: key, value, create and mod revision, version, lease.
pub type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// Every key with all its fields, and the revision of the read.
pub async fn everything(c: &mut etcd_client::Client) -> (i64, Vec<Kv>) {
    let r = c.get(vec![0], Some(etcd_client::GetOptions::new().with_from_key())).await.unwrap();
    let kvs = r
        .kvs()
        .iter()
        .map(|k| (k.key().to_vec(), k.value().to_vec(), k.create_revision(), k.mod_revision(), k.version(), k.lease()))
        .collect();
    (r.header().unwrap().revision(), kvs)
}

/// Every key at `revision` with its fields as they were then.
pub async fn keys_at(c: &mut etcd_client::Client, revision: i64) -> Vec<Kv> {
    let options = etcd_client::GetOptions::new().with_from_key().with_revision(revision);
    let r = c.get(vec![0], Some(options)).await.unwrap();
    r.kvs()
        .iter()
        .map(|k| (k.key().to_vec(), k.value().to_vec(), k.create_revision(), k.mod_revision(), k.version(), k.lease()))
        .collect()
}

/// `"key":N` from a JSON text (the last occurrence).
pub fn json_number(json: &str, key: &str) -> Option<i64> {
    let at = json.rfind(&format!("\"{key}\":"))? + key.len() + 3;
    json[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The flags of TLS with client certificates from `kine_testkit::certs::make_certs`'s files in
/// `dir`: the server certificate and key, and `ca.crt` as `--trusted-ca-file`.
pub fn client_cert_tls_flags(dir: &Path) -> Vec<String> {
    let p = |n: &str| dir.join(n).display().to_string();
    ["--server-cert-file", &p("server.crt"), "--server-key-file", &p("server.key"), "--trusted-ca-file", &p("ca.crt")]
        .map(String::from)
        .to_vec()
}
