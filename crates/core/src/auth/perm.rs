//! A user's permissions as etcd evaluates them: the read and the write permissions of all its
//! roles, each merged into sorted, disjoint intervals. One key is allowed when an interval holds
//! it; a range when one merged interval covers all of it (so adjacent permissions, from one role
//! or several, add up, as in etcd).

use super::state::{AuthState, PermKind, ROOT};
use crate::types::{KeyRange, RangeEnd};
use std::cmp::Ordering;

/// `[start, end)`; `end == None` is unbounded.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Interval {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

/// Compares interval ends, `None` being +∞.
fn cmp_end(a: &Option<Vec<u8>>, b: &Option<Vec<u8>>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => a.cmp(b),
    }
}

/// One key as an interval: `[key, key + "\0")`.
fn point(key: &[u8]) -> Option<Vec<u8>> {
    let mut end = key.to_vec();
    end.push(0);
    Some(end)
}

#[derive(Clone, Debug, Default)]
struct Intervals(Vec<Interval>);

impl Intervals {
    fn build(mut all: Vec<Interval>) -> Intervals {
        all.sort_by(|a, b| a.start.cmp(&b.start));
        let mut merged: Vec<Interval> = Vec::with_capacity(all.len());
        for next in all {
            match merged.last_mut() {
                // Overlapping or touching: one interval.
                Some(last) if cmp_end(&last.end, &Some(next.start.clone())) != Ordering::Less => {
                    if cmp_end(&next.end, &last.end) == Ordering::Greater {
                        last.end = next.end;
                    }
                }
                _ => merged.push(next),
            }
        }
        Intervals(merged)
    }

    /// Is all of `[start, end)` inside one merged interval?
    fn covers(&self, start: &[u8], end: &Option<Vec<u8>>) -> bool {
        // The last interval starting at or before `start`.
        let i = self.0.partition_point(|iv| iv.start.as_slice() <= start);
        i > 0 && cmp_end(&self.0[i - 1].end, end) != Ordering::Less
    }
}

/// What one user may do.
#[derive(Clone, Debug, Default)]
pub struct UserPerms {
    root: bool,
    read: Intervals,
    write: Intervals,
}

impl UserPerms {
    /// The permissions of `user` in `state` (roles that do not exist give nothing).
    pub fn of(state: &AuthState, user: &str) -> Option<UserPerms> {
        let user = state.users.get(user)?;
        let (mut read, mut write) = (Vec::new(), Vec::new());
        for perm in user.roles.iter().filter_map(|r| state.roles.get(r)).flat_map(|r| &r.perms) {
            let end = match perm.range_end.as_slice() {
                [] => point(&perm.key),
                [0] => None,
                end => Some(end.to_vec()),
            };
            let interval = Interval { start: perm.key.clone(), end };
            if perm.kind.reads() {
                read.push(interval.clone());
            }
            if perm.kind.writes() {
                write.push(interval);
            }
        }
        Some(UserPerms {
            root: user.roles.iter().any(|r| r == ROOT),
            read: Intervals::build(read),
            write: Intervals::build(write),
        })
    }

    pub fn is_root(&self) -> bool {
        self.root
    }

    /// May the user do `kind` on every key of `range`?
    pub fn allows(&self, kind: PermKind, range: &KeyRange) -> bool {
        if self.root {
            return true;
        }
        let end = match &range.end {
            RangeEnd::Single => point(&range.start),
            RangeEnd::Unbounded => None,
            // An empty range asks for no key; etcd checks its start.
            RangeEnd::Before(end) if end.as_slice() <= range.start.as_slice() => point(&range.start),
            RangeEnd::Before(end) => Some(end.clone()),
        };
        let sets: &[&Intervals] = match kind {
            PermKind::Read => &[&self.read],
            PermKind::Write => &[&self.write],
            PermKind::ReadWrite => &[&self.read, &self.write],
        };
        sets.iter().all(|set| set.covers(&range.start, &end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::state::Permission;

    fn state(perms: &[(&str, PermKind, &str, &str)]) -> AuthState {
        let mut s = AuthState::new(vec![]);
        s.user_add("u", None, true).unwrap();
        for (role, kind, key, end) in perms {
            if !s.roles.contains_key(*role) {
                s.role_add(role).unwrap();
                s.user_grant_role("u", role).unwrap();
            }
            let p = Permission { kind: *kind, key: key.as_bytes().to_vec(), range_end: end.as_bytes().to_vec() };
            s.role_grant_permission(role, Some(p)).unwrap();
        }
        s
    }

    fn range(key: &str, end: &str) -> KeyRange {
        KeyRange::from_etcd(key.into(), end.into())
    }

    #[test]
    fn points_ranges_and_adjacent_permissions() {
        let s = state(&[
            ("a", PermKind::Read, "k", ""),
            ("a", PermKind::ReadWrite, "p/", "p0"),
            ("b", PermKind::Read, "p0", "q"),
            ("b", PermKind::Write, "z", "\0"),
        ]);
        let u = UserPerms::of(&s, "u").unwrap();
        assert!(u.allows(PermKind::Read, &range("k", "")));
        assert!(!u.allows(PermKind::Write, &range("k", "")));
        assert!(!u.allows(PermKind::Read, &range("k", "l")), "a range needs more than one key");
        assert!(u.allows(PermKind::Read, &range("k", "k\0")));
        assert!(u.allows(PermKind::Read, &range("p/a", "p/b")));
        assert!(u.allows(PermKind::Read, &range("p/", "q")), "two roles' adjacent ranges add up");
        assert!(!u.allows(PermKind::Read, &range("p/", "q\0")));
        assert!(!u.allows(PermKind::Write, &range("p/", "q")));
        assert!(u.allows(PermKind::Write, &range("zz", "\0")));
        assert!(!u.allows(PermKind::Read, &range("zz", "")));
        assert!(!u.allows(PermKind::ReadWrite, &range("p0", "")));
        assert!(u.allows(PermKind::ReadWrite, &range("p/x", "")));
        assert!(UserPerms::of(&s, "nobody").is_none());
    }

    #[test]
    fn root_may_do_everything() {
        let mut s = AuthState::new(vec![]);
        s.user_add("root", None, true).unwrap();
        s.user_grant_role("root", ROOT).unwrap();
        let u = UserPerms::of(&s, "root").unwrap();
        assert!(u.is_root());
        assert!(u.allows(PermKind::ReadWrite, &KeyRange::all()));
    }
}
