//! `kine-rs migrate --from URL --to URL`: copies a whole store into another datastore with
//! its revisions, so that resourceVersions, reads at past revisions and watches resuming from
//! a revision work on the copy as on the original (docs/operations.md, "Migrating between
//! datastores").
//!
//! The copy is the source's history as a client sees it: each key's version at the source's
//! compact revision (with `--current-only`, at its current revision), then every change since,
//! written through `WriteOp::Import` in batches (each one transaction), then the leases and
//! the auth record. The target's compact revision is set once the keys at that revision are
//! in, which marks where an interrupted copy stands. Running it again continues an earlier
//! copy, after checking that the target holds exactly a prefix of the source's history; it
//! also brings a finished copy up to date with what the source wrote since. The copy is then
//! verified: the digests of both histories and the hashes of both key spaces at the copied
//! revision must be equal.

mod digest;
mod dry_run;
mod etcd;
mod finish;
mod gokine;
mod gokine_nats;
mod progress;
mod target;
mod to_gokine;
mod to_nats;

use crate::cli::Cli;
use crate::endpoint::{self, Endpoint};
use crate::inspect::{NatsSource, ReadOnly};
use anyhow::{Context, Result, bail};
use finish::finish;
use kine_core::backend::Backend;
use kine_core::pages::Pager;
use kine_core::request::RangeRequest;
use kine_core::txn::{Import, ImportedVersion, WriteOp};
use kine_core::{Event, EventKind, KeyRange, RangeEnd, Revision};
use progress::Progress;

/// Versions written per import transaction, at most (and at most [`BATCH_BYTES`] of values).
const BATCH: usize = 1000;
const BATCH_BYTES: usize = 4 << 20;
/// Revisions of history read per request.
const WINDOW: Revision = 1000;

fn e(e: kine_core::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// How to copy (the subcommand's flags).
#[derive(Clone, Copy, Debug, Default)]
pub struct How {
    /// Only the keys at the source's current revision.
    pub current_only: bool,
    /// Into Go kine's table.
    pub to_go_kine: bool,
    /// Say what would be copied; write nothing.
    pub dry_run: bool,
}

pub async fn run(cli: &Cli, from: &str, to: &str, how: How) -> Result<()> {
    let How { current_only, to_go_kine, dry_run } = how;
    if from == to {
        bail!("--from and --to name the same datastore");
    }
    let mut go_kine = None;
    let source = if from.starts_with("http://") || from.starts_with("https://") {
        ReadOnly::new(Box::new(etcd::EtcdSource::connect(from, etcd_tls(from, cli)?).await.context("--from")?))
    } else if let Some(loaded) = go_kine_source(from, cli).await? {
        let backend = Box::new(loaded.backend);
        go_kine = Some((loaded.live, loaded.revision));
        ReadOnly::new(backend)
    } else if let Endpoint::Nats(config) = endpoint::parse_as("--from", from).map_err(anyhow::Error::msg)? {
        match crate::inspect::nats_source("--from", *config, cli).await {
            Ok(NatsSource::KineRs(source)) => source,
            // A bucket of Go kine's records (kine-rs's NATS backend refused it as Go kine's).
            Ok(NatsSource::GoKine { embedded, config, tls, .. }) => {
                let loaded = gokine_nats::load(*config, tls).await;
                crate::datastore::shutdown_embedded(embedded).await;
                let loaded = loaded.context("--from: read Go kine's bucket")?;
                go_kine = Some((loaded.live, loaded.revision));
                ReadOnly::new(Box::new(loaded.backend))
            }
            Err(err) => return Err(crate::datastore::explain_foreign("--from", from, err)),
        }
    } else {
        crate::inspect::open_read_only("--from", from, cli).await?
    };
    if dry_run {
        let result = dry_run::report(source.backend(), to, cli, current_only, to_go_kine).await;
        source.close().await;
        return result;
    }
    if to_go_kine {
        let result = back_to_go_kine(source.backend(), to, cli).await;
        source.close().await;
        return result;
    }
    let target = match target::open_unserved(to, cli).await {
        Ok(t) => t,
        Err(err) => {
            source.close().await;
            return Err(err);
        }
    };
    let mut result = copy(source.backend(), target.backend.as_ref(), current_only, target.nats).await;
    if let (Ok(()), Some((live, revision))) = (&result, &go_kine) {
        result = gokine::verify(target.backend.as_ref(), live, *revision).await;
    }
    target.close().await;
    source.close().await;
    result
}

/// `--to-go-kine`: `source` written as Go kine's table into `to`, then read back as Go kine
/// serves it and compared with `source`.
async fn back_to_go_kine(source: &dyn Backend, to: &str, cli: &Cli) -> Result<()> {
    let started = std::time::Instant::now();
    let (revision, compacted, rows) = to_gokine::write(source, go_kine_db("--to", to, cli)?).await.context("--to")?;
    let shown = endpoint::shown(to);
    let Some(back) = gokine::load(go_kine_db("--to", to, cli)?, &shown).await? else {
        bail!("--to holds no Go kine table after writing it");
    };
    if back.revision != revision {
        bail!("verification failed: Go kine would serve revision {}, --from is at {revision}", back.revision);
    }
    gokine::verify(source, &back.live, revision).await.context("verification (--from against the rows written)")?;
    tracing::info!(
        revision,
        compact_revision = compacted,
        rows,
        keys = back.live.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "written as Go kine's table and verified: Go kine serves --from's keys at their revisions"
    );
    Ok(())
}

/// The SQL datastore `endpoint` names, for Go kine's table.
fn go_kine_db(flag: &str, endpoint: &str, cli: &Cli) -> Result<kine_backend_sql::GoKineDb> {
    let pool = kine_backend_sql::PoolOptions { max_idle: 1, max_open: Some(1), ..crate::datastore::pool_options(cli) };
    let tls = crate::datastore::sql_tls(cli);
    Ok(match endpoint::parse_as(flag, endpoint).map_err(anyhow::Error::msg)? {
        Endpoint::Sqlite { path } => kine_backend_sql::GoKineDb::Sqlite(path),
        Endpoint::Postgres { url } => {
            kine_backend_sql::GoKineDb::Postgres(kine_backend_sql::PostgresOptions { url, pool, tls, stop: None })
        }
        Endpoint::Mysql { url } => {
            kine_backend_sql::GoKineDb::Mysql(kine_backend_sql::MysqlOptions { url, pool, tls, stop: None })
        }
        Endpoint::Memory | Endpoint::Nats(_) => {
            bail!("{flag}: Go kine's table is written into SQLite, PostgreSQL or MySQL")
        }
    })
}

/// Go kine's datastore at `from` (its SQL table), read into memory; `None` if `from` holds none.
async fn go_kine_source(from: &str, cli: &Cli) -> Result<Option<gokine::Loaded>> {
    if matches!(endpoint::parse_as("--from", from).map_err(anyhow::Error::msg)?, Endpoint::Memory | Endpoint::Nats(_)) {
        return Ok(None);
    }
    gokine::load(go_kine_db("--from", from, cli)?, &endpoint::shown(from)).await
}

/// TLS to an etcd at an `https://` URL: its CA from `--ca-file`, a client certificate from
/// `--cert-file` and `--key-file`.
fn etcd_tls(url: &str, cli: &Cli) -> Result<Option<tonic::transport::ClientTlsConfig>> {
    if !url.starts_with("https://") {
        return Ok(None);
    }
    let read =
        |flag: &str, path: &std::path::Path| std::fs::read(path).with_context(|| format!("{flag} {}", path.display()));
    let Some(ca) = &cli.ca_file else { bail!("--from {url}: https needs the server's CA certificate (--ca-file)") };
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read("--ca-file", ca)?));
    match (&cli.cert_file, &cli.key_file) {
        (Some(cert), Some(key)) => {
            tls = tls
                .identity(tonic::transport::Identity::from_pem(read("--cert-file", cert)?, read("--key-file", key)?));
        }
        (None, None) => {}
        _ => bail!("--cert-file and --key-file go together"),
    }
    Ok(Some(tls))
}

async fn count(b: &dyn Backend, revision: Revision) -> Result<i64> {
    let mut req = RangeRequest::new(KeyRange::all());
    req.count_only = true;
    req.revision = revision;
    Ok(b.range(req).await.map_err(e)?.value.count)
}

/// The greatest key at `revision`.
async fn last_key(b: &dyn Backend, revision: Revision) -> Result<Option<Vec<u8>>> {
    let mut req = RangeRequest::new(KeyRange::all());
    req.revision = revision;
    req.limit = 1;
    req.keys_only = true;
    req.sort_order = kine_core::request::SortOrder::Descend;
    req.sort_target = kine_core::request::SortTarget::Key;
    Ok(b.range(req).await.map_err(e)?.value.kvs.pop().map(|kv| kv.key))
}

/// Both stores hold the same history of `range` from `from` to `to`.
async fn same_history(
    source: &dyn Backend,
    target: &dyn Backend,
    range: &KeyRange,
    from: Revision,
    to: Revision,
) -> Result<bool> {
    let (a, _) = digest::history(source, range, from, to).await?;
    let (b, _) = digest::history(target, range, from, to).await?;
    Ok(a == b)
}

async fn copy(source: &dyn Backend, target: &dyn Backend, current_only: bool, nats: bool) -> Result<()> {
    let started = std::time::Instant::now();
    let s = source.revisions().await.map_err(e)?;
    if nats {
        // Revisions are stream sequences: written in revision order (`to_nats.rs`).
        to_nats::prepare(source, target, s, current_only).await?;
        return finish(source, target, s.current, started).await;
    }
    // The keys are copied at this revision, the history after it.
    let base = if current_only { s.current } else { s.compacted };
    let t = target.revisions().await.map_err(e)?;
    let fresh = t.current == 1 && t.compacted < 2 && count(target, t.current).await? == 0;
    // Where the copy of the keys at `base` starts: a key and the number of keys before it.
    let mut keys_from: Option<(Vec<u8>, u64)> = (fresh && base >= 2).then(|| (vec![0], 0));
    if !fresh {
        if t.current > s.current {
            bail!(
                "--to is at revision {}, past --from's {}: it holds another store (migrate writes into an empty \
                 datastore, or continues its own earlier copy)",
                t.current,
                s.current
            );
        }
        if base >= 2 && t.current == base && t.compacted < base {
            // An earlier copy stopped while copying the keys at `base`.
            let done = count(target, base).await? as u64;
            let start = match last_key(target, base).await? {
                Some(last) => {
                    let copied = KeyRange { start: vec![0], end: RangeEnd::Before([last.as_slice(), &[0]].concat()) };
                    if !same_history(source, target, &copied, base, base).await? {
                        bail!("--to holds keys that --from does not hold at revision {base}: it holds another store");
                    }
                    [last.as_slice(), &[0]].concat()
                }
                None => vec![0],
            };
            tracing::info!(revision = base, keys = done, "continuing an earlier copy of the keys");
            keys_from = Some((start, done));
        } else {
            let from = s.compacted.max(t.compacted);
            if from > t.current {
                bail!(
                    "--from was compacted at revision {}, past what --to holds (revision {}): the copy cannot \
                     continue; start again with an empty --to",
                    s.compacted,
                    t.current
                );
            }
            if !same_history(source, target, &KeyRange::all(), from, t.current).await? {
                bail!(
                    "--to's history up to revision {} differs from --from's: it holds another store (migrate writes \
                     into an empty datastore, or continues its own earlier copy)",
                    t.current
                );
            }
            tracing::info!(revision = t.current, "--to holds a copy of --from up to this revision; continuing");
        }
    }
    if keys_from.is_none() && fresh && base < 2 && count(source, 1).await? > 0 {
        // Changes at revision 1 (a Go kine bucket's first message): a fresh target is at
        // revision 1 already, so they go in as the keys at that revision.
        copy_keys(source, target, 1, vec![0], 0).await?;
    }
    if let Some((start, position)) = keys_from {
        copy_keys(source, target, base, start, position).await?;
        target.compact(base).await.map_err(e).context("set --to's compact revision")?;
    }
    finish(source, target, s.current, started).await
}

/// The keys at `base` from `start` on, each with its own revision; the store's revision
/// becomes `base`.
async fn copy_keys(
    source: &dyn Backend,
    target: &dyn Backend,
    base: Revision,
    start: Vec<u8>,
    position: u64,
) -> Result<()> {
    let mut progress = Progress::new("copying the keys", "keys", count(source, base).await? as u64);
    progress.advance(position);
    let mut keys = Pager::new(source, KeyRange { start, end: RangeEnd::Unbounded }, base);
    let (mut sub, mut batch, mut bytes, mut sent) = (position as usize, Vec::new(), 0, false);
    loop {
        let next = keys.next().await?;
        let end = next.is_none();
        if let Some(kv) = next {
            bytes += kv.key.len() + kv.value.len();
            batch.push(ImportedVersion {
                revision: kv.mod_revision,
                // Unique among the keys copied (several may share a revision), in key order.
                sub,
                event: Event { kind: EventKind::Put, kv, prev_kv: None },
            });
            sub += 1;
        }
        if batch.len() >= BATCH || bytes >= BATCH_BYTES || (end && (!batch.is_empty() || !sent)) {
            let n = batch.len() as u64;
            let import = Import {
                versions: std::mem::take(&mut batch),
                revision: base,
                add_leases: vec![],
                remove_leases: vec![],
            };
            target.write(WriteOp::Import(import)).await.map_err(e).context("write into --to")?;
            (bytes, sent) = (0, true);
            progress.advance(n);
        }
        if end {
            break;
        }
    }
    progress.finish();
    Ok(())
}
