//! `kine-rs health`: asks a running kine-rs for its `/health` (on --metrics-bind-address, the
//! same flag and `KINE_METRICS_BIND_ADDRESS` the server reads; an unspecified address is asked
//! on loopback), for a container's HEALTHCHECK or an exec probe where no curl is installed.
//! Exits 0 when the answer is HTTP 200 with `"health":"true"`; otherwise fails saying what it
//! got. Plain HTTP only: where /health is served over TLS (--server-cert-file without
//! --metrics-ignore-tls-config) it refuses and says so.

use crate::cli::Cli;
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(cli: &Cli) -> Result<()> {
    if cli.server_cert_file.is_some() && !cli.metrics_ignore_tls_config {
        bail!(
            "/health is served over TLS here (--server-cert-file) and `kine-rs health` asks in plain HTTP: set \
             --metrics-ignore-tls-config, or probe with curl --cacert"
        );
    }
    let Some(address) = crate::metrics_http::address(&cli.metrics_bind_address)? else {
        bail!("--metrics-bind-address is 0: this kine-rs serves no /health to ask");
    };
    let mut addr: SocketAddr = address
        .to_socket_addrs()
        .with_context(|| format!("--metrics-bind-address {address}"))?
        .next()
        .with_context(|| format!("--metrics-bind-address {address}: no address"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let (status, body) = get(addr).with_context(|| format!("GET http://{addr}/health"))?;
    let body = body.trim();
    if status == 200 && body.contains("\"health\":\"true\"") {
        println!("{body}");
        return Ok(());
    }
    bail!("kine-rs at {addr} is not healthy: HTTP {status}: {body}")
}

fn get(addr: SocketAddr) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {:?}", head.lines().next().unwrap_or("")))?;
    Ok((status, body.to_string()))
}
