//! `--listen-address` parsing and binding.

use anyhow::{Context, Result, bail};
use kine_server::Listener;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    Tcp(String),
    Unix(PathBuf),
}

pub fn parse(address: &str) -> Result<ListenAddress> {
    if let Some(path) = address.strip_prefix("unix://") {
        if path.is_empty() {
            bail!("--listen-address {address:?}: unix socket path is empty");
        }
        return Ok(ListenAddress::Unix(PathBuf::from(path)));
    }
    // As kine: an http:// or https:// prefix is accepted and ignored (TLS comes from the flags).
    let hostport = address.strip_prefix("http://").or_else(|| address.strip_prefix("https://")).unwrap_or(address);
    if hostport.is_empty() || !hostport.contains(':') {
        bail!("--listen-address {address:?}: expected host:port or unix://PATH");
    }
    Ok(ListenAddress::Tcp(hostport.to_string()))
}

/// A bound listener and the URL clients should use.
pub struct Bound {
    pub listener: Listener,
    pub client_url: String,
    pub description: String,
    pub socket_path: Option<PathBuf>,
}

pub async fn bind(address: &ListenAddress, tls: bool) -> Result<Bound> {
    match address {
        ListenAddress::Tcp(hostport) => {
            let hostport = if hostport.starts_with(':') { format!("0.0.0.0{hostport}") } else { hostport.clone() };
            let listener = tokio::net::TcpListener::bind(&hostport)
                .await
                .with_context(|| format!("--listen-address {hostport}: cannot listen"))?;
            let local: SocketAddr = listener.local_addr().context("read the bound address")?;
            let connect_ip = if local.ip().is_unspecified() {
                if local.is_ipv4() { "127.0.0.1".to_string() } else { "[::1]".to_string() }
            } else if local.is_ipv6() {
                format!("[{}]", local.ip())
            } else {
                local.ip().to_string()
            };
            let scheme = if tls { "https" } else { "http" };
            Ok(Bound {
                listener: Listener::Tcp(listener),
                client_url: format!("{scheme}://{connect_ip}:{}", local.port()),
                description: format!("tcp {local}"),
                socket_path: None,
            })
        }
        ListenAddress::Unix(path) => {
            // A socket left by a previous run would make bind fail.
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if meta.file_type().is_socket() {
                    std::fs::remove_file(path).with_context(|| format!("remove stale socket {}", path.display()))?;
                } else {
                    bail!("--listen-address unix://{}: exists and is not a socket", path.display());
                }
            }
            let listener = tokio::net::UnixListener::bind(path)
                .with_context(|| format!("--listen-address unix://{}: cannot listen", path.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("chmod 0600 {}", path.display()))?;
            let scheme = if tls { "unixs" } else { "unix" };
            Ok(Bound {
                listener: Listener::Unix(listener),
                client_url: format!("{scheme}://{}", path.display()),
                description: format!("unix socket {}", path.display()),
                socket_path: Some(path.clone()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(parse("0.0.0.0:2379").unwrap(), ListenAddress::Tcp("0.0.0.0:2379".into()));
        assert_eq!(parse("http://127.0.0.1:2379").unwrap(), ListenAddress::Tcp("127.0.0.1:2379".into()));
        assert_eq!(parse("unix://kine.sock").unwrap(), ListenAddress::Unix("kine.sock".into()));
        assert!(parse("unix://").is_err());
        assert!(parse("localhost").unwrap_err().to_string().contains("expected host:port"));
    }
}
