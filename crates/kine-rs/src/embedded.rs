//! The embedded NATS server (cargo feature `embedded-nats`): turning a `nats://` endpoint into
//! a running in-process nats-server and the address and credentials kine-rs connects with.
//!
//! Defaults (documented in docs/nats.md): the client port listens on 127.0.0.1 on a random
//! port and always requires credentials — the URL's, the config file's, or a random token
//! that only this process knows. JetStream is stored in `./db/nats`.

use anyhow::{Result, anyhow, bail};
use kine_backend_nats::config::{Credentials, NatsConfig};
use kine_backend_nats::{LocalHead, LocalServer};
use kine_core::shutdown::Shutdown;
use kine_nats_embed::{EmbeddedServer, Options, Readiness, StreamHead};
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::endpoint::DEFAULT_NATS_DATA_DIR as DEFAULT_DATA_DIR;

/// A running embedded server; shut it down after the backend is closed.
pub struct Embedded {
    server: Arc<EmbeddedServer>,
    /// The lock on its store, held while it runs (see [`lock_store`]).
    store_lock: Option<std::fs::File>,
}

/// The file in a store directory that a process holds locked while its embedded server uses
/// the store: nats-server itself does not stop a second server from opening the same files.
pub const STORE_LOCK: &str = "kine-rs.lock";

/// Locks the store directory `dir` (created if missing) for this process, or says which
/// lock another process holds.
fn lock_store(dir: &std::path::Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow!("--endpoint: cannot create the NATS store {}: {e}", dir.display()))?;
    let path = dir.join(STORE_LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow!("--endpoint: cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "--endpoint: the NATS store {} is in use by another process (it holds {}): is a kine-rs still running on \
             it? (dataDir names another store)",
            dir.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => bail!("--endpoint: cannot lock {}: {e}", path.display()),
    }
}

impl Embedded {
    /// The server as the NATS backend sees it: it answers read barriers in-process.
    pub fn local(&self) -> Arc<dyn LocalServer> {
        Arc::new(Local(self.server.clone()))
    }

    pub async fn shutdown(self) {
        let server = self.server.clone();
        let _ = tokio::task::spawn_blocking(move || server.shutdown()).await;
        tracing::info!("embedded NATS server stopped");
    }
}

struct Local(Arc<EmbeddedServer>);

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the embedded NATS server")
    }
}

impl LocalServer for Local {
    fn account_of(&self, server_id: &str, client_id: u64) -> Option<String> {
        self.0.account_of(server_id, client_id)
    }

    fn stream_head(&self, account: &CStr, stream: &CStr, commit: &mut u64) -> LocalHead {
        match self.0.stream_last_seq(account, stream, commit) {
            StreamHead::Elsewhere => LocalHead::Elsewhere,
            StreamHead::Applying => LocalHead::Applying,
            StreamHead::Leader { last, contact } => LocalHead::Leader { last, contact },
        }
    }
}

/// `host[:port]`, `[v6]:port` or `:port` → (host, port).
fn split_host_port(hostport: &str) -> Result<(Option<String>, Option<u16>)> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| anyhow!("--endpoint: bad IPv6 address {hostport:?}"))?;
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().map_err(|_| anyhow!("--endpoint: invalid port in {hostport:?}"))?),
        None => None,
    };
    Ok(((!host.is_empty()).then(|| host.to_string()), port))
}

/// A random token for the embedded server's client port (128 bits from the OS).
fn random_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| anyhow!("cannot read /dev/urandom for the embedded server's token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn absolute(path: PathBuf) -> PathBuf {
    if path.is_absolute() { path } else { std::env::current_dir().map(|d| d.join(&path)).unwrap_or(path) }
}

/// The embedded server's largest message: an etcd request of `--max-request-bytes` plus room
/// for the subject and headers (nats-server's own default is 1 MiB).
fn max_payload(max_request_bytes: usize) -> u32 {
    (max_request_bytes + 64 * 1024).clamp(1 << 20, 64 << 20) as u32
}

/// Starts the server the endpoint asks for and waits until it is ready (a clustered JetStream
/// waits for its quorum; `stop` ends the wait). Returns the config kine-rs connects with.
pub async fn start(cfg: NatsConfig, max_request_bytes: usize, stop: &Shutdown) -> Result<(Embedded, NatsConfig)> {
    let (host, port) = match cfg.servers.first() {
        Some(hp) => split_host_port(hp)?,
        None => (None, None),
    };
    let credentials = match &cfg.credentials {
        Credentials::UserPassword(u, p) => kine_nats_embed::Credentials::UserPassword(u.clone(), p.clone()),
        Credentials::Token(t) => kine_nats_embed::Credentials::Token(t.clone()),
        Credentials::None => kine_nats_embed::Credentials::Token(random_token()?),
    };
    if let Some(file) = &cfg.server_config
        && !file.is_file()
    {
        bail!("--endpoint: serverConfig {}: no such file", file.display());
    }
    let options = Options {
        host,
        port,
        loopback_only: cfg.dont_listen,
        config_file: cfg.server_config.clone().map(absolute),
        store_dir: cfg.data_dir.clone().map(absolute),
        default_store_dir: absolute(PathBuf::from(DEFAULT_DATA_DIR)),
        credentials: credentials.clone(),
        stdout_logging: cfg.stdout_logging,
        sync_always: cfg.sync_always,
        sync_interval: cfg.sync_interval,
        max_payload: Some(max_payload(max_request_bytes)),
    };
    // The store a config file names is known once the server runs (and is locked then).
    let early_lock = match &options.config_file {
        None => Some(lock_store(options.store_dir.as_ref().unwrap_or(&options.default_store_dir))?),
        Some(_) => None,
    };
    let started = Instant::now();
    let server = tokio::task::spawn_blocking(move || kine_nats_embed::start(&options))
        .await?
        .map_err(|e| anyhow!("--endpoint: cannot start the embedded NATS server: {e}"))?;
    let server = Arc::new(server);
    let mut embedded = Embedded { server: server.clone(), store_lock: early_lock };
    let mut last_report = Instant::now();
    loop {
        let s = server.clone();
        let wait = tokio::task::spawn_blocking(move || s.wait_ready(Duration::from_millis(500)));
        let mut stop = stop.clone();
        let readiness = tokio::select! {
            r = wait => r?,
            _ = stop.wait() => {
                embedded.shutdown().await;
                bail!("stopped while waiting for the embedded NATS server");
            }
        };
        match readiness {
            Readiness::Ready => break,
            Readiness::Failed(reason) => {
                embedded.shutdown().await;
                bail!("--endpoint: the embedded NATS server failed to start: {reason}");
            }
            Readiness::Waiting(reason) => {
                if last_report.elapsed() >= Duration::from_secs(10) {
                    tracing::warn!(
                        waited_s = started.elapsed().as_secs(),
                        "embedded NATS server not ready yet (a clustered JetStream waits for a quorum of its peers): {reason}"
                    );
                    last_report = Instant::now();
                }
            }
        }
    }
    let info = server.info().map_err(|e| anyhow!(e))?;
    if embedded.store_lock.is_none() && !info.store_dir.is_empty() {
        // nats-server keeps JetStream in `<store_dir>/jetstream`.
        let dir = PathBuf::from(&info.store_dir);
        let dir = if dir.ends_with("jetstream") { dir.parent().map(PathBuf::from).unwrap_or(dir) } else { dir };
        match lock_store(&dir) {
            Ok(lock) => embedded.store_lock = Some(lock),
            Err(e) => {
                embedded.shutdown().await;
                return Err(e);
            }
        }
    }
    let auth = if !info.uses_given_credentials() {
        "from serverConfig"
    } else if matches!(cfg.credentials, Credentials::None) {
        "per-process token"
    } else {
        "from the URL"
    };
    tracing::info!(
        version = kine_nats_embed::NATS_SERVER_VERSION,
        name = %info.server_name,
        clients = %format!("{}:{}", info.listen_host, info.listen_port),
        auth,
        cluster = %info.cluster_addr,
        leafnode_listen = %info.leafnode_addr,
        leafnode_remotes = info.leafnode_remotes,
        store = %info.store_dir,
        fsync = %if info.sync_always {
            "always".to_string()
        } else {
            format!("{:?}", Duration::from_millis(info.sync_interval_ms.max(0) as u64))
        },
        max_payload = info.max_payload,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "embedded NATS server ready"
    );
    let mut client = cfg;
    client.servers = vec![info.client_url.trim_start_matches("nats://").to_string()];
    if info.max_control_line > 0 {
        client.max_control_line = info.max_control_line as usize;
    }
    if info.uses_given_credentials() {
        client.credentials = match credentials {
            kine_nats_embed::Credentials::UserPassword(u, p) => Credentials::UserPassword(u, p),
            kine_nats_embed::Credentials::Token(t) => Credentials::Token(t),
        };
    }
    Ok((embedded, client))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port() {
        let hp = |s: &str| split_host_port(s).unwrap();
        assert_eq!(hp("0.0.0.0:4222"), (Some("0.0.0.0".into()), Some(4222)));
        assert_eq!(hp("127.0.0.1"), (Some("127.0.0.1".into()), None));
        assert_eq!(hp(":4333"), (None, Some(4333)));
        assert_eq!(hp("[::1]:4222"), (Some("::1".into()), Some(4222)));
        assert_eq!(hp("[::]"), (Some("::".into()), None));
        assert!(split_host_port("h:x").is_err());
    }

    #[test]
    fn tokens_are_random_and_long() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
