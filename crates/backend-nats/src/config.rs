//! The `nats://` endpoint, in kine's format:
//! `nats://[user:pass@|token@]host[:port][,nats://host2[:port]...][?params]`.
//! Credentials come from the first URL. Parameters may follow the first URL or the end of the
//! whole list (as the format above reads); giving them in two places is an error. Every
//! invalid value is an error that names the parameter (kine silently ignores some).

use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    None,
    UserPassword(String, String),
    Token(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsConfig {
    /// `host:port` of each server (empty for a bare `nats://`).
    pub servers: Vec<String>,
    pub credentials: Credentials,
    pub bucket: String,
    pub replicas: usize,
    /// The stream's per-key message limit; 0: none (history is kept until compaction, as in
    /// etcd).
    pub rev_history: i64,
    pub slow_method: Duration,
    pub context_file: Option<PathBuf>,
    pub creds_file: Option<PathBuf>,
    /// Embedded-server parameters (kine's `nats` build tag).
    pub no_embed: bool,
    pub dont_listen: bool,
    pub server_config: Option<PathBuf>,
    pub stdout_logging: bool,
    pub data_dir: Option<PathBuf>,
    /// Embedded: JetStream fsyncs every message before acknowledging it (`syncAlways`).
    pub sync_always: bool,
    /// Embedded: JetStream fsyncs this often (`syncInterval`; nats-server's default is 2 min).
    pub sync_interval: Option<Duration>,
    /// Serve a read-only copy of this bucket (`mirror`): the bucket is a JetStream mirror of it,
    /// created if missing (docs/nats.md, "Read-only copies").
    pub mirror: Option<String>,
    /// Where the mirrored bucket lives: its JetStream domain (`mirrorDomain`) or API prefix
    /// (`mirrorApi`); neither: this server's own JetStream.
    pub mirror_source: MirrorSource,
    /// The servers' `max_control_line` (`maxControlLine`; nats-server's default 4096): the
    /// longest protocol line, which limits a key's subject. The embedded server reports its own.
    pub max_control_line: usize,
}

/// nats-server's default `max_control_line`.
pub const DEFAULT_MAX_CONTROL_LINE: usize = 4096;

/// Where a mirrored bucket is reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MirrorSource {
    #[default]
    Local,
    Domain(String),
    Api(String),
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            servers: Vec::new(),
            credentials: Credentials::None,
            bucket: "kine".into(),
            replicas: 1,
            rev_history: 0,
            slow_method: Duration::from_millis(500),
            context_file: None,
            creds_file: None,
            no_embed: false,
            dont_listen: false,
            server_config: None,
            stdout_logging: false,
            data_dir: None,
            sync_always: false,
            sync_interval: None,
            mirror: None,
            mirror_source: MirrorSource::Local,
            max_control_line: DEFAULT_MAX_CONTROL_LINE,
        }
    }
}

/// An error's text: what is wrong, without the endpoint (it may hold credentials; the caller
/// names the flag and shows the endpoint without them).
fn err(what: impl std::fmt::Display) -> String {
    what.to_string()
}

/// Decodes `%XX` escapes (credentials may contain reserved characters).
fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Splits the list at each `,` that starts another URL, so that a parameter value may contain
/// commas (a directory name, say), as may a password.
pub fn split_urls(endpoint: &str) -> Vec<&str> {
    let starts_url = |rest: &str| {
        rest.split_once("://")
            .is_some_and(|(scheme, _)| !scheme.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphanumeric()))
    };
    let mut urls = Vec::new();
    let mut start = 0;
    for (i, _) in endpoint.match_indices(',') {
        if starts_url(&endpoint[i + 1..]) {
            urls.push(&endpoint[start..i]);
            start = i + 1;
        }
    }
    urls.push(&endpoint[start..]);
    urls
}

pub fn parse(endpoint: &str, parse_duration: impl Fn(&str) -> Result<Duration, String>) -> Result<NatsConfig, String> {
    let mut cfg = NatsConfig::default();
    let mut params: Option<&str> = None;
    for (i, url) in split_urls(endpoint).into_iter().enumerate() {
        let rest = url.strip_prefix("nats://").ok_or_else(|| {
            // Only the scheme: the rest of the URL may hold credentials.
            let scheme = url.split_once("://").map_or("no scheme", |(s, _)| s);
            err(format!("every URL must start with nats:// (URL {} has {scheme:?})", i + 1))
        })?;
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        if rest.contains('?') {
            if params.is_some() {
                return Err(err("parameters are given twice; give them once, after the first or the last URL"));
            }
            params = Some(query);
        }
        let authority = authority.trim_end_matches('/');
        let hostport = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => {
                if i > 0 {
                    return Err(err("credentials are only read from the first URL; move them there"));
                }
                cfg.credentials = match userinfo.split_once(':') {
                    Some((user, pass)) => Credentials::UserPassword(
                        unescape(user).ok_or_else(|| err("bad %-escape in the user name"))?,
                        unescape(pass).ok_or_else(|| err("bad %-escape in the password"))?,
                    ),
                    None => Credentials::Token(unescape(userinfo).ok_or_else(|| err("bad %-escape in the token"))?),
                };
                hostport
            }
            None => authority,
        };
        if !hostport.is_empty() {
            if let Some((_, port)) = hostport.rsplit_once(':')
                && !port.ends_with(']')
                && port.parse::<u16>().is_err()
            {
                return Err(err(format!("invalid port in {hostport:?}")));
            }
            cfg.servers.push(hostport.to_string());
        } else if i > 0 {
            return Err(err(format!("URL {} has no host", i + 1)));
        }
    }
    if let Some(query) = params {
        parse_params(query, &mut cfg, &parse_duration)?;
    }
    if cfg.context_file.is_some() && !cfg.servers.is_empty() {
        return Err(err("contextFile names the servers; do not give a host in the URL as well"));
    }
    if cfg.sync_always && cfg.sync_interval.is_some() {
        return Err(err("give syncAlways or syncInterval, not both"));
    }
    if cfg.mirror.is_none() && cfg.mirror_source != MirrorSource::Local {
        return Err(err("mirrorDomain and mirrorApi say where the mirror= bucket is; give mirror=BUCKET too"));
    }
    if cfg.mirror.as_deref() == Some(cfg.bucket.as_str()) && cfg.mirror_source == MirrorSource::Local {
        return Err(err(format!(
            "mirror={} names this bucket itself; a copy needs a bucket of its own (bucket=NAME)",
            cfg.bucket
        )));
    }
    Ok(cfg)
}

/// A whole number from `min` to `max`, or an error naming the parameter.
fn in_range(name: &str, value: &str, min: i64, max: i64) -> Result<i64, String> {
    value
        .parse()
        .ok()
        .filter(|v| (min..=max).contains(v))
        .ok_or_else(|| err(format!("{name}={value} must be a number from {min} to {max}")))
}

fn parse_params(
    query: &str,
    cfg: &mut NatsConfig,
    parse_duration: &impl Fn(&str) -> Result<Duration, String>,
) -> Result<(), String> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = unescape(value).ok_or_else(|| err(format!("bad %-escape in parameter {name}")))?;
        let path = || -> Result<Option<PathBuf>, String> {
            if value.is_empty() {
                return Err(err(format!("parameter {name} needs a file or directory")));
            }
            Ok(Some(PathBuf::from(&value)))
        };
        let flag = || -> Result<bool, String> {
            match value.as_str() {
                "" | "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                other => Err(err(format!("parameter {name}={other} must be true or false"))),
            }
        };
        match name {
            "bucket" | "mirror" => {
                let valid =
                    !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !valid {
                    return Err(err(format!("{name}={value:?} must be letters, digits, '_' or '-'")));
                }
                if name == "bucket" {
                    cfg.bucket = value;
                } else {
                    cfg.mirror = Some(value);
                }
            }
            "mirrorDomain" | "mirrorApi" => {
                let token_ok =
                    |s: &str| !s.is_empty() && !s.bytes().any(|b| b.is_ascii_whitespace() || b == b'*' || b == b'>');
                if !token_ok(&value) || (name == "mirrorDomain" && value.contains('.')) {
                    return Err(err(format!(
                        "{name}={value:?} is not a valid JetStream {}",
                        if name == "mirrorDomain" { "domain" } else { "API prefix" }
                    )));
                }
                if cfg.mirror_source != MirrorSource::Local {
                    return Err(err("give mirrorDomain or mirrorApi, not both"));
                }
                cfg.mirror_source =
                    if name == "mirrorDomain" { MirrorSource::Domain(value) } else { MirrorSource::Api(value) };
            }
            "replicas" => cfg.replicas = in_range(name, &value, 1, 5)? as usize,
            "revHistory" => {
                cfg.rev_history = in_range(name, &value, 0, 1_000_000)?;
                if cfg.rev_history == 1 {
                    return Err(err("revHistory=1 keeps no history: use 0 (no limit, the default) or 2 or more"));
                }
            }
            "slowMethod" => {
                cfg.slow_method = parse_duration(&value).map_err(|e| err(format!("slowMethod={value}: {e}")))?;
            }
            "contextFile" => cfg.context_file = path()?,
            "credsFile" => cfg.creds_file = path()?,
            "noEmbed" => cfg.no_embed = flag()?,
            "maxControlLine" => cfg.max_control_line = in_range(name, &value, 1024, 1 << 20)? as usize,
            "dontListen" => cfg.dont_listen = flag()?,
            "serverConfig" => cfg.server_config = path()?,
            "stdoutLogging" => cfg.stdout_logging = flag()?,
            "dataDir" => cfg.data_dir = path()?,
            "syncAlways" => cfg.sync_always = flag()?,
            "syncInterval" => {
                let interval = parse_duration(&value).map_err(|e| err(format!("syncInterval={value}: {e}")))?;
                if interval.is_zero() {
                    return Err(err("syncInterval must be more than 0 (syncAlways fsyncs every write)"));
                }
                cfg.sync_interval = Some(interval);
            }
            other => return Err(err(format!("unknown nats parameter {other:?}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dur(s: &str) -> Result<Duration, String> {
        s.strip_suffix("ms").and_then(|n| n.parse().ok()).map(Duration::from_millis).ok_or_else(|| "bad".to_string())
    }

    #[test]
    fn kine_formats() {
        let c = parse("nats://", dur).unwrap();
        assert_eq!((c.servers.len(), c.bucket.as_str(), c.replicas, c.rev_history), (0, "kine", 1, 0));
        let c =
            parse("nats://u:p%40ss@h1:4222,nats://h2:4223?bucket=k8s&replicas=3&revHistory=20&slowMethod=250ms", dur)
                .unwrap();
        assert_eq!(c.servers, vec!["h1:4222", "h2:4223"]);
        assert_eq!(c.credentials, Credentials::UserPassword("u".into(), "p@ss".into()));
        assert_eq!((c.bucket.as_str(), c.replicas, c.rev_history), ("k8s", 3, 20));
        assert_eq!(c.slow_method, Duration::from_millis(250));
        let c = parse("nats://secret@127.0.0.1?noEmbed&dataDir=/var/lib/nats", dur).unwrap();
        assert_eq!(c.credentials, Credentials::Token("secret".into()));
        assert!(c.no_embed);
        assert_eq!(c.data_dir, Some(PathBuf::from("/var/lib/nats")));
        // Commas inside a parameter value do not split the URL list.
        let c = parse("nats://?dataDir=/tmp/a=1,b=2/nats", dur).unwrap();
        assert_eq!(c.data_dir, Some(PathBuf::from("/tmp/a=1,b=2/nats")));
        let c = parse("nats://h1:4222,nats://h2:4222?dataDir=/x,y", dur).unwrap();
        assert_eq!(c.servers, vec!["h1:4222", "h2:4222"]);
        assert_eq!(c.data_dir, Some(PathBuf::from("/x,y")));
    }

    #[test]
    fn invalid_values_name_the_parameter() {
        let e = |s: &str| parse(s, dur).unwrap_err();
        assert!(e("nats://h?replicas=7").contains("replicas=7"));
        assert!(e("nats://h?replicas=x").contains("replicas=x"));
        assert!(e("nats://h?revHistory=1").contains("revHistory=1"));
        assert!(e("nats://?syncAlways&syncInterval=5ms").contains("not both"));
        assert!(e("nats://?syncInterval=0ms").contains("syncInterval must be more than 0"));
        let c = parse("nats://?syncInterval=50ms", dur).unwrap();
        assert_eq!((c.sync_always, c.sync_interval), (false, Some(Duration::from_millis(50))));
        assert!(parse("nats://?syncAlways", dur).unwrap().sync_always);
        assert!(e("nats://h?slowMethod=soon").contains("slowMethod=soon"));
        assert!(e("nats://h?bucket=a.b").contains("bucket="));
        assert!(e("nats://h?colour=blue").contains("unknown nats parameter \"colour\""));
        assert!(e("nats://h:notaport").contains("invalid port"));
        assert!(e("nats://h,http://x").contains("must start with nats://"));
        assert!(e("nats://h?contextFile=/x").contains("contextFile"));
        assert!(e("nats://h?replicas=1,nats://j?bucket=b").contains("given twice"));
        assert!(e("nats://u:p@h,nats://x:y@j").contains("first URL"));
        assert!(e("nats://h,http://x").contains("must start with nats://"));
        // No error shows credentials (the caller shows the endpoint without them).
        for bad in [
            "nats://u:s3cret@h?bogus=1",
            "nats://s3cret@h:x",
            "nats://h,http://u:s3cret@x",
            "nats://u:s3cret@h?replicas=9",
        ] {
            assert!(!e(bad).contains("s3cret"), "{}", e(bad));
        }
        assert!(e("nats://h?mirrorDomain=edge").contains("give mirror=BUCKET too"));
        assert!(e("nats://h?mirror=kine").contains("names this bucket itself"));
        assert!(e("nats://h?bucket=c&mirror=kine&mirrorDomain=a.b").contains("mirrorDomain"));
        assert!(e("nats://h?bucket=c&mirror=kine&mirrorDomain=e&mirrorApi=$JS.e.API").contains("not both"));
        assert!(e("nats://h?bucket=c&mirror=a.b").contains("mirror="));
    }

    #[test]
    fn mirror_parameters() {
        let c = parse("nats://h?bucket=copy&mirror=kine&mirrorDomain=edge", dur).unwrap();
        assert_eq!((c.bucket.as_str(), c.mirror.as_deref()), ("copy", Some("kine")));
        assert_eq!(c.mirror_source, MirrorSource::Domain("edge".into()));
        let c = parse("nats://h?mirror=kine&mirrorApi=$JS.hub.API&bucket=x", dur).unwrap();
        assert_eq!(c.mirror_source, MirrorSource::Api("$JS.hub.API".into()));
        // The origin's own name is fine when it lives in another domain.
        let c = parse("nats://h?mirror=kine&mirrorDomain=edge", dur).unwrap();
        assert_eq!((c.bucket.as_str(), c.mirror.as_deref()), ("kine", Some("kine")));
    }
}
