//! Connecting to NATS: servers, credentials, TLS, a NATS CLI context file; reconnect forever.

use crate::config::{Credentials, NatsConfig};
use anyhow::{Context, Result, bail};
use async_nats::ConnectOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Datastore TLS files (`--ca-file`, `--cert-file`, `--key-file`).
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// The fields of a NATS CLI context file that kine-rs uses.
#[derive(Debug, Default)]
struct ContextFile {
    url: Option<String>,
    user: Option<String>,
    password: Option<String>,
    token: Option<String>,
    creds: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
}

fn read_context(path: &PathBuf) -> Result<ContextFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("contextFile {}: cannot read", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("contextFile {}: not a JSON NATS context", path.display()))?;
    let field = |name: &str| json.get(name).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(str::to_string);
    if field("nkey").is_some() {
        bail!("contextFile {}: nkey seeds in a context file are not supported; use credsFile", path.display());
    }
    Ok(ContextFile {
        url: field("url"),
        user: field("user"),
        password: field("password"),
        token: field("token"),
        creds: field("creds"),
        cert: field("cert"),
        key: field("key"),
        ca: field("ca"),
    })
}

/// The client's last connection error, cleared once connected (for start-up errors).
#[derive(Clone, Default)]
pub struct LastError(Arc<Mutex<Option<String>>>);

impl LastError {
    fn set(&self, error: Option<String>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Waits until `client` (which connects in the background) is connected and has the server's
/// INFO, for up to `limit`; the error then names the servers and the last connection error.
/// Refused credentials fail at once. (async-nats reports `Connected` a moment before it stores
/// the server's INFO: until then `server_info()` is all zeros, e.g. `max_payload` 0.)
pub async fn wait_connected(
    client: &async_nats::Client,
    servers: &[String],
    last: &LastError,
    limit: Duration,
) -> Result<()> {
    let started = std::time::Instant::now();
    while client.connection_state() != async_nats::connection::State::Connected || client.try_server_info().is_none() {
        // Wrong credentials do not fix themselves: say so at once.
        if let Some(e) = last.get().filter(|e| e.contains("authorization violation")) {
            bail!("NATS at {} refused the credentials: {e}", shown(servers));
        }
        if started.elapsed() >= limit {
            let mut why = last.get().map(|e| format!(" (last error: {e})")).unwrap_or_default();
            // async-nats reports a failed TCP connection as a bare "IO error": say which.
            if why.contains("IO error")
                && let Some(tcp) = tcp_error(servers).await
            {
                why = format!(" ({tcp})");
            }
            bail!("cannot reach NATS at {} within {limit:?}{why}", shown(servers));
        }
        // A local server (the embedded one) answers within a millisecond or two: look often
        // at first, so that start-up does not wait a whole polling period for it.
        let period = if started.elapsed() < Duration::from_millis(200) { 1 } else { 20 };
        tokio::time::sleep(Duration::from_millis(period)).await;
    }
    Ok(())
}

/// Server URLs for messages, without credentials (a context file's URL may carry them).
pub fn shown(servers: &[String]) -> String {
    let hide = |server: &String| match (server.find("://"), server.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &server[..scheme + 3], &server[at..]),
        (None, Some(at)) => format!("***{}", &server[at..]),
        _ => server.clone(),
    };
    servers.iter().map(hide).collect::<Vec<_>>().join(",")
}

/// The operating system's reason why the first unreachable server refuses a TCP connection
/// (connection refused, no route, unknown host), if one does.
async fn tcp_error(servers: &[String]) -> Option<String> {
    for server in servers {
        let address = server.rsplit("://").next().unwrap_or(server);
        let address = address.rsplit('@').next().unwrap_or(address);
        match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await {
            Ok(Err(e)) => return Some(format!("{address}: {e}")),
            Err(_) => return Some(format!("{address}: no answer to a TCP connection within 2 s")),
            Ok(Ok(_)) => {}
        }
    }
    None
}

/// Server addresses and options for `async_nats`, and the handle of the last connection
/// error. Once `closing` is set, losing the connection is expected and logged at debug only.
pub async fn options(
    cfg: &NatsConfig,
    tls: &ClientTls,
    closing: Arc<AtomicBool>,
) -> Result<(Vec<String>, ConnectOptions, LastError)> {
    let last_error = LastError::default();
    let last = last_error.clone();
    let mut servers: Vec<String> = cfg.servers.iter().map(|s| format!("nats://{s}")).collect();
    let mut opts = ConnectOptions::new()
        .name(format!("kine-rs using bucket {}", cfg.bucket))
        .max_reconnects(None)
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(5)))
        // `attempts` is 1 on the first try: connect at once, then back off in 100 ms steps.
        .reconnect_delay_callback(|attempts| Duration::from_millis((100 * attempts.saturating_sub(1) as u64).min(2000)))
        .event_callback(move |event| {
            let closing = closing.load(Ordering::SeqCst);
            let last = last.clone();
            async move {
                let connected = kine_core::metrics::metrics().backend_connected.with_label_values(&["nats", "client"]);
                match event {
                    async_nats::Event::Disconnected if closing => {
                        connected.set(0);
                        tracing::debug!("NATS connection closed")
                    }
                    async_nats::Event::Disconnected => {
                        connected.set(0);
                        tracing::warn!("NATS connection lost; reconnecting")
                    }
                    async_nats::Event::Connected => {
                        connected.set(1);
                        last.set(None);
                        tracing::info!("NATS connection (re)established")
                    }
                    async_nats::Event::ClientError(e) => {
                        last.set(Some(e.to_string()));
                        tracing::debug!(error = %e, "NATS client error")
                    }
                    other => tracing::debug!(event = %other, "NATS client event"),
                }
            }
        });
    let mut ca = tls.ca_file.clone();
    let mut cert = tls.cert_file.clone().zip(tls.key_file.clone());
    match &cfg.credentials {
        Credentials::None => {}
        Credentials::UserPassword(u, p) => opts = opts.user_and_password(u.clone(), p.clone()),
        Credentials::Token(t) => opts = opts.token(t.clone()),
    }
    if let Some(path) = &cfg.context_file {
        let ctx = read_context(path)?;
        if let Some(url) = &ctx.url {
            servers = url.split(',').map(|s| s.trim().to_string()).collect();
        }
        if let (Some(u), Some(p)) = (&ctx.user, &ctx.password) {
            opts = opts.user_and_password(u.clone(), p.clone());
        } else if let Some(t) = ctx.token.as_ref().or(ctx.user.as_ref()) {
            opts = opts.token(t.clone());
        }
        if let Some(creds) = &ctx.creds {
            opts = opts.credentials_file(creds).await.with_context(|| format!("contextFile: read creds {creds}"))?;
        }
        if ca.is_none() {
            ca = ctx.ca.map(PathBuf::from);
        }
        if cert.is_none() {
            cert = ctx.cert.map(PathBuf::from).zip(ctx.key.map(PathBuf::from));
        }
    }
    if let Some(path) = &cfg.creds_file {
        opts =
            opts.credentials_file(path).await.with_context(|| format!("credsFile {}: cannot read", path.display()))?;
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        bail!("--cert-file and --key-file must be given together for TLS to NATS");
    }
    if let Some(ca) = ca {
        opts = opts.add_root_certificates(ca).require_tls(true);
    }
    if let Some((cert, key)) = cert {
        opts = opts.add_client_certificate(cert, key).require_tls(true);
    }
    if servers.is_empty() {
        servers.push("nats://127.0.0.1:4222".into());
    }
    Ok((servers, opts, last_error))
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn messages_never_show_credentials() {
        let servers = ["nats://kine:secret@10.0.0.1:4222".to_string(), "nats://10.0.0.2:4222".to_string()];
        assert_eq!(shown(&servers), "nats://***@10.0.0.1:4222,nats://10.0.0.2:4222");
        assert_eq!(shown(&["token@host:4222".to_string()]), "***@host:4222");
    }
}
