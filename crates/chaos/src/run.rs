//! One run: the workload on every node, a fault injected and healed on a schedule, then every
//! check, and the numbers.

use crate::faults::Fault;
use crate::history::{History, Listed};
use crate::verify::{self, Findings};
use crate::watchers::Watcher;
use crate::workload::{self, Worker, Workload, decode};
use anyhow::{Context, Result, bail};
use etcd_client::{Client, ConnectOptions, GetOptions};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// When the fault strikes: after `warmup`, `rounds` times held for `hold` then healed for `rest`.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub warmup: Duration,
    pub hold: Duration,
    pub rest: Duration,
    pub rounds: usize,
}

/// What a run did and found.
#[derive(Debug)]
pub struct Report {
    pub fault: String,
    pub nodes: usize,
    pub duration: Duration,
    pub operations: usize,
    pub acknowledged: usize,
    pub unknown: usize,
    pub errors: BTreeMap<String, u64>,
    pub compactions: u64,
    pub watch_resumes: u64,
    pub revisions: i64,
    /// The longest time any node answered nothing while its clients kept asking.
    pub longest_unavailable: Duration,
    /// The longest time from a heal to the first answer of every node.
    pub recovery: Duration,
    /// Per heal: its wall-clock time (to find it in the servers' logs) and each node's time to
    /// its first answer after it.
    pub heals: Vec<Heal>,
    pub findings: Findings,
}

/// One fault's end.
#[derive(Debug, Clone)]
pub struct Heal {
    pub at: SystemTime,
    /// Per node, the time from the heal to its first answer.
    pub recovery: Vec<Duration>,
}

impl fmt::Display for Heal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // UTC time of day, as the servers' logs print it.
        let since = self.at.duration_since(UNIX_EPOCH).unwrap_or_default();
        let (s, ms) = (since.as_secs() % 86_400, since.subsec_millis());
        write!(f, "healed {:02}:{:02}:{:02}.{ms:03} UTC, back after", s / 3600, s / 60 % 60, s % 60)?;
        for (node, r) in self.recovery.iter().enumerate() {
            write!(f, " {node}: {:.2} s", r.as_secs_f64())?;
        }
        Ok(())
    }
}

impl Report {
    /// Panics with every finding if the run did not hold.
    pub fn assert_held(&self) {
        assert!(self.findings.is_empty(), "{self}\nfindings: {:#?}", self.findings);
        assert!(self.acknowledged > 0, "{self}\nno write was acknowledged");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let f_ = &self.findings;
        write!(
            f,
            "{} | {} nodes | {:.0} s | {} ops | {} acked | {} unknown | lost {} | violations {} | watch gaps {} \
             | disorder {} | forks {} | stale lists {} | longest unavailable {:.2} s | recovery {:.2} s \
             | revisions {} | compactions {} | watch resumes {} | errors {:?} | {}",
            self.fault,
            self.nodes,
            self.duration.as_secs_f64(),
            self.operations,
            self.acknowledged,
            self.unknown,
            f_.lost_writes.len(),
            f_.violations.len(),
            f_.watch_gaps.len() + f_.watch_failures.len(),
            f_.watch_disorder.len(),
            f_.forks.len(),
            f_.stale_lists.len(),
            self.longest_unavailable.as_secs_f64(),
            self.recovery.as_secs_f64(),
            self.revisions,
            self.compactions,
            self.watch_resumes,
            self.errors,
            self.heals.iter().map(Heal::to_string).collect::<Vec<_>>().join("; ")
        )
    }
}

/// Connects to a node (retrying for up to 30 s).
pub async fn connect(url: &str) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect([url], Some(options.clone())).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => bail!("connect to {url}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs `spec` against `endpoints` (one kine-rs node each) while `fault` strikes on `schedule`.
pub async fn run(endpoints: &[String], spec: Workload, fault: &mut dyn Fault, schedule: Schedule) -> Result<Report> {
    let nodes = endpoints.len();
    let mut clients = Vec::new();
    for url in endpoints {
        clients.push(connect(url).await?);
    }
    let first = clients[0].get(spec.prefix.as_str(), Some(GetOptions::new().with_prefix().with_count_only())).await?;
    if first.count() != 0 {
        bail!("the prefix {} is not empty: a run needs a fresh one", spec.prefix);
    }
    let start = first.header().map(|h| h.revision()).unwrap_or(1);

    let history = Arc::new(History::new(nodes));
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watchers: Vec<Watcher> = (0..nodes)
        .map(|i| Watcher::spawn(i, clients[i].clone(), spec.prefix.clone(), start + 1, stop_watch.clone()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (node, client) in clients.iter().enumerate() {
        for c in 0..spec.clients_per_node {
            let id = (node * spec.clients_per_node + c + 1) as u64;
            let worker = Worker::new(node, id, client.clone(), spec.clone(), history.clone());
            tasks.push(tokio::spawn(worker.run(stop.clone())));
        }
    }
    let progress = watchers.iter().map(|w| w.progress.clone()).collect();
    let compactor =
        workload::compactor(clients[0].clone(), history.clone(), progress, Duration::from_secs(2), 20, stop.clone());
    tasks.push(tokio::spawn(compactor));

    let began = history.elapsed();
    let mut heals = Vec::new();
    tokio::time::sleep(schedule.warmup).await;
    for _ in 0..schedule.rounds {
        fault.inject().with_context(|| format!("inject {}", fault.name()))?;
        tokio::time::sleep(schedule.hold).await;
        fault.heal().with_context(|| format!("heal {}", fault.name()))?;
        heals.push((history.now() / 10_000, SystemTime::now()));
        tokio::time::sleep(schedule.rest).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let ended = history.elapsed();

    // Every node's final state, read linearizably once it answers again.
    let mut finals = Vec::new();
    let mut newest = start;
    for (node, client) in clients.iter().enumerate() {
        let listed = final_list(client.clone(), &spec.prefix, node).await?;
        newest = newest.max(listed.revision);
        finals.push(listed);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while watchers.iter().any(|w| w.caught_up() < newest) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_watch.store(true, Ordering::Relaxed);

    let mut findings = Findings::default();
    let streams: Vec<_> = watchers.iter().map(Watcher::snapshot).collect();
    for (w, (_, caught_up)) in watchers.iter().zip(&streams) {
        if *caught_up < newest {
            findings.watch_gaps.push(format!("node {}: the watch caught up only to {caught_up} of {newest}", w.node));
        }
        findings
            .watch_failures
            .extend(w.delivered.lock().unwrap().failures.iter().map(|f| format!("node {}: {f}", w.node)));
    }
    let events: Vec<_> = streams.iter().map(|s| s.0.clone()).collect();
    let union = verify::union_history(&events, &mut findings);
    verify::check_streams(&streams, &union, &mut findings);
    verify::check_writes(&history, &union, &mut findings);
    let mut lists = history.lists();
    lists.extend(finals);
    verify::check_lists(&lists, &union, &mut findings);
    verify::check_linearizable(&history, &mut findings);

    let (operations, acknowledged, unknown) = verify::count(&history);
    let ticks: Vec<u64> = heals.iter().map(|h| h.0).collect();
    let (longest_unavailable, per_heal) = availability(&history.answers(), began, ended, &ticks);
    let recovery = per_heal.iter().flatten().copied().max().unwrap_or_default();
    let heals = heals.iter().zip(per_heal).map(|(h, recovery)| Heal { at: h.1, recovery }).collect();
    Ok(Report {
        fault: fault.name(),
        nodes,
        duration: ended - began,
        operations,
        acknowledged,
        unknown,
        errors: history.errors(),
        compactions: history.compactions(),
        watch_resumes: watchers.iter().map(|w| w.delivered.lock().unwrap().resumes).sum(),
        revisions: newest - start,
        longest_unavailable,
        recovery,
        heals,
        findings,
    })
}

async fn final_list(mut client: Client, prefix: &str, node: usize) -> Result<Listed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let get = client.get(prefix, Some(GetOptions::new().with_prefix()));
        match tokio::time::timeout(Duration::from_secs(3), get).await {
            Ok(Ok(resp)) => {
                let items = resp
                    .kvs()
                    .iter()
                    .filter_map(|kv| Some((String::from_utf8_lossy(kv.key()).into_owned(), decode(kv.value())?)))
                    .collect();
                let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                return Ok(Listed { node, revision, items });
            }
            _ if Instant::now() > deadline => bail!("node {node} did not answer a read within 30 s after the run"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// (the longest gap between answers of any node, per heal the time from it to each node's next
/// answer); times in 10 ms units.
fn availability(
    answers: &[Vec<u64>],
    began: Duration,
    ended: Duration,
    heals: &[u64],
) -> (Duration, Vec<Vec<Duration>>) {
    let (from, to) = ((began.as_millis() / 10) as u64, (ended.as_millis() / 10) as u64);
    let mut longest = 0;
    for a in answers {
        let mut last = from;
        for &t in a.iter().filter(|t| **t >= from && **t <= to) {
            longest = longest.max(t.saturating_sub(last));
            last = t;
        }
        longest = longest.max(to.saturating_sub(last));
    }
    let ms = |ticks: u64| Duration::from_millis(ticks * 10);
    let recoveries = heals
        .iter()
        .map(|&h| answers.iter().map(|a| ms(a.iter().find(|t| **t >= h).copied().unwrap_or(to) - h)).collect())
        .collect();
    (ms(longest), recoveries)
}
