//! The history checks find what they are there to find: a watch that skipped, repeated or
//! reordered an event, nodes that disagree on a revision, a list that does not match the history.

use kine_chaos::history::{Event, Listed};
use kine_chaos::verify::{Findings, check_lists, check_streams, state_at, union_history};
use std::collections::BTreeMap;

fn put(revision: i64, key: &str, value: u64) -> Event {
    Event { revision, key: key.into(), value: Some(value) }
}

fn del(revision: i64, key: &str) -> Event {
    Event { revision, key: key.into(), value: None }
}

fn history() -> Vec<Event> {
    vec![put(2, "a", 1), put(3, "b", 2), put(4, "a", 3), del(5, "b"), put(6, "c", 4)]
}

fn streams(node_streams: Vec<Vec<Event>>) -> Findings {
    let mut findings = Findings::default();
    let union = union_history(&node_streams, &mut findings);
    let with_progress: Vec<_> = node_streams.into_iter().map(|s| (s, 6)).collect();
    check_streams(&with_progress, &union, &mut findings);
    findings
}

#[test]
fn identical_complete_streams_hold() {
    let f = streams(vec![history(), history(), history()]);
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn a_missing_event_is_a_gap() {
    let mut short = history();
    short.remove(2);
    let f = streams(vec![history(), short]);
    assert_eq!(f.watch_gaps.len(), 1, "{f:?}");
    assert!(f.watch_gaps[0].contains("revision 4"), "{f:?}");
}

#[test]
fn a_repeated_or_reordered_event_is_disorder() {
    let mut repeated = history();
    repeated.insert(3, put(4, "a", 3));
    assert_eq!(streams(vec![history(), repeated]).watch_disorder.len(), 1);
    let mut reordered = history();
    reordered.swap(1, 2);
    assert_eq!(streams(vec![history(), reordered]).watch_disorder.len(), 1);
}

#[test]
fn nodes_that_disagree_on_a_revision_are_a_fork() {
    let mut other = history();
    other[1] = put(3, "b", 99);
    let f = streams(vec![history(), other]);
    assert_eq!(f.forks.len(), 1, "{f:?}");
}

#[test]
fn lists_are_checked_against_the_state_at_their_revision() {
    let h = history();
    assert_eq!(state_at(&h, 4), BTreeMap::from([("a".to_string(), 3), ("b".to_string(), 2)]));
    assert_eq!(state_at(&h, 5), BTreeMap::from([("a".to_string(), 3)]));
    let good = Listed { node: 0, revision: 4, items: state_at(&h, 4) };
    let stale = Listed { node: 1, revision: 5, items: state_at(&h, 4) };
    let mut f = Findings::default();
    check_lists(&[good, stale], &h, &mut f);
    assert_eq!(f.stale_lists.len(), 1, "{f:?}");
    assert!(f.stale_lists[0].starts_with("node 1"), "{f:?}");
}
