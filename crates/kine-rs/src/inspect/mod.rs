//! `kine-rs inspect`: reads a datastore without changing it — a stopped data directory, or one
//! a kine-rs is serving at the same time — and prints its keys, a key's history, or what
//! changed between two revisions (docs/operations.md, "Inspecting a datastore").
//!
//! The datastore is opened read-only (`open.rs`): nothing is created, migrated or written.
//! Every read goes through the [`Backend`] trait, as a server's do.

mod open;
mod print;

pub use crate::cli::inspect::{InspectCommand, Output};
pub use open::{NatsSource, ReadOnly, nats_source, open_read_only};

use crate::cli::Cli;
use anyhow::{Context, Result, bail};
use kine_core::backend::Backend;
use kine_core::lock::prefix_range;
use kine_core::pages::Pager;
use kine_core::request::RangeRequest;
use kine_core::{EventKind, KeyRange, Revision};
use print::Printer;

/// Revisions of history read per request.
const WINDOW: Revision = 10_000;

pub async fn run(cli: &Cli, output: Output, command: &InspectCommand) -> Result<()> {
    let opened = open_read_only("--endpoint", &cli.endpoint, cli).await?;
    let backend = opened.backend();
    let mut out = Printer::new(output);
    let result = match command {
        InspectCommand::Status => status(backend, &mut out).await,
        InspectCommand::List { prefix, revision, values } => {
            list(backend, &mut out, range_of(prefix.as_deref()), *revision, *values).await
        }
        InspectCommand::Get { key, revision } => get(backend, &mut out, key, *revision).await,
        InspectCommand::History { key, prefix, values } => {
            let range = if *prefix { prefix_range(key.as_bytes().to_vec()) } else { KeyRange::single(key.as_str()) };
            history(backend, &mut out, range, *values).await
        }
        InspectCommand::Diff { from, to, prefix } => {
            diff(backend, &mut out, range_of(prefix.as_deref()), *from, *to).await
        }
    };
    let result = result.and_then(|()| out.flush().context("write to stdout"));
    opened.close().await;
    match result {
        // `kine-rs inspect list | head`: the reader has what it wanted.
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) => {
            Ok(())
        }
        other => other,
    }
}

fn range_of(prefix: Option<&str>) -> KeyRange {
    match prefix {
        Some(p) if !p.is_empty() => prefix_range(p.as_bytes().to_vec()),
        _ => KeyRange::all(),
    }
}

async fn status(backend: &dyn Backend, out: &mut Printer) -> Result<()> {
    let e = |e: kine_core::Error| anyhow::anyhow!("{e}");
    let revs = backend.revisions().await.map_err(e)?;
    let mut count = RangeRequest::new(KeyRange::all());
    count.count_only = true;
    count.revision = revs.current;
    let keys = backend.range(count).await.map_err(e)?.value.count;
    let leases = backend.leases().await.map_err(e)?.len();
    let size = backend.status().await.map_err(e)?;
    out.fields(&[
        ("revision", revs.current.into()),
        ("compact_revision", revs.compacted.into()),
        ("keys", keys.into()),
        ("leases", leases.into()),
        ("db_size", size.db_size.into()),
        ("db_size_in_use", size.db_size_in_use.into()),
        ("cluster_id", backend.cluster_id().into()),
    ])?;
    Ok(())
}

async fn list(
    backend: &dyn Backend,
    out: &mut Printer,
    range: KeyRange,
    revision: Revision,
    values: bool,
) -> Result<()> {
    let mut keys = Pager::new(backend, range, revision);
    while let Some(kv) = keys.next().await? {
        out.kv(&kv, values)?;
    }
    Ok(())
}

async fn get(backend: &dyn Backend, out: &mut Printer, key: &str, revision: Revision) -> Result<()> {
    match Pager::new(backend, KeyRange::single(key), revision).next().await? {
        Some(kv) => Ok(out.kv(&kv, true)?),
        None => bail!(
            "key {key:?} not found at {}",
            if revision > 0 { format!("revision {revision}") } else { "the current revision".into() }
        ),
    }
}

async fn history(backend: &dyn Backend, out: &mut Printer, range: KeyRange, values: bool) -> Result<()> {
    let revs = backend.revisions().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    // Below the compact revision only each key's version at it is kept.
    if revs.compacted > 0 {
        let mut kept = Pager::new(backend, range.clone(), revs.compacted);
        while let Some(kv) = kept.next().await? {
            out.change(kv.mod_revision, "PUT", &kv, values)?;
        }
    }
    let mut after = revs.compacted.max(0);
    while after < revs.current {
        let until = (after + WINDOW).min(revs.current);
        for changes in backend.events(&range, after, until).await.map_err(|e| anyhow::anyhow!("{e}"))? {
            for event in changes.events {
                let kind = if event.kind == EventKind::Put { "PUT" } else { "DELETE" };
                out.change(changes.revision, kind, &event.kv, values)?;
            }
        }
        after = until;
    }
    Ok(())
}

async fn diff(backend: &dyn Backend, out: &mut Printer, range: KeyRange, from: Revision, to: Revision) -> Result<()> {
    if from <= 0 || to <= 0 {
        bail!("diff needs two revisions greater than 0");
    }
    let (mut a, mut b) = (Pager::new(backend, range.clone(), from), Pager::new(backend, range, to));
    let (mut left, mut right) = (a.next().await?, b.next().await?);
    let (mut created, mut deleted, mut changed) = (0u64, 0u64, 0u64);
    loop {
        match (&left, &right) {
            (None, None) => break,
            (Some(l), Some(r)) if l.key == r.key => {
                if l.mod_revision != r.mod_revision {
                    changed += 1;
                    out.difference("changed", &l.key, Some(l), Some(r))?;
                }
                (left, right) = (a.next().await?, b.next().await?);
            }
            (Some(l), r) if r.as_ref().is_none_or(|r| l.key < r.key) => {
                deleted += 1;
                out.difference("deleted", &l.key, Some(l), None)?;
                left = a.next().await?;
            }
            (_, Some(r)) => {
                created += 1;
                out.difference("created", &r.key, None, Some(r))?;
                right = b.next().await?;
            }
            (Some(_), None) => unreachable!("handled by the arm before"),
        }
    }
    out.flush()?;
    eprintln!("{created} created, {deleted} deleted, {changed} changed between revisions {from} and {to}");
    Ok(())
}
