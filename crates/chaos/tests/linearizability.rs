//! The checker accepts linearizable histories and rejects the ones that are not: a checker that
//! accepts everything would make every fault run pass.

use kine_chaos::linearizability::{Call, Operation, Outcome, check};

const NEVER: u64 = u64::MAX;

fn op(call: Call, outcome: Outcome, invoked: u64, answered: u64) -> Operation {
    let answered = if outcome == Outcome::Unknown { NEVER } else { answered };
    Operation { call, outcome, invoked, answered }
}

fn create(value: u64, outcome: Outcome, t: (u64, u64)) -> Operation {
    op(Call::Create { value }, outcome, t.0, t.1)
}

fn update(expected: i64, value: u64, outcome: Outcome, t: (u64, u64)) -> Operation {
    op(Call::Update { expected, value }, outcome, t.0, t.1)
}

fn delete(expected: i64, outcome: Outcome, t: (u64, u64)) -> Operation {
    op(Call::Delete { expected }, outcome, t.0, t.1)
}

fn put(value: u64, outcome: Outcome, t: (u64, u64)) -> Operation {
    op(Call::Put { value }, outcome, t.0, t.1)
}

fn get(seen: Option<(u64, i64)>, t: (u64, u64)) -> Operation {
    op(Call::Get, Outcome::Read(seen), t.0, t.1)
}

fn ok(history: &[Operation]) -> bool {
    check(None, history, 1_000_000).is_ok()
}

#[test]
fn sequential_histories_that_follow_the_model_pass() {
    let h = [
        get(None, (0, 1)),
        create(1, Outcome::Written(5), (2, 3)),
        get(Some((1, 5)), (4, 5)),
        update(5, 2, Outcome::Written(7), (6, 7)),
        update(5, 3, Outcome::Refused(Some((2, 7))), (8, 9)),
        create(4, Outcome::Refused(Some((2, 7))), (10, 11)),
        delete(7, Outcome::Written(9), (12, 13)),
        get(None, (14, 15)),
        create(5, Outcome::Written(12), (16, 17)),
    ];
    assert!(ok(&h));
}

#[test]
fn concurrent_operations_may_take_effect_in_either_order() {
    // The read overlaps the create: it may see the key absent or present.
    assert!(ok(&[create(1, Outcome::Written(5), (0, 10)), get(None, (1, 9))]));
    assert!(ok(&[create(1, Outcome::Written(5), (0, 10)), get(Some((1, 5)), (1, 9))]));
    // Two overlapping creates: one wins, the other sees the winner.
    assert!(ok(&[create(1, Outcome::Refused(Some((2, 6))), (0, 10)), create(2, Outcome::Written(6), (1, 9)),]));
}

#[test]
fn a_write_without_answer_may_or_may_not_have_taken_effect() {
    let lost = create(1, Outcome::Unknown, (0, 0));
    assert!(ok(&[lost, get(None, (5, 6))]));
    assert!(ok(&[lost, get(Some((1, 3)), (5, 6)), update(3, 2, Outcome::Written(8), (7, 8))]));
    // It can take effect long after it was sent (the server saw it late).
    assert!(ok(&[lost, get(None, (5, 6)), get(Some((1, 9)), (10, 11))]));
}

#[test]
fn a_stale_read_is_rejected() {
    // The update was answered before the read began; the read still saw the old value.
    let h =
        [create(1, Outcome::Written(3), (0, 1)), update(3, 2, Outcome::Written(4), (2, 3)), get(Some((1, 3)), (4, 5))];
    let v = check(None, &h, 1_000_000).unwrap_err();
    assert_eq!(v.stuck, vec![2], "{v:?}");
}

#[test]
fn a_lost_acknowledged_write_is_rejected() {
    assert!(!ok(&[create(1, Outcome::Written(3), (0, 1)), get(None, (2, 3))]));
}

#[test]
fn two_successful_creates_are_rejected() {
    assert!(!ok(&[create(1, Outcome::Written(3), (0, 10)), create(2, Outcome::Written(4), (1, 9))]));
}

#[test]
fn a_compare_that_should_have_held_is_rejected() {
    // The update expected revision 3 and the key was at 3, yet it was refused.
    assert!(!ok(&[create(1, Outcome::Written(3), (0, 1)), update(3, 2, Outcome::Refused(Some((1, 3))), (2, 3))]));
    // A conditional write succeeding against the wrong revision.
    assert!(!ok(&[create(1, Outcome::Written(3), (0, 1)), update(2, 2, Outcome::Written(5), (2, 3))]));
}

#[test]
fn revisions_that_go_backwards_are_rejected() {
    assert!(!ok(&[create(1, Outcome::Written(5), (0, 1)), update(5, 2, Outcome::Written(4), (2, 3))]));
}

#[test]
fn a_value_read_with_two_revisions_is_rejected() {
    let h = [create(1, Outcome::Unknown, (0, 0)), get(Some((1, 3)), (1, 2)), get(Some((1, 4)), (3, 4))];
    assert!(!ok(&h));
}

#[test]
fn a_read_of_a_value_never_written_is_rejected() {
    assert!(!ok(&[create(1, Outcome::Written(3), (0, 1)), get(Some((9, 3)), (2, 3))]));
}

#[test]
fn reads_must_respect_real_time_order_between_themselves() {
    // The write is pending (slow); one read saw it, a later read did not: not linearizable.
    let h = [create(1, Outcome::Unknown, (0, 0)), get(Some((1, 3)), (1, 2)), get(None, (3, 4))];
    assert!(!ok(&h));
}

#[test]
fn plain_puts_always_take_effect() {
    // On an absent key and over another value, without any compare.
    let h = [put(1, Outcome::Written(3), (0, 1)), put(2, Outcome::Written(5), (2, 3)), get(Some((2, 5)), (4, 5))];
    assert!(ok(&h));
    // Two overlapping puts: the later revision is the value that stays.
    let h = [put(1, Outcome::Written(4), (0, 10)), put(2, Outcome::Written(3), (1, 9)), get(Some((1, 4)), (11, 12))];
    assert!(ok(&h));
    // A put without answer may or may not have happened.
    assert!(ok(&[put(1, Outcome::Unknown, (0, 0)), get(None, (1, 2))]));
    assert!(ok(&[put(1, Outcome::Unknown, (0, 0)), get(Some((1, 7)), (1, 2))]));
    // A put is never refused, and a read after it must see it.
    assert!(!ok(&[put(1, Outcome::Refused(None), (0, 1))]));
    assert!(!ok(&[
        create(1, Outcome::Written(3), (0, 1)),
        put(2, Outcome::Written(4), (2, 3)),
        get(Some((1, 3)), (4, 5))
    ]));
    // Its revision is above the key's current one.
    assert!(!ok(&[create(1, Outcome::Written(5), (0, 1)), put(2, Outcome::Written(4), (2, 3))]));
}

#[test]
fn long_concurrent_histories_are_checked_within_the_search_budget() {
    // 8 clients × 60 operations, overlapping in groups: a chain of updates with racing losers.
    let mut h = Vec::new();
    let mut revision = 1;
    let mut current: Option<(u64, i64)> = None;
    for round in 0..60u64 {
        let t = round * 10;
        let value = round + 1;
        let outcome = Outcome::Written(revision + 1);
        let call = match current {
            None => Call::Create { value },
            Some((_, r)) => Call::Update { expected: r, value },
        };
        h.push(op(call, outcome, t, t + 8));
        for c in 0..6 {
            // Losers that read the state before the winner (answers overlap it).
            let seen = current;
            let call = match seen {
                None => Call::Create { value: 10_000 + round * 10 + c },
                Some((_, r)) => Call::Update { expected: r - 1, value: 10_000 + round * 10 + c },
            };
            if seen.is_some() {
                h.push(op(call, Outcome::Refused(seen), t + 1, t + 2));
            }
        }
        h.push(get(current, (t, t + 1)));
        revision += 1;
        current = Some((value, revision));
    }
    // `ok` gives the search 1 M steps: memoization keeps a history like this far below.
    assert!(ok(&h));
    // And one wrong answer in the middle of it is found.
    let i = h.iter().position(|o| o.call == Call::Get && o.invoked == 300).unwrap();
    h[i] = get(Some((1, 2)), (300, 301));
    assert!(!ok(&h));
}
