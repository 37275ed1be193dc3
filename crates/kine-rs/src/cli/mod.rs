//! Command-line flags, compatible with kine's names; each also reads a `KINE_*` variable.

pub mod inspect;
pub mod s3;

use clap::{CommandFactory, FromArgMatches, Parser};
use kine_core::duration;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

fn parse_duration(s: &str) -> Result<Duration, String> {
    duration::parse(s)
}

/// An etcd version, `MAJOR.MINOR.PATCH` (3.5 or newer: kube-apiserver needs 3.5.13 at least for
/// watch progress requests, and kine-rs serves etcd 3.5's API and more).
fn parse_etcd_version(text: &str) -> Result<String, String> {
    match kine_server::EtcdVersion::parse(text) {
        Some(v) if v >= kine_server::EtcdVersion(3, 5, 0) => Ok(text.to_string()),
        Some(_) => Err(format!("{text} is older than etcd 3.5, whose API kine-rs serves")),
        None => Err(format!("{text} is not an etcd version such as 3.7.3")),
    }
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration::parse(s)?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "kine-rs",
    version = crate::version::LONG,
    about = "An etcd v3 API server on SQLite and other datastores, compatible with kine"
)]
pub struct Cli {
    /// Address to serve the etcd API on: host:port, or unix://PATH for a unix socket (mode 0600)
    #[arg(long, env = "KINE_LISTEN_ADDRESS", default_value = "0.0.0.0:2379")]
    pub listen_address: String,

    /// Datastore URL (empty: SQLite at ./db/state.db); `--help` lists every form
    ///
    /// Forms:
    ///   (empty)                      SQLite at ./db/state.db
    ///   sqlite://PATH                SQLite at PATH
    ///   memory://                    in memory; nothing survives a restart
    ///   postgres://USER:PASS@HOST:PORT/DB[?sslmode=…]   PostgreSQL (or postgresql://)
    ///   mysql://USER:PASS@tcp(HOST:PORT)/DB             MySQL/MariaDB (or mysql://USER:PASS@HOST:PORT/DB)
    ///   nats://[?dataDir=…&serverConfig=…]              NATS JetStream on the nats-server embedded
    ///                                                   in this process (cargo feature embedded-nats)
    ///   nats://HOST:PORT[,nats://HOST2:PORT]?noEmbed    NATS JetStream on an external server or cluster
    ///   nats://…?bucket=COPY&mirror=BUCKET              a read-only copy of another kine-rs bucket
    /// Parameters of each: README.md ("Backends"), docs/sql.md, docs/nats.md.
    #[arg(long, env = "KINE_ENDPOINT", default_value = "", verbatim_doc_comment)]
    pub endpoint: String,

    /// CA file for verifying the datastore's TLS certificate (network datastores)
    #[arg(long, env = "KINE_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate for the datastore connection (network datastores)
    #[arg(long, env = "KINE_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Client key for the datastore connection (network datastores)
    #[arg(long, env = "KINE_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Do not verify the datastore's TLS certificate (network datastores)
    #[arg(long, env = "KINE_SKIP_VERIFY")]
    pub skip_verify: bool,

    /// Certificate for serving the etcd API over TLS
    #[arg(long, env = "KINE_SERVER_CERT_FILE")]
    pub server_cert_file: Option<PathBuf>,
    /// Key for serving the etcd API over TLS
    #[arg(long, env = "KINE_SERVER_KEY_FILE")]
    pub server_key_file: Option<PathBuf>,
    /// CA that etcd clients' certificates must be signed by (enables client-certificate auth)
    #[arg(long, env = "KINE_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    #[command(flatten)]
    pub s3: s3::S3Args,

    /// etcd's --name: this node's name in MemberList (every node serving the datastore is listed)
    #[arg(long, env = "KINE_NAME", default_value = "kine-rs")]
    pub name: String,

    /// etcd's --auth-token: how Authenticate's tokens are made. "simple" (the default; kine-rs's
    /// simple tokens are signed, so every node on the datastore accepts them), or
    /// "jwt,sign-method=RS256,pub-key=FILE,priv-key=FILE[,ttl=5m]" (etcd's options; a node with
    /// only pub-key verifies tokens and cannot issue them)
    #[arg(long, env = "KINE_AUTH_TOKEN", default_value = "simple", value_parser = parse_auth_token)]
    pub auth_token: kine_core::auth::jwt::TokenKind,
    /// etcd's --auth-token-ttl: seconds a simple token stays valid after its last use
    #[arg(long, env = "KINE_AUTH_TOKEN_TTL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub auth_token_ttl: u64,
    /// etcd's --bcrypt-cost: cost of the bcrypt hashes of user passwords (4 to 31)
    #[arg(long, env = "KINE_BCRYPT_COST", default_value_t = 10, value_parser = clap::value_parser!(u32).range(4..=31))]
    pub bcrypt_cost: u32,

    /// Interval of watch progress notifications (must be > 0)
    #[arg(long, env = "KINE_WATCH_PROGRESS_NOTIFY_INTERVAL", default_value = "5s", value_parser = parse_positive_duration)]
    pub watch_progress_notify_interval: Duration,

    /// etcd version reported by Maintenance.Status (kube-apiserver enables features by it); below
    /// 3.7, RangeStream is not served, as etcd 3.6 does not
    #[arg(long, env = "KINE_EMULATED_ETCD_VERSION", default_value = "3.7.3", value_parser = parse_etcd_version)]
    pub emulated_etcd_version: String,

    /// Automatic compaction period; 0 leaves compaction to clients (kube-apiserver compacts)
    #[arg(long, env = "KINE_COMPACT_INTERVAL", default_value = "0", value_parser = parse_duration)]
    pub compact_interval: Duration,
    /// Automatic compaction never removes the newest N revisions
    #[arg(long, env = "KINE_COMPACT_MIN_RETAIN", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(0..))]
    pub compact_min_retain: i64,
    /// Revisions compacted per step of an automatic compaction
    #[arg(long, env = "KINE_COMPACT_BATCH_SIZE", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    pub compact_batch_size: i64,
    /// Time limit of one automatic compaction run (it resumes at the next interval)
    #[arg(long, env = "KINE_COMPACT_TIMEOUT", default_value = "5s", value_parser = parse_positive_duration)]
    pub compact_timeout: Duration,
    /// Longest a datastore operation may take before the request fails with etcd's "request
    /// timed out" (Unavailable); unlimited ranges and watch catch-up get ten times as long
    /// (0 = no limit)
    #[arg(long, env = "KINE_REQUEST_TIMEOUT", default_value = "7s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Largest write request accepted, in bytes (as etcd's --max-request-bytes)
    #[arg(long, env = "KINE_MAX_REQUEST_BYTES", default_value_t = 1_572_864, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_request_bytes: u64,
    /// Largest Range or Txn response, in bytes: a larger one fails with ResourceExhausted
    /// `grpc: trying to send message larger than max` once that much is read, as etcd's gRPC
    /// server refuses it (etcd's limit, the default, is 2147483647)
    #[arg(long, env = "KINE_MAX_RESPONSE_BYTES", default_value_t = 2_147_483_647, value_parser = clap::value_parser!(u64).range(1..=2_147_483_647))]
    pub max_response_bytes: u64,

    /// Idle pooled connections kept per node (SQL datastores; 0 = 20, negative = none)
    #[arg(long, env = "KINE_DATASTORE_MAX_IDLE_CONNECTIONS", default_value_t = 0, allow_negative_numbers = true)]
    pub datastore_max_idle_connections: i64,
    /// Pooled connections open at once per node (SQL datastores; 0 = as many as kept idle,
    /// negative = no limit)
    #[arg(long, env = "KINE_DATASTORE_MAX_OPEN_CONNECTIONS", default_value_t = 0, allow_negative_numbers = true)]
    pub datastore_max_open_connections: i64,
    /// Pooled connections are closed after this age (SQL datastores; 0 = never)
    #[arg(long, env = "KINE_DATASTORE_CONNECTION_MAX_LIFETIME", default_value = "0", value_parser = parse_duration)]
    pub datastore_connection_max_lifetime: Duration,
    /// Idle pooled connections are closed after this long (SQL datastores; 0 = never)
    #[arg(long, env = "KINE_DATASTORE_CONNECTION_MAX_IDLE_TIME", default_value = "2m", value_parser = parse_duration)]
    pub datastore_connection_max_idle_time: Duration,

    /// Address of the Prometheus /metrics and /health listener (host:port; ":8080" = every
    /// interface; "0" disables it)
    #[arg(long, env = "KINE_METRICS_BIND_ADDRESS", default_value = ":8080")]
    pub metrics_bind_address: String,

    /// Serve /metrics and /health in plain HTTP even when --server-cert-file is set
    #[arg(long, env = "KINE_METRICS_IGNORE_TLS_CONFIG")]
    pub metrics_ignore_tls_config: bool,

    /// kine's Go profiling endpoints (/debug/pprof); kine-rs has none and says so at start-up
    #[arg(long, env = "KINE_METRICS_ENABLE_PROFILING")]
    pub metrics_enable_profiling: bool,

    /// Backend operations slower than this are logged (info) with what they touched (0 = never)
    #[arg(long, env = "KINE_SLOW_SQL_THRESHOLD", default_value = "1s", value_parser = parse_duration)]
    pub slow_sql_threshold: Duration,

    /// Backend operations slower than this are logged as warnings (0 = never)
    #[arg(long, env = "KINE_SLOW_SQL_WARNING_THRESHOLD", default_value = "5s", value_parser = parse_duration)]
    pub slow_sql_warning_threshold: Duration,

    /// Log format: plain or json
    #[arg(long, env = "KINE_LOG_FORMAT", default_value = "plain", value_parser = ["plain", "json"])]
    pub log_format: String,

    /// Log at debug level (RUST_LOG, when set, takes precedence)
    #[arg(long, env = "KINE_DEBUG")]
    pub debug: bool,

    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The process's arguments; a mistake ends the process with clap's message (status 2).
    pub fn from_args() -> Cli {
        Self::try_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// `args` (the program's name first). The flags of the whole program (every flag above: the
    /// datastore, TLS, S3, logging…) are taken before or after the subcommand, as etcdutl takes
    /// them (`kine-rs snapshot restore FILE --endpoint sqlite://…` and `kine-rs --endpoint
    /// sqlite://… snapshot restore FILE` are the same), with the same `KINE_*` variables; one
    /// given both before and after the subcommand is an error naming it.
    pub fn try_from<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut command = command();
        let matches = command.try_get_matches_from_mut(args.iter().cloned())?;
        if let Some(name) = given_before_and_after(&command, &args) {
            let sub = matches.subcommand_name().unwrap_or("the subcommand");
            let message = format!("--{name} is given both before and after the subcommand {sub}; give it once\n");
            return Err(clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, message).with_cmd(&command));
        }
        Cli::from_arg_matches(&matches)
    }
}

/// The command line as clap reads it: the program's flags global, so that every subcommand
/// (and theirs) takes them too.
pub fn command() -> clap::Command {
    Cli::command().mut_args(|arg| if arg.is_positional() { arg } else { arg.global(true) })
}

/// The long name of a program flag that `args` gives before the subcommand and again after it,
/// if any. (clap would take the later silently.) The program has no positional arguments of its
/// own, so the subcommand is the first word that is neither a flag nor a flag's value.
fn given_before_and_after(command: &clap::Command, args: &[OsString]) -> Option<String> {
    let takes_value = |name: &str| {
        command.get_arguments().find(|a| a.get_long() == Some(name)).map(|a| a.get_action().takes_values())
    };
    let long = |word: &str| word.strip_prefix("--").map(|w| w.split('=').next().unwrap_or(w).to_string());
    let words: Vec<String> = args.iter().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    let mut before = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        if word == "--" || !word.starts_with('-') {
            break;
        }
        i += 1;
        if let Some(name) = long(word).filter(|n| !n.is_empty()) {
            if takes_value(&name) == Some(true) && !word.contains('=') {
                i += 1;
            }
            before.push(name);
        }
    }
    words
        .get(i + 1..)?
        .iter()
        .take_while(|w| *w != "--")
        .filter_map(|w| long(w))
        .find(|name| before.contains(name) && takes_value(name).is_some())
}

/// Something other than serving.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// Snapshots taken with `etcdctl snapshot save` from kine-rs or from etcd (etcd's bbolt format)
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Copies a whole store into another datastore with its revisions (resumable, verified at
    /// the end), then exits
    Migrate {
        /// The datastore to copy (sqlite://, postgres://, mysql://), read only; kine-rs may
        /// serve it meanwhile
        #[arg(long)]
        from: String,
        /// The datastore to copy into (sqlite://, postgres://, mysql://): empty, or an earlier
        /// copy of --from to continue or bring up to date; no kine-rs may serve it meanwhile
        #[arg(long)]
        to: String,
        /// Copy only the keys at --from's current revision (with their revisions), not the
        /// history since its compaction
        #[arg(long)]
        current_only: bool,
        /// Write --to as Go kine's table (a new SQLite file, or a PostgreSQL or MySQL database
        /// without one), for Go kine v0.17 to serve with the same revisions
        #[arg(long, conflicts_with = "current_only")]
        to_go_kine: bool,
        /// Read both sides and print what the copy would do (keys, history, leases, what --to
        /// holds); nothing is written
        #[arg(long)]
        dry_run: bool,
    },
    /// Restores the store kept in S3 (--s3-bucket, --s3-folder …) into a new SQLite database
    /// (--endpoint sqlite://PATH), up to its newest revision or a past one, then exits; the
    /// bucket is only read
    S3Restore {
        /// The revision to restore up to (default: the newest shipped)
        #[arg(long)]
        revision: Option<i64>,
    },
    /// Prints a shell completion script for kine-rs (bash, zsh, fish, elvish, powershell)
    ///
    /// bash: `kine-rs completions bash > /etc/bash_completion.d/kine-rs`;
    /// zsh: into a directory of $fpath as `_kine-rs`; fish: `~/.config/fish/completions/kine-rs.fish`
    Completions {
        /// The shell to complete in
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Writes kine-rs's manual pages (kine-rs.1 and one per subcommand), generated from these
    /// flags; without --dir prints kine-rs.1
    Man {
        /// Directory to write every page into (created if missing)
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Asks the kine-rs running here for its /health (on --metrics-bind-address), for container
    /// health checks; exits 0 when it is healthy
    Health,
    /// Reads the datastore --endpoint names without changing it (stopped, or served meanwhile):
    /// keys, values, a key's history, what changed between two revisions
    Inspect {
        /// text: tab-separated with a header, unprintable bytes escaped; json: one object per
        /// line, keys and values in base64 (as `etcdctl -w json`)
        #[arg(long, value_enum, default_value = "text")]
        output: inspect::Output,
        #[command(subcommand)]
        what: inspect::InspectCommand,
    },
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum SnapshotCommand {
    /// Writes a snapshot into a new datastore (sqlite://PATH given with --endpoint), then exits
    Restore {
        /// The file `etcdctl snapshot save` wrote (from kine-rs or etcd), or an etcd member's
        /// `member/snap/db`
        file: PathBuf,
    },
}

/// `--auth-token`: etcd's `TYPE[,OPTION=VALUE...]` (key files are read here).
fn parse_auth_token(s: &str) -> Result<kine_core::auth::jwt::TokenKind, String> {
    kine_core::auth::jwt::TokenKind::parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_from(std::iter::once("kine-rs").chain(args.iter().copied()))
    }

    /// A value for each program flag, other than its default (a flag added without one here fails
    /// the test below).
    fn value(long: &str, hs256_key: &std::path::Path) -> Option<String> {
        if long == "auth-token" {
            return Some(format!("jwt,sign-method=HS256,priv-key={}", hs256_key.display()));
        }
        Some(
            match long {
                "listen-address" => "127.0.0.1:12379",
                "endpoint" => "sqlite://elsewhere.db",
                "ca-file" | "cert-file" | "key-file" | "server-cert-file" | "server-key-file" | "trusted-ca-file"
                | "s3-ca-bundle" => "/some/file.pem",
                "name" => "node-7",
                "auth-token-ttl" | "bcrypt-cost" | "compact-min-retain" | "compact-batch-size" => "7",
                "max-request-bytes" | "max-response-bytes" | "s3-checkpoint-segments" => "77",
                "datastore-max-idle-connections" | "datastore-max-open-connections" => "-1",
                "watch-progress-notify-interval"
                | "compact-interval"
                | "compact-timeout"
                | "request-timeout"
                | "datastore-connection-max-lifetime"
                | "datastore-connection-max-idle-time"
                | "slow-sql-threshold"
                | "slow-sql-warning-threshold"
                | "s3-ship-interval"
                | "s3-checkpoint-interval"
                | "s3-lock-lease" => "9s",
                "emulated-etcd-version" => "3.6.5",
                "metrics-bind-address" => "0",
                "log-format" => "json",
                "s3-bucket" | "s3-folder" | "s3-endpoint" | "s3-region" | "s3-access-key" | "s3-secret-key"
                | "s3-session-token" => "some-text",
                _ => return None,
            }
            .to_string(),
        )
    }

    const SUBCOMMANDS: &[&[&str]] = &[
        &["snapshot", "restore", "etcd.db"],
        &["inspect", "status"],
        &["inspect", "--output", "json", "list", "/a", "--revision", "3"],
        &["inspect", "get", "k"],
        &["inspect", "history", "k", "--prefix"],
        &["inspect", "diff", "1", "2"],
        &["migrate", "--from", "sqlite://a.db", "--to", "sqlite://b.db"],
        &["s3-restore", "--revision", "5"],
        &["completions", "bash"],
        &["man", "--dir", "pages"],
    ];

    /// Every program flag is taken before and after every subcommand, to the same effect (and
    /// an effect: the result differs from the defaults).
    #[test]
    fn program_flags_go_before_or_after_every_subcommand() {
        let dir = kine_testkit::TempDir::new("cli");
        let key = dir.path().join("hs256.key");
        std::fs::write(&key, b"a secret of 32 bytes or more, for HS256").unwrap();
        let command = command();
        let flags: Vec<(String, Option<String>)> = command
            .get_arguments()
            .filter(|a| !a.is_positional() && a.is_global_set())
            .map(|a| {
                let long = a.get_long().expect("a long name").to_string();
                let takes = a.get_action().takes_values();
                let v = takes.then(|| value(&long, &key).unwrap_or_else(|| panic!("no test value for --{long}")));
                (long, v)
            })
            .collect();
        assert!(flags.len() > 40, "{}", flags.len());
        for sub in SUBCOMMANDS {
            let plain = format!("{:?}", parse(sub).unwrap());
            for (long, v) in &flags {
                let mut flag = vec![format!("--{long}")];
                flag.extend(v.clone());
                let joined: Vec<&str> = flag.iter().map(String::as_str).collect();
                let before: Vec<&str> = joined.iter().chain(sub.iter()).copied().collect();
                let after: Vec<&str> = sub.iter().chain(joined.iter()).copied().collect();
                let before = format!("{:?}", parse(&before).unwrap_or_else(|e| panic!("{before:?}: {e}")));
                let after = format!("{:?}", parse(&after).unwrap_or_else(|e| panic!("{after:?}: {e}")));
                assert_eq!(before, after, "--{long} with {sub:?}");
                assert_ne!(before, plain, "--{long} with {sub:?} changed nothing");
            }
        }
        // `--flag=value` after the subcommand too.
        let cli = parse(&["snapshot", "restore", "etcd.db", "--endpoint=sqlite://x.db"]).unwrap();
        assert_eq!(cli.endpoint, "sqlite://x.db");
    }

    #[test]
    fn a_flag_before_and_after_the_subcommand_is_an_error_naming_it() {
        for args in [
            &["--endpoint", "sqlite://a.db", "snapshot", "restore", "f", "--endpoint", "sqlite://b.db"][..],
            &["--endpoint=sqlite://a.db", "inspect", "list", "--endpoint=sqlite://a.db"],
            &["--debug", "inspect", "status", "--debug"],
            &["--s3-bucket", "b", "s3-restore", "--s3-bucket", "c"],
            &["--log-format", "json", "migrate", "--from", "sqlite://a", "--to", "sqlite://b", "--log-format", "plain"],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{args:?}");
            let name = args[0].split('=').next().unwrap();
            assert!(e.to_string().contains(&format!("{name} is given both before and after the subcommand")), "{e}");
        }
        // Twice on one side: clap's own error.
        let e = parse(&["inspect", "status", "--endpoint", "a", "--endpoint", "b"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert!(e.to_string().contains("--endpoint"), "{e}");
        // A subcommand's value that looks like a flag is not one.
        parse(&["--endpoint", "sqlite://a.db", "inspect", "get", "--", "--endpoint"]).unwrap();
    }
}
