//! The checks after a run: acknowledged writes present, one history on every node, watches
//! without gaps, duplicates or reordering, lists and final states that match the history, and
//! per-key linearizability.

use crate::history::{Event, History, Listed};
use crate::linearizability::{self, Outcome};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Everything found wrong (empty = the run held).
#[derive(Debug, Default)]
pub struct Findings {
    pub lost_writes: Vec<String>,
    pub watch_gaps: Vec<String>,
    pub watch_disorder: Vec<String>,
    pub forks: Vec<String>,
    pub phantoms: Vec<String>,
    pub stale_lists: Vec<String>,
    pub violations: Vec<String>,
    /// Watchers that could not resume (their start revision was compacted).
    pub watch_failures: Vec<String>,
}

impl Findings {
    pub fn is_empty(&self) -> bool {
        self.lost_writes.is_empty()
            && self.watch_gaps.is_empty()
            && self.watch_disorder.is_empty()
            && self.forks.is_empty()
            && self.phantoms.is_empty()
            && self.stale_lists.is_empty()
            && self.violations.is_empty()
            && self.watch_failures.is_empty()
    }
}

/// The union of every watcher's events, ordered by (revision, key): the history every node
/// must have delivered.
pub fn union_history(streams: &[Vec<Event>], findings: &mut Findings) -> Vec<Event> {
    let mut by_position: BTreeMap<(i64, String), Option<u64>> = BTreeMap::new();
    for (node, events) in streams.iter().enumerate() {
        for e in events {
            if let Some(other) = by_position.insert((e.revision, e.key.clone()), e.value)
                && other != e.value
            {
                findings.forks.push(format!(
                    "node {node}: {} at revision {} is {:?}, another node saw {:?}",
                    e.key, e.revision, e.value, other
                ));
            }
        }
    }
    by_position.into_iter().map(|((revision, key), value)| Event { revision, key, value }).collect()
}

/// Each watcher's stream against the union: in order, no duplicate, nothing missing up to the
/// revision it caught up to.
pub fn check_streams(streams: &[(Vec<Event>, i64)], history: &[Event], findings: &mut Findings) {
    for (node, (events, caught_up)) in streams.iter().enumerate() {
        let mut seen = BTreeSet::new();
        let mut last = (0i64, String::new());
        for e in events {
            let position = (e.revision, e.key.clone());
            if seen.contains(&position) {
                findings.watch_disorder.push(format!("node {node}: {} at {} delivered twice", e.key, e.revision));
            } else if e.revision < last.0 {
                findings.watch_disorder.push(format!("node {node}: revision {} after {}", e.revision, last.0));
            }
            seen.insert(position.clone());
            last = last.max(position);
        }
        let missing: Vec<&Event> = history
            .iter()
            .filter(|e| e.revision <= *caught_up && !seen.contains(&(e.revision, e.key.clone())))
            .collect();
        if let Some(first) = missing.first() {
            // What this watcher delivered around the gap, to tell a lost event from one late.
            let before = events.iter().map(|e| e.revision).filter(|r| *r < first.revision).max();
            let after = events.iter().map(|e| e.revision).filter(|r| *r > first.revision).min();
            findings.watch_gaps.push(format!(
                "node {node}: {} events missing, first {} at revision {} (delivered before it: {before:?}, after it: {after:?}; caught up to {caught_up})",
                missing.len(),
                first.key,
                first.revision
            ));
        }
    }
}

/// Every acknowledged write is in the history at its revision, and every value in the history
/// was written by the workload.
pub fn check_writes(recorded: &History, history: &[Event], findings: &mut Findings) {
    let at: HashMap<(i64, &str), Option<u64>> =
        history.iter().map(|e| ((e.revision, e.key.as_str()), e.value)).collect();
    for a in recorded.acknowledged() {
        if at.get(&(a.revision, a.key.as_str())) != Some(&a.value) {
            findings.lost_writes.push(format!("{} = {:?} acknowledged at revision {}", a.key, a.value, a.revision));
        }
    }
    let attempted = recorded.attempted();
    for e in history {
        if let Some(v) = e.value
            && attempted.get(&v).map(String::as_str) != Some(e.key.as_str())
        {
            findings.phantoms.push(format!("{} at revision {} holds {v:x}, never written there", e.key, e.revision));
        }
    }
}

/// The state of the prefix at `revision`, from the history.
pub fn state_at(history: &[Event], revision: i64) -> BTreeMap<String, u64> {
    let mut state = BTreeMap::new();
    for e in history.iter().take_while(|e| e.revision <= revision) {
        match e.value {
            Some(v) => state.insert(e.key.clone(), v),
            None => state.remove(&e.key),
        };
    }
    state
}

/// Every list equals the history's state at the list's revision.
pub fn check_lists(lists: &[Listed], history: &[Event], findings: &mut Findings) {
    for l in lists {
        let expected = state_at(history, l.revision);
        if expected != l.items {
            let differ = expected.keys().chain(l.items.keys()).find(|k| expected.get(*k) != l.items.get(*k));
            findings.stale_lists.push(format!(
                "node {}: list at revision {} differs from the history ({} vs {} items; first {:?})",
                l.node,
                l.revision,
                l.items.len(),
                expected.len(),
                differ
            ));
        }
    }
}

/// Per-key linearizability of the recorded operations.
pub fn check_linearizable(recorded: &History, findings: &mut Findings) {
    for (key, ops) in recorded.operations() {
        if let Err(v) = linearizability::check(None, &ops, 5_000_000) {
            let stuck: Vec<String> = v.stuck.iter().take(3).map(|i| format!("{:?}", ops[*i])).collect();
            findings.violations.push(format!(
                "{key}: {} operations, {} placed (state then {:?}); cannot place: {}",
                ops.len(),
                v.longest.len(),
                v.state,
                if stuck.is_empty() { "(search budget exhausted)".to_string() } else { stuck.join("; ") }
            ));
        }
    }
}

/// Counts operations by outcome: (all, acknowledged writes, unknown outcomes).
pub fn count(recorded: &History) -> (usize, usize, usize) {
    let ops = recorded.operations();
    let all = ops.values().map(Vec::len).sum::<usize>() + recorded.lists().len();
    let unknown = ops.values().flatten().filter(|o| o.outcome == Outcome::Unknown).count();
    (all, recorded.acknowledged().len(), unknown)
}
