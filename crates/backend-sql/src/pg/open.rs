//! Connecting to PostgreSQL: the URL (its `sslmode`, the statement cache parameters), TLS,
//! patience with a database that is still starting, and creating the database if it is
//! missing (not for a read-only open, which reports it).

use super::{Connector, PostgresOptions, conn, tls};
use crate::remote::{START_PATIENCE, pause_before_retry};
use anyhow::Context;
use std::str::FromStr;
use std::time::Duration;

/// Connection attempts give up after this unless the URL sets `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The connector for `options` and a first connection; `create`: create the database if it
/// is missing.
pub fn connect(options: &PostgresOptions, create: bool) -> anyhow::Result<(Connector, postgres::Client)> {
    let shown = redact(&options.url);
    let url = kine_database(&options.url.replacen("postgresql://", "postgres://", 1));
    let (sslmode, url) = split_sslmode(&url);
    let (statement_cache, url) = conn::split_cache_params(&url).with_context(|| format!("--endpoint {shown}"))?;
    let mut config = postgres::Config::from_str(&url).with_context(|| format!("--endpoint {shown}: invalid URL"))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    let tls = tls::connector(&options.tls, sslmode.as_deref()).with_context(|| format!("--endpoint {shown}"))?;
    if tls.is_some() {
        // TLS asked for is TLS or nothing (the library's default would fall back to plain).
        config.ssl_mode(postgres::config::SslMode::Require);
    }
    let connector = Connector { config, tls, statement_cache };
    // A database that is starting (or not reachable yet) gets a while; a refusal (wrong
    // password, no such role) does not.
    let started = std::time::Instant::now();
    let mut warned = false;
    let client = loop {
        match connector.connect() {
            Ok(c) => break c,
            Err(e) if create && missing_database(&e) => {
                create_database(&connector).with_context(|| format!("--endpoint {shown}"))?;
            }
            Err(e) if !refused(&e) && started.elapsed() < START_PATIENCE => {
                if !warned {
                    tracing::warn!(error = format!("{e:#}"), "PostgreSQL not reachable yet; retrying for 30 s");
                    warned = true;
                }
                pause_before_retry(options.stop.as_ref(), "PostgreSQL")?;
            }
            Err(e) => return Err(e.context(format!("--endpoint {shown}"))),
        }
    };
    Ok((connector, client))
}

/// The database as Go kine names it from the same URL: `kubernetes` when the URL names none,
/// and the name lower-cased (kine lower-cases it), so that the URL a Go kine was started with
/// reaches the same database.
fn kine_database(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let Some(scheme_end) = base.find("://").map(|i| i + 3) else { return url.to_string() };
    let authority_end = base[scheme_end..].find('/').map_or(base.len(), |i| scheme_end + i);
    let database = base[authority_end..].trim_start_matches('/');
    let database = if database.is_empty() { "kubernetes".to_string() } else { database.to_lowercase() };
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// The URL's `sslmode`, and the URL as the client library takes it (which knows only disable,
/// prefer and require: the verifying modes become `require`, with verification by rustls).
fn split_sslmode(url: &str) -> (Option<String>, String) {
    let Some((base, query)) = url.split_once('?') else { return (None, url.to_string()) };
    let mut mode = None;
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some(("sslmode", v)) => {
                mode = Some(v.to_string());
                if v.starts_with("verify") { "sslmode=require".to_string() } else { p.to_string() }
            }
            _ => p.to_string(),
        })
        .collect();
    (mode, format!("{base}?{}", params.join("&")))
}

/// The endpoint without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].find(':') {
            Some(colon) => format!("{}:***{}", &url[..s + 3 + colon], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

fn missing_database(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<postgres::Error>()
            .and_then(|p| p.code())
            .is_some_and(|code| *code == postgres::error::SqlState::INVALID_CATALOG_NAME)
    })
}

/// An answer from the server that retrying will not change (authentication, permissions…),
/// as opposed to no answer or "starting up".
fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let db_refusal = c.downcast_ref::<postgres::Error>().and_then(|p| p.code()).is_some_and(|code| {
            *code != postgres::error::SqlState::CANNOT_CONNECT_NOW
                && *code != postgres::error::SqlState::TOO_MANY_CONNECTIONS
        });
        // A failed TLS handshake (unknown CA, wrong name) will fail the same way again.
        let tls_refusal = c.downcast_ref::<rustls::Error>().is_some()
            || c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
        db_refusal || tls_refusal
    })
}

fn create_database(connector: &Connector) -> anyhow::Result<()> {
    let name = connector.config.get_dbname().context("the URL names no database")?.to_string();
    let mut admin = connector.clone();
    admin.config.dbname("postgres");
    let mut client = admin.connect().context("connect to the postgres database to create ours")?;
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    match client.batch_execute(&format!("CREATE DATABASE {quoted}")) {
        Ok(()) => {
            tracing::info!(database = %name, "PostgreSQL database created");
            Ok(())
        }
        // Another node created it first: 42P04, or, when both ran at the same moment, a unique
        // violation on pg_database's name index. Whatever the error, a database that exists now
        // is the one wanted.
        Err(e) => {
            let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]);
            match exists {
                Ok(Some(_)) => Ok(()),
                _ => Err(anyhow::Error::new(e).context(format!("create database {name}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kine_database;

    #[test]
    fn the_database_is_the_one_go_kine_uses() {
        assert_eq!(kine_database("postgres://u:p@h:5432"), "postgres://u:p@h:5432/kubernetes");
        assert_eq!(kine_database("postgres://u:p@h:5432/"), "postgres://u:p@h:5432/kubernetes");
        assert_eq!(kine_database("postgres://u:p@h/?sslmode=disable"), "postgres://u:p@h/kubernetes?sslmode=disable");
        assert_eq!(kine_database("postgres://u:p@h/K3s?sslmode=disable"), "postgres://u:p@h/k3s?sslmode=disable");
        assert_eq!(kine_database("postgres://h1:5432,h2:5432/db"), "postgres://h1:5432,h2:5432/db");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(super::redact("postgres://kine:secret@db:5432/kine"), "postgres://kine:***@db:5432/kine");
        assert_eq!(super::redact("postgres://db/kine"), "postgres://db/kine");
    }

    #[test]
    fn verifying_ssl_modes_become_require() {
        assert_eq!(
            super::split_sslmode("postgres://h/db?sslmode=verify-full&x=1"),
            (Some("verify-full".into()), "postgres://h/db?sslmode=require&x=1".into())
        );
        assert_eq!(super::split_sslmode("postgres://h/db"), (None, "postgres://h/db".into()));
    }
}
