//! The real nats-server, built into the binary as a Go shared library and loaded when the
//! server is first started (see `build.rs`, `src/ffi.rs` and `go/shim.go`). One server per
//! process, for the life of the process.
//!
//! Everything here blocks (it waits on Go); call it from a blocking context.

pub mod bolt;
mod bolt_fns;
mod ffi;
pub use ffi::StreamHead;

use serde::{Deserialize, Serialize};
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The nats-server version linked in (pinned in `go/go.mod`).
pub const NATS_SERVER_VERSION: &str = "2.15.2";

/// Client credentials that the server requires when its config file defines none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// How to run the server. Precedence for each setting: these options, then the config file,
/// then the defaults (127.0.0.1, a random port, `default_store_dir`).
#[derive(Clone, Debug)]
pub struct Options {
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Listen on 127.0.0.1 on a random port whatever the URL or config file say.
    pub loopback_only: bool,
    pub config_file: Option<PathBuf>,
    pub store_dir: Option<PathBuf>,
    pub default_store_dir: PathBuf,
    /// Applied only when the config file defines no client authentication.
    pub credentials: Credentials,
    pub stdout_logging: bool,
    /// JetStream fsyncs every message before acknowledging it.
    pub sync_always: bool,
    /// JetStream's fsync period (nats-server's default: 2 minutes).
    pub sync_interval: Option<Duration>,
    /// The largest message the server accepts, unless the config file sets `max_payload`.
    pub max_payload: Option<u32>,
}

#[derive(Serialize)]
struct StartRequest<'a> {
    host: &'a str,
    port: i32,
    port_given: bool,
    force_loopback: bool,
    config_file: String,
    store_dir: String,
    default_store_dir: String,
    user: &'a str,
    password: &'a str,
    token: &'a str,
    stdout_logging: bool,
    sync_always: bool,
    sync_interval_ms: u64,
    max_payload: u32,
}

/// What the running server reports about itself.
#[derive(Clone, Debug, Deserialize)]
pub struct ServerInfo {
    /// Where a client in this process connects (`nats://127.0.0.1:PORT` for a wildcard bind).
    pub client_url: String,
    /// The address the client listener is bound to.
    pub listen_host: String,
    pub listen_port: u16,
    pub server_name: String,
    pub store_dir: String,
    pub cluster: String,
    pub cluster_addr: String,
    pub leafnode_addr: String,
    pub leafnode_remotes: usize,
    /// `config` when the config file's authorization is in force, `url` when `credentials` are.
    pub auth_source: String,
    /// JetStream fsyncs every message before acknowledging it.
    pub sync_always: bool,
    /// Otherwise, its fsync period.
    pub sync_interval_ms: i64,
    /// The largest message the server accepts (0: nats-server's default, 1 MiB).
    pub max_payload: i32,
    /// The longest protocol line it takes (0: unknown).
    #[serde(default)]
    pub max_control_line: i32,
}

impl ServerInfo {
    /// Whether clients must use the credentials given in [`Options`] (else the config file's).
    pub fn uses_given_credentials(&self) -> bool {
        self.auth_source == "url"
    }
}

/// The result of waiting for readiness.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Not yet (e.g. a JetStream cluster without a quorum); the reason from the server.
    Waiting(String),
    /// It cannot become ready (e.g. the port is in use).
    Failed(String),
}

/// The running server. Dropping it shuts the server down.
pub struct EmbeddedServer {
    stopped: AtomicBool,
    log_thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Starts the server; the client listener is up once [`EmbeddedServer::wait_ready`] says so.
/// Fails if the config file is invalid or a server was already started in this process.
pub fn start(options: &Options) -> Result<EmbeddedServer, String> {
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let (user, password, token) = match &options.credentials {
        Credentials::UserPassword(u, p) => (u.as_str(), p.as_str(), ""),
        Credentials::Token(t) => ("", "", t.as_str()),
    };
    let request = StartRequest {
        host: options.host.as_deref().unwrap_or(""),
        port: options.port.map(i32::from).unwrap_or(0),
        port_given: options.port.is_some(),
        force_loopback: options.loopback_only,
        config_file: path(&options.config_file),
        store_dir: path(&options.store_dir),
        default_store_dir: options.default_store_dir.display().to_string(),
        user,
        password,
        token,
        stdout_logging: options.stdout_logging,
        sync_always: options.sync_always,
        sync_interval_ms: options.sync_interval.map_or(0, |d| d.as_millis().max(1) as u64),
        max_payload: options.max_payload.unwrap_or(0),
    };
    let json = serde_json::to_string(&request).map_err(|e| e.to_string())?;
    if let Some(err) = ffi::start(&json) {
        return Err(err);
    }
    let log_thread = std::thread::Builder::new()
        .name("nats-server-log".into())
        .spawn(forward_logs)
        .map_err(|e| format!("cannot start the log thread: {e}"))?;
    Ok(EmbeddedServer { stopped: AtomicBool::new(false), log_thread: std::sync::Mutex::new(Some(log_thread)) })
}

/// Sends the server's warnings and errors to `tracing` (target `nats_server`) until it stops.
fn forward_logs() {
    loop {
        match ffi::next_log(Duration::from_secs(1)) {
            None => continue,
            Some(line) if line.is_empty() => return,
            Some(line) => {
                let (level, msg) = line.split_at(1);
                match level {
                    "W" => tracing::warn!(target: "nats_server", "{msg}"),
                    _ => tracing::error!(target: "nats_server", "{msg}"),
                }
            }
        }
    }
}

impl EmbeddedServer {
    /// Waits up to `timeout` for the client listener and a healthy JetStream.
    pub fn wait_ready(&self, timeout: Duration) -> Readiness {
        match ffi::wait_ready(timeout) {
            None => Readiness::Ready,
            Some(s) => match s.split_once(':') {
                Some(("wait", reason)) => Readiness::Waiting(reason.to_string()),
                Some((_, reason)) => Readiness::Failed(reason.to_string()),
                None => Readiness::Failed(s),
            },
        }
    }

    pub fn info(&self) -> Result<ServerInfo, String> {
        let json = ffi::info().ok_or("the embedded NATS server is not running")?;
        serde_json::from_str(&json).map_err(|e| format!("bad server info {json:?}: {e}"))
    }

    /// The account of the client connection `client_id` if this server is `server_id` (both
    /// are in the INFO the server sent that connection); `None` if this server is another or
    /// knows no such connection.
    pub fn account_of(&self, server_id: &str, client_id: u64) -> Option<String> {
        ffi::account_of(server_id, client_id)
    }

    /// The last sequence of `stream` in `account`, read in-process, when this server answers
    /// for the stream's leader: a server outside a cluster always (it holds its streams
    /// alone), in a cluster only while it leads the stream and once it has applied every entry
    /// committed when the question began (`commit`: 0 on a question's first call, which notes
    /// the commit index there; [`StreamHead::Applying`] until then), since a follower may store
    /// a committed entry before the leader does. `Elsewhere`: ask the leader over NATS. For a
    /// stream with other replicas, also how long ago this leader last heard from a quorum of
    /// them: a leader cut off from them still believes it leads until its Raft term times out.
    pub fn stream_last_seq(&self, account: &CStr, stream: &CStr, commit: &mut u64) -> StreamHead {
        if self.stopped.load(Ordering::SeqCst) {
            return StreamHead::Elsewhere;
        }
        ffi::stream_last_seq(account, stream, commit)
    }

    /// Stops the server (JetStream flushes its store) and waits for it. Idempotent.
    pub fn shutdown(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        ffi::shutdown();
        if let Some(t) = self.log_thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
