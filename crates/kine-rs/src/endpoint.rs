//! `--endpoint` parsing: which datastore to use, in kine's URL formats.

use std::path::PathBuf;

pub const DEFAULT_SQLITE_PATH: &str = "./db/state.db";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Sqlite {
        path: PathBuf,
    },
    Memory,
    /// `postgres://` or `postgresql://`, kept whole (libpq's URL form).
    Postgres {
        url: String,
    },
    /// `mysql://`, kept whole (go-sql-driver's DSN, or the URL form).
    Mysql {
        url: String,
    },
    Nats(Box<kine_backend_nats::config::NatsConfig>),
}

/// An endpoint as messages show it: the password (or token) of every URL hidden. The user name
/// stays, so that a wrong one can be seen.
pub fn shown(endpoint: &str) -> String {
    // A list splits only at a `,` that starts another URL (a password may hold `,`).
    let urls = kine_backend_nats::config::split_urls(endpoint);
    urls.into_iter().map(hide_credentials).collect::<Vec<_>>().join(",")
}

fn hide_credentials(url: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    // The credentials end at the last `@` before the parameters (a password may hold `@` and
    // `/`, a DSN's address `(…)`).
    let rest = &url[scheme_end..];
    let before_params = rest.find('?').map_or(rest, |q| &rest[..q]);
    let Some(at) = before_params.rfind('@') else { return url.to_string() };
    let userinfo = &rest[..at];
    let hidden = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{}{hidden}{}", &url[..scheme_end], &rest[at..])
}

/// Whether this binary has the embedded NATS server (cargo feature `embedded-nats`).
pub const EMBEDDED_NATS: bool = cfg!(feature = "embedded-nats");

/// Where JetStream keeps its files unless `dataDir` or the config file say otherwise: next to
/// the default SQLite database.
pub const DEFAULT_NATS_DATA_DIR: &str = "./db/nats";

/// Whether a `nats://` endpoint asks for the embedded server: always in a build that has it,
/// unless `noEmbed` is given.
pub fn wants_embedded(cfg: &kine_backend_nats::config::NatsConfig) -> bool {
    EMBEDDED_NATS && !cfg.no_embed
}

/// Checks the combination of parameters for an embedded or an external server.
fn check_nats(flag: &str, endpoint: &str, cfg: &kine_backend_nats::config::NatsConfig) -> Result<(), String> {
    let endpoint = shown(endpoint);
    let embedded_only = [
        ("dontListen", cfg.dont_listen),
        ("serverConfig", cfg.server_config.is_some()),
        ("stdoutLogging", cfg.stdout_logging),
        ("dataDir", cfg.data_dir.is_some()),
        ("syncAlways", cfg.sync_always),
        ("syncInterval", cfg.sync_interval.is_some()),
    ];
    let embedded_param = embedded_only.iter().find(|(_, set)| *set).map(|(name, _)| *name);
    if wants_embedded(cfg) {
        if cfg.servers.len() > 1 {
            return Err(format!(
                "{flag} {endpoint:?}: the embedded NATS server binds one address; list several servers only with noEmbed (external servers)"
            ));
        }
        if cfg.context_file.is_some() {
            return Err(format!(
                "{flag} {endpoint:?}: contextFile names external NATS servers; add noEmbed to use them instead of the embedded server"
            ));
        }
        return Ok(());
    }
    if let Some(name) = embedded_param {
        return Err(if EMBEDDED_NATS {
            format!("{flag} {endpoint:?}: parameter {name} configures the embedded NATS server, but noEmbed is set")
        } else {
            format!(
                "{flag} {endpoint:?}: parameter {name} configures an embedded NATS server, and this kine-rs binary was built without one (cargo feature embedded-nats)"
            )
        });
    }
    if cfg.servers.is_empty() && cfg.context_file.is_none() {
        return Err(if EMBEDDED_NATS {
            format!(
                "{flag} {endpoint:?}: noEmbed needs the external server's address, e.g. nats://127.0.0.1:4222?noEmbed"
            )
        } else {
            format!(
                "{flag} {endpoint:?}: this kine-rs binary was built without the embedded NATS server (cargo feature embedded-nats); name an external server, e.g. nats://127.0.0.1:4222"
            )
        });
    }
    Ok(())
}

/// go-sqlite3 DSN parameters kine users pass (kine's own default DSN sets several). kine-rs
/// always runs SQLite in WAL mode with immediate write transactions and a busy timeout, so
/// these are accepted when they ask for what kine-rs does anyway.
fn check_sqlite_param(flag: &str, name: &str, value: &str) -> Result<(), String> {
    let v = value.to_ascii_lowercase();
    let ok = match name {
        "_journal" | "_journal_mode" => v == "wal",
        "cache" => v == "shared" || v == "private",
        "_busy_timeout" | "_timeout" => value.parse::<u64>().is_ok(),
        "_txlock" => v == "immediate",
        "_fk" | "_foreign_keys" => matches!(v.as_str(), "0" | "false" | "no" | "off"),
        "_synchronous" | "_sync" => matches!(v.as_str(), "full" | "2" | "extra" | "3"),
        _ => return Err(format!("{flag}: unknown sqlite parameter {name:?}")),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{flag}: sqlite parameter {name}={value} is not supported (kine-rs always uses WAL, immediate write transactions and synchronous=FULL)"
        ))
    }
}

/// The datastore `--endpoint` names; errors begin with the flag and the endpoint.
pub fn parse(endpoint: &str) -> Result<Endpoint, String> {
    parse_as("--endpoint", endpoint)
}

/// The datastore an endpoint names, given with `flag` (`--endpoint`, `--from`, `--to`); errors
/// begin with the flag.
pub fn parse_as(flag: &str, endpoint: &str) -> Result<Endpoint, String> {
    if endpoint.is_empty() {
        return Ok(Endpoint::Sqlite { path: PathBuf::from(DEFAULT_SQLITE_PATH) });
    }
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(format!(
            "{flag} {:?}: invalid datastore endpoint, expected <scheme>://... (e.g. sqlite://./db/state.db or memory://)",
            shown(endpoint)
        ));
    };
    match scheme {
        "sqlite" => {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if path.is_empty() {
                return Err(format!(
                    "{flag} {endpoint:?}: sqlite endpoint needs a file path, e.g. sqlite://./db/state.db"
                ));
            }
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                check_sqlite_param(flag, name, value)?;
            }
            Ok(Endpoint::Sqlite { path: PathBuf::from(path) })
        }
        "memory" => {
            if !rest.is_empty() {
                return Err(format!("{flag} {endpoint:?}: memory:// takes no path or parameters"));
            }
            Ok(Endpoint::Memory)
        }
        "nats" => {
            // The NATS parser's errors begin with `--endpoint "…": `.
            let cfg = kine_backend_nats::config::parse(endpoint, kine_core::duration::parse)
                .map_err(|e| format!("{flag} {:?}: {e}", shown(endpoint)))?;
            check_nats(flag, endpoint, &cfg)?;
            Ok(Endpoint::Nats(Box::new(cfg)))
        }
        "postgres" | "postgresql" => Ok(Endpoint::Postgres { url: endpoint.to_string() }),
        "mysql" => Ok(Endpoint::Mysql { url: endpoint.to_string() }),
        "jetstream" => Err(format!(
            "{flag} {scheme}://…: the {scheme} backend is not available in this version of kine-rs (supported: sqlite://, memory://, nats://, postgres://, mysql://)"
        )),
        other => Err(format!(
            "{flag} {scheme}://…: unknown datastore scheme {other:?} (supported: sqlite://, memory://, nats://, postgres://, mysql://)"
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
        assert!(parse("nats://h:4222?noEmbed&dataDir=/x").unwrap_err().contains("parameter dataDir"));
        assert!(parse("nats://?noEmbed").unwrap_err().contains("e.g. nats://127.0.0.1:4222"));
        assert!(parse("nats://h:4222?replicas=9").unwrap_err().contains("replicas=9"));
        assert!(matches!(parse("nats://h:4222?noEmbed&bucket=b"), Ok(Endpoint::Nats(_))));
        assert!(parse("memory://x").unwrap_err().contains("takes no path"));
    }

    /// `migrate --from/--to` and `inspect` name their own flag, once.
    #[test]
    fn errors_name_the_flag_given() {
        assert!(parse_as("--to", "redis://x").unwrap_err().starts_with("--to redis://…: unknown datastore scheme"));
        assert!(
            parse_as("--from", "sqlite://x.db?bogus=1").unwrap_err().starts_with("--from: unknown sqlite parameter")
        );
        let nats = parse_as("--from", "nats://h:4222?replicas=9").unwrap_err();
        assert!(nats.starts_with("--from \"nats://h:4222?replicas=9\": replicas=9"), "{nats}");
        assert!(!nats.contains("--endpoint"), "{nats}");
    }

    /// Errors show the endpoint without its password or token.
    #[test]
    fn errors_hide_credentials() {
        for (endpoint, expected) in [
            ("nats://admin:s3cret@h:4222?noEmbed&bogus=1", "nats://admin:***@h:4222?noEmbed&bogus=1"),
            ("nats://s3cret@h:4222?noEmbed&replicas=9", "nats://***@h:4222?noEmbed&replicas=9"),
            ("nats://a:s3cret@h1,nats://h2?noEmbed&dataDir=/x", "nats://a:***@h1,nats://h2?noEmbed&dataDir=/x"),
            ("admin:s3cret@tcp(db:3306)/kine", "admin:***@tcp(db:3306)/kine"),
        ] {
            let e = parse(endpoint).unwrap_err();
            assert!(!e.contains("s3cret") && e.contains(expected), "{e}");
        }
        assert_eq!(
            shown("postgres://u:p@ss/w@db:5432/k?sslmode=disable"),
            "postgres://u:***@db:5432/k?sslmode=disable"
        );
        assert_eq!(shown("mysql://u:pw@tcp(db:3306)/k?x=a@b"), "mysql://u:***@tcp(db:3306)/k?x=a@b");
        assert_eq!(shown("sqlite://./db/state.db"), "sqlite://./db/state.db");
        assert_eq!(shown("nats://u:pa,ss@h1:4222,nats://h2"), "nats://u:***@h1:4222,nats://h2");
    }

    #[cfg(feature = "embedded-nats")]
    #[test]
    fn embedded_nats_endpoints() {
        let nats = |s: &str| match parse(s) {
            Ok(Endpoint::Nats(cfg)) => *cfg,
            other => panic!("{s}: {other:?}"),
        };
        assert!(wants_embedded(&nats("nats://")));
        assert!(wants_embedded(&nats("nats://0.0.0.0:4222?dataDir=/var/lib/kine&stdoutLogging")));
        assert!(wants_embedded(&nats("nats://?dontListen")));
        assert!(!wants_embedded(&nats("nats://h:4222?noEmbed")));
        assert!(parse("nats://h1,nats://h2").unwrap_err().contains("binds one address"));
        assert!(parse("nats://?contextFile=/x").unwrap_err().contains("add noEmbed"));
        assert!(parse("nats://h?noEmbed&serverConfig=/x").unwrap_err().contains("but noEmbed is set"));
    }

    #[cfg(not(feature = "embedded-nats"))]
    #[test]
    fn without_embedded_nats_a_host_means_an_external_server() {
        assert!(parse("nats://").unwrap_err().contains("built without the embedded NATS server"));
        assert!(parse("nats://h?dataDir=/x").unwrap_err().contains("built without one"));
        match parse("nats://h:4222") {
            Ok(Endpoint::Nats(cfg)) => assert!(!wants_embedded(&cfg)),
            other => panic!("{other:?}"),
        }
    }
}
