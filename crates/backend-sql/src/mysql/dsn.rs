//! kine's `mysql://` endpoint: go-sql-driver's DSN after the scheme
//! (`user:pass@tcp(host:port)/db?params`, `user@unix(/path/to.sock)/db`), or the URL form
//! (`user:pass@host:port/db`, percent-encoded). An empty endpoint means kine's default:
//! `root@unix(/var/run/mysqld/mysqld.sock)/kubernetes`, or `root@tcp(127.0.0.1:3306)/kubernetes`
//! when TLS is configured. The database defaults to `kubernetes`.

use anyhow::{Result, bail};
use std::time::Duration;

pub const DEFAULT_SOCKET: &str = "/var/run/mysqld/mysqld.sock";
pub const DEFAULT_DATABASE: &str = "kubernetes";
pub const DEFAULT_PORT: u16 = 3306;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix(String),
}

/// go-sql-driver's `tls` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsParam {
    /// `tls=true`: encrypted and verified.
    Verify,
    /// `tls=skip-verify`: encrypted, not verified.
    SkipVerify,
    /// `tls=preferred`: kine-rs asks for TLS only with its TLS flags (no silent fallback).
    Preferred,
    Off,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Dsn {
    pub user: String,
    pub password: Option<String>,
    pub address: Address,
    pub database: String,
    pub tls: Option<TlsParam>,
    pub timeout: Option<Duration>,
    /// Unknown parameters: session variables (`SET name = value`), as go-sql-driver sets them.
    pub session_vars: Vec<(String, String)>,
}

/// Without the password.
impl std::fmt::Debug for Dsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dsn")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("address", &self.address)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("session_vars", &self.session_vars)
            .finish()
    }
}

/// go-sql-driver parameters that only shape the Go client's own behaviour (how it parses
/// dates, interpolates, …): accepted for drop-in compatibility, with no effect here.
const CLIENT_ONLY: &[&str] = &[
    "allowAllFiles",
    "allowCleartextPasswords",
    "allowFallbackToPlaintext",
    "allowNativePasswords",
    "allowOldPasswords",
    "charset",
    "checkConnLiveness",
    "clientFoundRows",
    "collation",
    "columnsWithAlias",
    "interpolateParams",
    "loc",
    "maxAllowedPacket",
    "multiStatements",
    "parseTime",
    "readTimeout",
    "rejectReadOnly",
    "serverPubKey",
    "writeTimeout",
];

/// The endpoint without its password, for messages.
pub fn redact(endpoint: &str) -> String {
    let Some(rest) = endpoint.strip_prefix("mysql://") else { return endpoint.to_string() };
    let (before, after) = split_at_address(rest);
    match before.and_then(|b| b.split_once(':')) {
        Some((user, _)) => format!("mysql://{user}:***@{after}"),
        None => endpoint.to_string(),
    }
}

/// `user[:pass]` and the rest, split at the `@` before the address (the last `@` before the
/// path, so a password may contain `@`).
fn split_at_address(rest: &str) -> (Option<&str>, &str) {
    let path_start = rest.find(")/").map(|i| i + 1).or_else(|| {
        // The URL form: the first '/' after the last '@'.
        let at = rest.rfind('@').map_or(0, |a| a + 1);
        rest[at..].find('/').map(|i| at + i)
    });
    let head = &rest[..path_start.unwrap_or(rest.len())];
    match head.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else { bail!("invalid percent-encoding in {s:?}") };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow::anyhow!("percent-encoding in {s:?} is not UTF-8"))
}

/// Parses `mysql://…` (the whole endpoint). `with_tls`: kine's TLS flags are given (the default
/// address is then TCP on 127.0.0.1, as kine's).
pub fn parse(endpoint: &str, with_tls: bool) -> Result<Dsn> {
    let Some(rest) = endpoint.strip_prefix("mysql://") else { bail!("not a mysql:// endpoint") };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (credentials, location) = split_at_address(rest);
    let (user, password) = match credentials {
        Some(c) => match c.split_once(':') {
            Some((u, p)) => (u.to_string(), Some(p.to_string())),
            None => (c.to_string(), None),
        },
        None => ("root".to_string(), None),
    };
    let (address, database, url_form) = parse_location(location, with_tls)?;
    let (user, password) = if url_form {
        (percent_decode(&user)?, password.map(|p| percent_decode(&p)).transpose()?)
    } else {
        (user, password)
    };
    if user.is_empty() {
        bail!("the user name is empty");
    }
    let mut dsn = Dsn { user, password, address, database, tls: None, timeout: None, session_vars: Vec::new() };
    for param in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        let value = percent_decode(value)?;
        match name {
            "tls" => {
                dsn.tls = Some(match value.as_str() {
                    "true" => TlsParam::Verify,
                    "skip-verify" => TlsParam::SkipVerify,
                    "preferred" => TlsParam::Preferred,
                    "false" => TlsParam::Off,
                    other => bail!(
                        "parameter tls={other}: use true, skip-verify, preferred or false (kine-rs takes \
                         certificates from --ca-file, --cert-file and --key-file)"
                    ),
                })
            }
            "timeout" => {
                dsn.timeout = Some(parse_go_duration(&value).map_err(|e| anyhow::anyhow!("parameter timeout: {e}"))?)
            }
            n if CLIENT_ONLY.contains(&n) => {}
            n => {
                if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    bail!("parameter {n:?}: not a go-sql-driver parameter or a session variable name");
                }
                dsn.session_vars.push((n.to_string(), value));
            }
        }
    }
    Ok(dsn)
}

/// `tcp(host:port)/db`, `unix(/path)/db`, `host:port/db`, `/db` or empty. Returns the address,
/// the database and whether this was the URL form (percent-encoded).
fn parse_location(location: &str, with_tls: bool) -> Result<(Address, String, bool)> {
    let default_address = || {
        if with_tls {
            Address::Tcp { host: "127.0.0.1".into(), port: DEFAULT_PORT }
        } else {
            Address::Unix(DEFAULT_SOCKET.into())
        }
    };
    let (address, path, url_form) = if let Some(inner) = location.strip_prefix("tcp(") {
        let Some((hostport, path)) = inner.split_once(')') else { bail!("tcp( has no closing parenthesis") };
        let address = if hostport.is_empty() {
            Address::Tcp { host: "127.0.0.1".into(), port: DEFAULT_PORT }
        } else {
            host_port(hostport)?
        };
        (address, path, false)
    } else if let Some(inner) = location.strip_prefix("unix(") {
        let Some((socket, path)) = inner.split_once(')') else { bail!("unix( has no closing parenthesis") };
        (Address::Unix(if socket.is_empty() { DEFAULT_SOCKET.into() } else { socket.to_string() }), path, false)
    } else if location.is_empty() || location.starts_with('/') {
        (default_address(), location, false)
    } else {
        let (hostport, path) = match location.find('/') {
            Some(i) => (&location[..i], &location[i..]),
            None => (location, ""),
        };
        (host_port(hostport)?, path, true)
    };
    let database = path.strip_prefix('/').unwrap_or(path);
    if database.contains('/') {
        bail!("database name {database:?} contains '/'");
    }
    let database = if database.is_empty() { DEFAULT_DATABASE.to_string() } else { percent_decode(database)? };
    if database.len() > 64 || database.contains('`') || database.contains('\0') {
        bail!("database name {database:?} is not valid in MySQL (at most 64 characters, no backquote)");
    }
    Ok((address, database, url_form))
}

fn host_port(hostport: &str) -> Result<Address> {
    // [v6]:port, host:port, host
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else { bail!("{hostport:?}: no closing ]") };
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        bail!("{hostport:?}: no host");
    }
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| anyhow::anyhow!("{hostport:?}: port {p:?} is not a number"))?,
        None => DEFAULT_PORT,
    };
    Ok(Address::Tcp { host: host.to_string(), port })
}

/// Go's `time.ParseDuration` for the forms a DSN uses (`5s`, `1m30s`, `500ms`).
fn parse_go_duration(s: &str) -> Result<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        bail!("empty duration");
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().map_err(|_| anyhow::anyhow!("{s:?} is not a duration"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => bail!("{s:?}: unknown unit {other:?} (use ms, s, m or h)"),
        };
        total += Duration::from_secs_f64(number * seconds);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Address {
        Address::Tcp { host: host.into(), port }
    }

    #[test]
    fn kines_dsn_form() {
        let d = parse("mysql://kine:p@ss@tcp(db.example:3307)/k8s?parseTime=true&tls=skip-verify", false).unwrap();
        assert_eq!((d.user.as_str(), d.password.as_deref()), ("kine", Some("p@ss")));
        assert_eq!((d.address, d.database.as_str()), (tcp("db.example", 3307), "k8s"));
        assert_eq!(d.tls, Some(TlsParam::SkipVerify));
        let d = parse("mysql://root@unix(/run/my.sock)/", false).unwrap();
        assert_eq!(
            (d.address, d.database.as_str(), d.password),
            (Address::Unix("/run/my.sock".into()), "kubernetes", None)
        );
        let d = parse("mysql://u:p@tcp(127.0.0.1)/x?timeout=1m30s&sql_mode=ANSI", false).unwrap();
        assert_eq!((d.address, d.timeout), (tcp("127.0.0.1", 3306), Some(Duration::from_secs(90))));
        assert_eq!(d.session_vars, vec![("sql_mode".into(), "ANSI".into())]);
    }

    #[test]
    fn url_form_and_defaults() {
        let d = parse("mysql://kine:p%40ss@[::1]:3310/db", false).unwrap();
        assert_eq!((d.password.as_deref(), d.address, d.database.as_str()), (Some("p@ss"), tcp("::1", 3310), "db"));
        let d = parse("mysql://", false).unwrap();
        assert_eq!((d.user.as_str(), d.address), ("root", Address::Unix(DEFAULT_SOCKET.into())));
        assert_eq!(parse("mysql://", true).unwrap().address, tcp("127.0.0.1", 3306));
        assert_eq!(parse("mysql://u@db", false).unwrap().address, tcp("db", 3306));
    }

    #[test]
    fn bad_input_is_named() {
        let e = |s: &str| format!("{:#}", parse(s, false).unwrap_err());
        assert!(e("mysql://u@tcp(h:x)/d").contains("port"));
        assert!(e("mysql://u@tcp(h:1/d").contains("parenthesis"));
        assert!(e("mysql://u@h/d?tls=custom").contains("tls=custom"));
        assert!(e("mysql://u@h/d?timeout=5y").contains("timeout"));
        assert!(e("mysql://u@h/d?bad-name=1").contains("bad-name"));
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("mysql://kine:secret@tcp(db:3306)/k"), "mysql://kine:***@tcp(db:3306)/k");
        assert_eq!(redact("mysql://kine:se@cret@db:3306/k"), "mysql://kine:***@db:3306/k");
        assert_eq!(redact("mysql://db:3306/k"), "mysql://db:3306/k");
    }
}
