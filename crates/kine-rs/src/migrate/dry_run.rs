//! `kine-rs migrate --dry-run`: what a copy would do, from reading both sides. Nothing is
//! created or written in either: the target is opened read-only (a missing SQLite file, an
//! empty database, a database without kine-rs's tables are reported as such).
//!
//! Printed on stdout; an error (a target the copy would refuse) ends the run with status 1,
//! as the copy would.

use super::{count, e, go_kine_db};
use crate::cli::Cli;
use crate::endpoint::{self, Endpoint};
use anyhow::{Result, bail};
use kine_backend_sql::GoKineLog;
use kine_core::backend::Backend;

/// What the target holds, as far as the copy is concerned.
enum Target {
    /// Nothing there yet: the copy creates it (a file, tables).
    New(String),
    /// A kine-rs store at this current revision (an earlier copy, or another store).
    Store { current: i64, compacted: i64 },
}

/// Reads `source` and `to`, prints the plan.
pub async fn report(source: &dyn Backend, to: &str, cli: &Cli, current_only: bool, to_go_kine: bool) -> Result<()> {
    let s = source.revisions().await.map_err(e)?;
    let mut base = if current_only { s.current } else { s.compacted.max(1) };
    if !to_go_kine && matches!(endpoint::parse_as("--to", to), Ok(Endpoint::Nats(_))) {
        // Into NATS: the first revision chosen, and the keys at it checked, as the copy does.
        if !current_only {
            base = super::to_nats::choose_base(source, s).await?.max(1);
        }
        super::to_nats::plan(source, base).await?;
    }
    let keys = count(source, base).await?;
    let leases = source.leases().await.map_err(e)?.len();
    println!("--from: revision {}, compacted at revision {}", s.current, s.compacted);
    println!(
        "would copy: {keys} keys at revision {base} (each with its create and mod revision), {} revisions of history \
         after it ({}), {leases} leases",
        s.current - base,
        if s.current > base { format!("{}..{}", base + 1, s.current) } else { "none".into() },
    );
    if to_go_kine {
        go_kine_target(to, cli).await?;
    } else {
        match kine_rs_target(to, cli).await? {
            Target::New(what) => println!("--to: {what}"),
            Target::Store { current, compacted } => {
                if current > s.current {
                    bail!(
                        "--to is at revision {current}, past --from's {}: it holds another store; the copy would \
                         refuse it",
                        s.current
                    );
                }
                if current == 1 {
                    println!("--to: an empty kine-rs store: the copy writes into it");
                } else if current == s.current && compacted >= base.min(current) {
                    println!(
                        "--to: a kine-rs store at revision {current}: up to date if it is a copy of --from (the copy \
                         checks its history first)"
                    );
                } else {
                    println!(
                        "--to: a kine-rs store at revision {current} (compacted at {compacted}): continued from there \
                         if its history is --from's (the copy checks it first, and refuses another store)"
                    );
                }
            }
        }
    }
    println!("nothing was written (--dry-run)");
    Ok(())
}

/// `to` for kine-rs's own schema, opened read-only.
async fn kine_rs_target(to: &str, cli: &Cli) -> Result<Target> {
    match endpoint::parse_as("--to", to).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } if !path.exists() => {
            return Ok(Target::New(format!("{} does not exist: the copy creates it", path.display())));
        }
        Endpoint::Memory => bail!("memory:// keeps nothing: there is no point copying into it"),
        Endpoint::Nats(config) if endpoint::wants_embedded(&config) => {
            let dir = config.data_dir.clone().unwrap_or_else(|| crate::endpoint::DEFAULT_NATS_DATA_DIR.into());
            if !dir.join("jetstream").is_dir() {
                return Ok(Target::New(format!(
                    "no NATS store in {}: the copy starts an embedded server there and creates the bucket (revisions \
                     written as stream sequences; the history may start at a later revision, docs/operations.md)",
                    dir.display()
                )));
            }
        }
        _ => {}
    }
    match crate::inspect::open_read_only("--to", to, cli).await {
        Ok(target) => {
            let r = target.backend().revisions().await.map_err(e);
            target.close().await;
            let r = r?;
            Ok(Target::Store { current: r.current, compacted: r.compacted })
        }
        Err(err) => {
            let text = format!("{err:#}");
            if text.contains("no kine-rs store") {
                Ok(Target::New("holds no kine-rs tables: the copy creates them".into()))
            } else if text.contains("no bucket ") && text.contains("on this NATS server") {
                Ok(Target::New("no such bucket on the NATS server: the copy creates it".into()))
            } else if text.contains("does not exist") || text.contains("Unknown database") {
                Ok(Target::New("the database does not exist: the copy creates it".into()))
            } else {
                Err(err)
            }
        }
    }
}

/// `to` for Go kine's table (`--to-go-kine`): it must not hold one.
async fn go_kine_target(to: &str, cli: &Cli) -> Result<()> {
    let db = go_kine_db("--to", to, cli)?;
    if let kine_backend_sql::GoKineDb::Sqlite(path) = &db
        && path.exists()
    {
        bail!("--to {} exists: Go kine's table is written into a new file; the copy would refuse it", path.display());
    }
    let found = tokio::task::spawn_blocking(move || -> Result<Option<i64>> {
        match GoKineLog::open(&db)? {
            Some(mut log) => Ok(Some(log.summary()?.rows)),
            None => Ok(None),
        }
    })
    .await??;
    match found {
        Some(rows) => bail!(
            "--to holds Go kine's table kine already ({rows} rows): Go kine's table is written into a new database; \
             the copy would refuse it"
        ),
        None => println!("--to: written as Go kine's table (created there), then read back and compared"),
    }
    Ok(())
}
