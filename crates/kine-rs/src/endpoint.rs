//! `--endpoint` parsing: which datastore to use, in kine's URL formats.

use std::path::PathBuf;

pub const DEFAULT_SQLITE_PATH: &str = "./db/state.db";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Sqlite { path: PathBuf },
    Memory,
    Nats(Box<kine_backend_nats::config::NatsConfig>),
}

/// Embedded-server parameters: this build has no embedded NATS server yet.
fn check_external_nats(endpoint: &str, cfg: &kine_backend_nats::config::NatsConfig) -> Result<(), String> {
    let embedded_only = [
        ("dontListen", cfg.dont_listen),
        ("serverConfig", cfg.server_config.is_some()),
        ("stdoutLogging", cfg.stdout_logging),
        ("dataDir", cfg.data_dir.is_some()),
    ];
    if let Some((name, _)) = embedded_only.iter().find(|(_, set)| *set) {
        return Err(format!(
            "--endpoint {endpoint:?}: parameter {name} configures an embedded NATS server, which this build of kine-rs does not include"
        ));
    }
    if cfg.servers.is_empty() && cfg.context_file.is_none() {
        return Err(format!(
            "--endpoint {endpoint:?}: this build of kine-rs has no embedded NATS server; name an external one, e.g. nats://127.0.0.1:4222"
        ));
    }
    Ok(())
}

/// go-sqlite3 DSN parameters kine users pass (kine's own default DSN sets several). kine-rs
/// always runs SQLite in WAL mode with immediate write transactions and a busy timeout, so
/// these are accepted when they ask for what kine-rs does anyway.
fn check_sqlite_param(name: &str, value: &str) -> Result<(), String> {
    let v = value.to_ascii_lowercase();
    let ok = match name {
        "_journal" | "_journal_mode" => v == "wal",
        "cache" => v == "shared" || v == "private",
        "_busy_timeout" | "_timeout" => value.parse::<u64>().is_ok(),
        "_txlock" => v == "immediate",
        "_fk" | "_foreign_keys" => matches!(v.as_str(), "0" | "false" | "no" | "off"),
        "_synchronous" | "_sync" => matches!(v.as_str(), "full" | "2" | "extra" | "3"),
        _ => return Err(format!("--endpoint: unknown sqlite parameter {name:?}")),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--endpoint: sqlite parameter {name}={value} is not supported (kine-rs always uses WAL, immediate write transactions and synchronous=FULL)"
        ))
    }
}

pub fn parse(endpoint: &str) -> Result<Endpoint, String> {
    if endpoint.is_empty() {
        return Ok(Endpoint::Sqlite { path: PathBuf::from(DEFAULT_SQLITE_PATH) });
    }
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(format!(
            "--endpoint {endpoint:?}: invalid datastore endpoint, expected <scheme>://... (e.g. sqlite://./db/state.db or memory://)"
        ));
    };
    match scheme {
        "sqlite" => {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if path.is_empty() {
                return Err(format!(
                    "--endpoint {endpoint:?}: sqlite endpoint needs a file path, e.g. sqlite://./db/state.db"
                ));
            }
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                check_sqlite_param(name, value)?;
            }
            Ok(Endpoint::Sqlite { path: PathBuf::from(path) })
        }
        "memory" => {
            if !rest.is_empty() {
                return Err(format!("--endpoint {endpoint:?}: memory:// takes no path or parameters"));
            }
            Ok(Endpoint::Memory)
        }
        "nats" => {
            let cfg = kine_backend_nats::config::parse(endpoint, crate::duration::parse)?;
            check_external_nats(endpoint, &cfg)?;
            Ok(Endpoint::Nats(Box::new(cfg)))
        }
        "postgres" | "postgresql" | "mysql" | "jetstream" => Err(format!(
            "--endpoint {endpoint:?}: the {scheme} backend is not available in this version of kine-rs (supported: sqlite://, memory://, nats://)"
        )),
        other => Err(format!(
            "--endpoint {endpoint:?}: unknown datastore scheme {other:?} (supported: sqlite://, memory://, nats://)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kine_endpoint_formats() {
        assert_eq!(parse(""), Ok(Endpoint::Sqlite { path: DEFAULT_SQLITE_PATH.into() }));
        assert_eq!(
            parse("sqlite:///var/lib/kine/state.db"),
            Ok(Endpoint::Sqlite { path: "/var/lib/kine/state.db".into() })
        );
        assert_eq!(
            parse("sqlite://./db/state.db?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate"),
            Ok(Endpoint::Sqlite { path: "./db/state.db".into() })
        );
        assert_eq!(parse("memory://"), Ok(Endpoint::Memory));
    }

    #[test]
    fn bad_endpoints_name_the_problem() {
        assert!(parse("foo").unwrap_err().contains("invalid datastore endpoint"));
        assert!(parse("redis://x").unwrap_err().contains("unknown datastore scheme \"redis\""));
        assert!(parse("sqlite://").unwrap_err().contains("needs a file path"));
        assert!(parse("sqlite://x.db?_journal=DELETE").unwrap_err().contains("_journal=DELETE"));
        assert!(parse("sqlite://x.db?bogus=1").unwrap_err().contains("unknown sqlite parameter \"bogus\""));
        assert!(parse("nats://").unwrap_err().contains("no embedded NATS server"));
        assert!(parse("nats://h:4222?dataDir=/x").unwrap_err().contains("parameter dataDir"));
        assert!(parse("nats://h:4222?replicas=9").unwrap_err().contains("replicas=9"));
        assert!(matches!(parse("nats://h:4222?noEmbed&bucket=b"), Ok(Endpoint::Nats(_))));
        assert!(parse("memory://x").unwrap_err().contains("takes no path"));
    }
}
