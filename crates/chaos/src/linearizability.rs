//! A linearizability checker for the history of one key (Wing & Gong's search with Lowe's
//! memoization, as porcupine and Knossos do it).
//!
//! A history is a set of operations, each with the time it was invoked and the time its answer
//! arrived; an operation whose answer never came (timeout, lost connection) is *pending*: it may
//! have taken effect at any moment after its invocation, or not at all. The history is
//! linearizable when the operations can be put in one order that respects real time (an
//! operation answered before another was invoked comes first) and in which every answer is the
//! one the model gives. The search tries, at each step, every operation that may come next
//! (invoked before the earliest answer among those still to place), and remembers every
//! (placed set, model state) it has already explored, so that it stays polynomial in practice
//! for the low concurrency of one key.
//!
//! The model is etcd's view of one key: absent, or a value with its mod revision. Values are
//! unique per write, so a read identifies the write it saw; a pending write's revision is unknown
//! until a later read binds it. Every write that succeeds must get a revision above the key's
//! current one.

use std::collections::HashSet;

/// What one key holds in the model: absent, or (value, mod revision if known).
pub type State = Option<(u64, Option<i64>)>;

/// What a read or a failed compare saw: absent, or (value, mod revision).
pub type Seen = Option<(u64, i64)>;

/// One operation on a key as the client issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// A linearizable Range of the key.
    Get,
    /// `If mod_revision(k) == 0 Then Put(k, value) Else Get(k)`: kube-apiserver's create.
    Create { value: u64 },
    /// `If mod_revision(k) == expected Then Put(k, value) Else Get(k)`: its update.
    Update { expected: i64, value: u64 },
    /// `If mod_revision(k) == expected Then Delete(k) Else Get(k)`: its delete.
    Delete { expected: i64 },
    /// A plain Put: no compare, it always takes effect (etcd never refuses one because other
    /// clients write the same key).
    Put { value: u64 },
}

/// The answer, if one came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A read's answer.
    Read(Seen),
    /// A write that took effect at this revision.
    Written(i64),
    /// A compare that failed; the Else branch read this.
    Refused(Seen),
    /// No answer: the operation may or may not have taken effect.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    pub call: Call,
    pub outcome: Outcome,
    /// When it was invoked and answered (any monotonic unit; `u64::MAX` for no answer).
    pub invoked: u64,
    pub answered: u64,
}

impl Operation {
    fn pending(&self) -> bool {
        self.outcome == Outcome::Unknown
    }
}

/// Why a history is not linearizable: the longest order found, and what could not follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Indexes of the operations in the longest valid order found.
    pub longest: Vec<usize>,
    /// Answered operations that no valid order could place after it.
    pub stuck: Vec<usize>,
    /// The model's state after `longest`.
    pub state: State,
}

/// `Ok` when `history` is linearizable from `initial`.
///
/// `budget` bounds the number of search steps; a search that runs out is reported as a
/// violation with an empty `stuck` list (so it can never pass silently).
pub fn check(initial: State, history: &[Operation], budget: u64) -> Result<(), Violation> {
    let n = history.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| history[i].invoked);
    let words = n.div_ceil(64).max(1);
    let must_place = history.iter().filter(|op| !op.pending()).count();

    // Depth-first search: a frame is a state reached, the placed set, and the next candidate to try.
    struct Frame {
        state: State,
        placed: Vec<u64>,
        count: usize,
        next: usize,
        op: Option<usize>,
    }
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack = vec![Frame { state: initial, placed: vec![0; words], count: 0, next: 0, op: None }];
    let mut best: (usize, Vec<usize>, State) = (0, Vec::new(), initial);
    let mut steps = 0u64;
    while let Some(top) = stack.last_mut() {
        if top.count >= must_place && all_answered_placed(history, &top.placed) {
            return Ok(());
        }
        steps += 1;
        if steps > budget {
            return Err(Violation { longest: best.1, stuck: Vec::new(), state: best.2 });
        }
        // The earliest answer among the answered operations not yet placed: every candidate
        // must have been invoked before it.
        let horizon = history
            .iter()
            .enumerate()
            .filter(|(i, op)| !op.pending() && !is_set(&top.placed, *i))
            .map(|(_, op)| op.answered)
            .min()
            .unwrap_or(u64::MAX);
        let mut pushed = None;
        while top.next < n {
            let i = order[top.next];
            top.next += 1;
            let op = &history[i];
            if op.invoked > horizon {
                top.next = n;
                break;
            }
            if is_set(&top.placed, i) {
                continue;
            }
            let Some(state) = step(top.state, op) else { continue };
            let mut placed = top.placed.clone();
            placed[i / 64] |= 1 << (i % 64);
            if !seen.insert((placed.clone(), state)) {
                continue;
            }
            let count = top.count + usize::from(!op.pending());
            pushed = Some(Frame { state, placed, count, next: 0, op: Some(i) });
            break;
        }
        match pushed {
            Some(frame) => {
                stack.push(frame);
                let depth = stack.len() - 1;
                if depth > best.0 {
                    let path = stack.iter().filter_map(|f| f.op).collect();
                    best = (depth, path, stack[depth].state);
                }
            }
            None => {
                stack.pop();
            }
        }
    }
    let placed: HashSet<usize> = best.1.iter().copied().collect();
    let stuck = (0..n).filter(|i| !history[*i].pending() && !placed.contains(i)).collect();
    Err(Violation { longest: best.1, stuck, state: best.2 })
}

fn is_set(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

fn all_answered_placed(history: &[Operation], placed: &[u64]) -> bool {
    history.iter().enumerate().all(|(i, op)| op.pending() || is_set(placed, i))
}

/// The model's state after `op` takes effect in `state`, or None if its answer is impossible there.
/// For a pending write, the state if it took effect (not taking effect = never placing it).
fn step(state: State, op: &Operation) -> Option<State> {
    match (op.call, op.outcome) {
        (Call::Get, Outcome::Read(seen)) => matches(state, seen),
        (Call::Get, Outcome::Unknown) => Some(state),
        (Call::Get, _) => None,
        (Call::Put { .. }, Outcome::Refused(_)) => None,
        (_, Outcome::Refused(seen)) => {
            let state = matches(state, seen)?;
            let expected = expected_revision(op.call);
            (current_revision(state) != Some(expected)).then_some(state)
        }
        (_, Outcome::Read(_)) => None,
        (call, Outcome::Written(revision)) => {
            let state = precondition(state, call)?;
            if let Some(current) = current_revision(state).filter(|r| *r > 0)
                && revision <= current
            {
                return None;
            }
            Some(effect(call, Some(revision)))
        }
        (call, Outcome::Unknown) => precondition(state, call).map(|_| effect(call, None)),
    }
}

/// `state` if a read that saw `seen` is possible in it (binding an unknown revision).
fn matches(state: State, seen: Seen) -> Option<State> {
    match (state, seen) {
        (None, None) => Some(None),
        (Some((v, rev)), Some((w, seen_rev))) if v == w && rev.is_none_or(|r| r == seen_rev) => {
            Some(Some((v, Some(seen_rev))))
        }
        _ => None,
    }
}

/// The compare's expected mod revision (0 = absent).
fn expected_revision(call: Call) -> i64 {
    match call {
        Call::Create { .. } | Call::Get | Call::Put { .. } => 0,
        Call::Update { expected, .. } | Call::Delete { expected } => expected,
    }
}

/// The key's mod revision: 0 when absent, None when present with an unknown revision.
fn current_revision(state: State) -> Option<i64> {
    match state {
        None => Some(0),
        Some((_, rev)) => rev,
    }
}

/// `state` (with an unknown revision bound to the expected one) if the compare holds.
fn precondition(state: State, call: Call) -> Option<State> {
    if let Call::Put { .. } = call {
        return Some(state);
    }
    let expected = expected_revision(call);
    match (state, current_revision(state)) {
        (_, Some(r)) if r == expected => Some(state),
        (Some((v, None)), None) if expected > 0 => Some(Some((v, Some(expected)))),
        _ => None,
    }
}

fn effect(call: Call, revision: Option<i64>) -> State {
    match call {
        Call::Create { value } | Call::Update { value, .. } | Call::Put { value } => Some((value, revision)),
        Call::Delete { .. } | Call::Get => None,
    }
}
