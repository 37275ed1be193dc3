//! The request/response workloads. Every client runs one loop until the deadline; an
//! operation's latency is recorded when it succeeds, an error is counted (and the client pauses
//! briefly) otherwise. The watch workload is in `watch.rs`.

use crate::keys::{Rng, Shape};
use crate::stats::Stats;
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Params {
    pub shape: Shape,
    /// Keys of the preloaded key space (`shape.key(0..keys)`).
    pub keys: u64,
    /// Value size (`--value-bytes`): the shape's default when not given.
    pub value_bytes: Option<usize>,
    /// List page size.
    pub limit: i64,
    pub serializable: bool,
    /// This run's number, part of the keys that `create` makes (unique across runs).
    pub run: u64,
}

impl Params {
    fn key(&self, i: u64) -> String {
        self.shape.key(i)
    }

    fn value(&self, key: u64, iteration: u64) -> Vec<u8> {
        self.shape.value(self.value_bytes, key, iteration)
    }
}

async fn timed<T, E>(stats: &mut Stats, f: impl Future<Output = Result<T, E>>) -> Option<T> {
    let start = Instant::now();
    match f.await {
        Ok(v) => {
            stats.record(start.elapsed());
            Some(v)
        }
        Err(_) => {
            stats.errors += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            None
        }
    }
}

/// Puts of new keys, unique per client.
pub async fn put(mut c: Client, id: u64, p: Params, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut i = 0;
    while Instant::now() < deadline {
        timed(&mut stats, c.put(format!("/bench/p/{id}/{i}"), p.value(i, id), None)).await;
        i += 1;
    }
    stats
}

/// Creates of new keys, unique per client and run, the way kube-apiserver creates an object
/// (etcd's `kubernetes.Client.OptimisticPut` with revision 0): a Txn that puts only if the
/// key's mod revision is 0, i.e. it does not exist. Go kine accepts no other compare for a
/// create (a create_revision compare fails there).
pub async fn create(mut c: Client, id: u64, p: Params, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut i = 0;
    while Instant::now() < deadline {
        let k = p.shape.new_key(p.run, id, i);
        let put = TxnOp::put(k.as_str(), p.value(i, id), None);
        let txn = Txn::new().when([Compare::mod_revision(k.as_str(), CompareOp::Equal, 0)]).and_then([put]);
        // The keys are new: a failed compare means the bench reused one, which is an error.
        if let Some(r) = timed(&mut stats, c.txn(txn)).await
            && !r.succeeded()
        {
            stats.errors += 1;
        }
        i += 1;
    }
    stats
}

/// Gets of random preloaded keys.
pub async fn get(mut c: Client, id: u64, p: Params, deadline: Instant) -> Stats {
    let (mut stats, mut rng) = (Stats::default(), Rng::new(id + 1));
    let options = || p.serializable.then(|| GetOptions::new().with_serializable());
    while Instant::now() < deadline {
        let k = p.key(rng.below(p.keys));
        if let Some(r) = timed(&mut stats, c.get(k, options())).await {
            stats.items += r.kvs().len() as u64;
        }
    }
    stats
}

/// Read-modify-write of random preloaded keys, the way kube-apiserver updates an object: a
/// get, then a Txn that puts only if the key's mod revision is still the one read (else gets
/// it). One operation = both requests.
pub async fn cas(mut c: Client, id: u64, p: Params, deadline: Instant) -> Stats {
    let (mut stats, mut rng) = (Stats::default(), Rng::new(id + 1));
    let mut n = 0;
    while Instant::now() < deadline {
        let i = rng.below(p.keys);
        let k = p.key(i);
        n += 1;
        let start = Instant::now();
        match get_then_txn(&mut c, &k, TxnOp::put(k.as_str(), p.value(i, n), None)).await {
            Some((_, succeeded)) => {
                stats.record(start.elapsed());
                if !succeeded {
                    stats.conflicts += 1;
                }
            }
            None => stats.errors += 1,
        }
    }
    stats
}

/// kube-apiserver's conditional write of one key: a get, then a Txn doing `op` only if the
/// key's mod revision is still the one read (else getting the key). Returns the revision read
/// and whether the Txn's compare held; `None` if either request failed.
async fn get_then_txn(c: &mut Client, k: &str, op: TxnOp) -> Option<(i64, bool)> {
    let rev = c.get(k, None).await.ok()?.kvs().first().map_or(0, |kv| kv.mod_revision());
    let txn = Txn::new()
        .when([Compare::mod_revision(k, CompareOp::Equal, rev)])
        .and_then([op])
        .or_else([TxnOp::get(k, None)]);
    Some((rev, c.txn(txn).await.ok()?.succeeded()))
}

/// Creates the keys `delete` removes: client `id`'s share of `--keys` new keys (`new_key` of
/// this run, outside the preloaded prefix), before the clock starts.
pub async fn delete_setup(mut c: Client, id: u64, clients: u64, p: Params) -> anyhow::Result<()> {
    let mut i = id;
    while i < p.keys {
        c.put(p.shape.new_key(p.run, 0, i), p.value(i, 0), None).await?;
        i += clients;
    }
    Ok(())
}

/// Deletes of the keys `delete_setup` made, the way kube-apiserver deletes an object: a get,
/// then a Txn that deletes only if the key's mod revision is still the one read (else gets
/// it). One operation = both requests; a client stops when its keys are gone.
pub async fn delete(mut c: Client, id: u64, clients: u64, p: Params, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut i = id;
    while i < p.keys && Instant::now() < deadline {
        let k = p.shape.new_key(p.run, 0, i);
        i += clients;
        let start = Instant::now();
        match get_then_txn(&mut c, &k, TxnOp::delete(k.as_str(), None)).await {
            // Nobody else touches these keys: a failed compare or a missing key is an error.
            Some((rev, true)) if rev > 0 => stats.record(start.elapsed()),
            _ => stats.errors += 1,
        }
    }
    stats
}

/// Paginated reads of the preloaded prefix (`limit` keys a page, from a random key), as
/// kube-apiserver lists. One operation = one page.
pub async fn list(mut c: Client, id: u64, p: Params, deadline: Instant) -> Stats {
    let (mut stats, mut rng) = (Stats::default(), Rng::new(id + 1));
    while Instant::now() < deadline {
        let from = p.key(rng.below(p.keys.saturating_sub(p.limit as u64).max(1)));
        let mut options = GetOptions::new().with_range(p.shape.prefix_end()).with_limit(p.limit);
        if p.serializable {
            options = options.with_serializable();
        }
        if let Some(r) = timed(&mut stats, c.get(from, Some(options))).await {
            stats.items += r.kvs().len() as u64;
        }
    }
    stats
}

/// The whole preloaded prefix, page by page (`--limit` keys each, as kube-apiserver lists when
/// the server has no RangeStream): one operation is the whole list, its latency the time to the
/// last page.
pub async fn list_all(mut c: Client, _id: u64, p: Params, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    while Instant::now() < deadline {
        let started = Instant::now();
        let (mut from, mut items, mut revision) = (p.shape.prefix().as_bytes().to_vec(), 0, 0);
        let done = loop {
            let mut options = GetOptions::new().with_range(p.shape.prefix_end()).with_limit(p.limit);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            match c.get(from.clone(), Some(options)).await {
                Ok(r) => {
                    items += r.kvs().len() as u64;
                    revision = r.header().map_or(0, |h| h.revision());
                    match (r.more(), r.kvs().last()) {
                        (true, Some(last)) => {
                            from = last.key().to_vec();
                            from.push(0);
                        }
                        _ => break true,
                    }
                }
                Err(_) => break false,
            }
        };
        if done {
            stats.record(started.elapsed());
            stats.items = items;
        } else {
            stats.errors += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stats
}

/// The whole preloaded prefix through one RangeStream (etcd 3.7): one operation is the whole
/// list, its latency the time to the last part.
pub async fn stream_all(c: Client, _id: u64, p: Params, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut kv = c.kv_client();
    while Instant::now() < deadline {
        let started = Instant::now();
        let options = GetOptions::new().with_range(p.shape.prefix_end());
        let mut items = 0;
        let done = match kv.get_stream(p.shape.prefix(), Some(options)).await {
            Ok(mut s) => loop {
                match s.message().await {
                    Ok(Some(part)) => items += part.kvs().len() as u64,
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            },
            Err(_) => false,
        };
        if done {
            stats.record(started.elapsed());
            stats.items = items;
        } else {
            stats.errors += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stats
}

/// Counts of the preloaded prefix (`count_only`), as kube-apiserver's object-count metric.
pub async fn count(mut c: Client, _id: u64, p: Params, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    while Instant::now() < deadline {
        let mut options = GetOptions::new().with_prefix().with_count_only();
        if p.serializable {
            options = options.with_serializable();
        }
        if let Some(r) = timed(&mut stats, c.get(p.shape.prefix(), Some(options))).await {
            stats.items = r.count() as u64;
        }
    }
    stats
}

/// Makes sure keys `0..keys` of the preloaded prefix exist (keys present already are skipped:
/// a bigger load extends a smaller one). Returns how many were written.
pub async fn preload(client: &Client, clients: u64, p: &Params) -> anyhow::Result<u64> {
    let count = GetOptions::new().with_prefix().with_count_only();
    let have = client.clone().get(p.shape.prefix(), Some(count)).await?.count() as u64;
    if have >= p.keys {
        return Ok(0);
    }
    let mut tasks = Vec::new();
    for t in 0..clients {
        let mut c = client.clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = have + t;
            while i < p.keys {
                let mut attempts = 0;
                while let Err(e) = c.put(p.key(i), p.value(i, 0), None::<PutOptions>).await {
                    attempts += 1;
                    if attempts > 20 {
                        return Err(anyhow::anyhow!("preload {}: {e}", p.key(i)));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                i += clients;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(p.keys - have)
}

/// Progress requests on a watch stream of its own with one watch (on a key nobody writes), each
/// waiting for the progress notification that answers it. A request still unanswered a second
/// after the deadline counts as an error and ends the client's run (a server that never answers
/// progress requests would otherwise hold the run forever).
pub async fn progress(mut c: Client, id: u64, deadline: Instant) -> Stats {
    let mut stats = Stats::default();
    let Ok(mut stream) = c.watch(format!("/bench/progress/{id}"), None).await else {
        stats.errors += 1;
        return stats;
    };
    if !matches!(stream.message().await, Ok(Some(r)) if r.created()) {
        stats.errors += 1;
        return stats;
    }
    while Instant::now() < deadline {
        let limit = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
        let answered = async {
            stream.request_progress().await?;
            loop {
                match stream.message().await? {
                    Some(r) if r.events().is_empty() && !r.created() && !r.canceled() => return Ok(()),
                    Some(_) => continue,
                    None => return Err(etcd_client::Error::WatchError("the watch stream closed".into())),
                }
            }
        };
        let answered = async {
            tokio::time::timeout(limit, answered)
                .await
                .unwrap_or_else(|_| Err(etcd_client::Error::WatchError("no progress notification".into())))
        };
        if timed(&mut stats, answered).await.is_none() && Instant::now() >= deadline {
            break;
        }
    }
    stats
}
