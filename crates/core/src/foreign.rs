//! Data kine-rs does not own, found in a datastore when it is opened: Go kine's table or bucket,
//! etcd's files, a file that is no database at all. A backend refuses to serve such a datastore
//! (and to create its own store beside the data) with a [`Foreign`] in its error's chain,
//! before it creates or writes anything there; the binary adds the flag and what to do.

/// What a datastore holds instead of (or beside) a kine-rs store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    pub kind: ForeignKind,
    /// What was found, for people: "this SQLite database holds Go kine's data: table kine,
    /// 1,234 rows, revision 5678".
    pub found: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForeignKind {
    /// Go kine's data (a `kine` or legacy `key_value` table, a bucket of Go kine's records):
    /// `kine-rs migrate` converts it.
    GoKine,
    /// etcd's files (a bbolt database, a data directory): `kine-rs snapshot restore` takes an
    /// etcd member's `member/snap/db`.
    Etcd,
    /// Anything else: not a database, a damaged one, or one holding another program's data.
    Other,
}

impl Foreign {
    pub fn new(kind: ForeignKind, found: impl Into<String>) -> Foreign {
        Foreign { kind, found: found.into() }
    }

    /// The `Foreign` in an error's chain (itself, or worded as [`Explained`]), if any.
    pub fn find(error: &anyhow::Error) -> Option<&Foreign> {
        error
            .chain()
            .find_map(|c| c.downcast_ref::<Foreign>().or_else(|| c.downcast_ref::<Explained>().map(|e| &e.foreign)))
    }
}

/// A [`Foreign`] worded for people (the flag, the URL, what to run instead): shown as `text`
/// alone, and still found by [`Foreign::find`] (a caller may act on it, as `migrate` converts
/// a bucket refused as Go kine's).
#[derive(Debug)]
pub struct Explained {
    pub text: String,
    pub foreign: Foreign,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Explained {}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.found)
    }
}

impl std::error::Error for Foreign {}

/// `1234567` → `1,234,567`, as the refusals show counts.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1234), "1,234");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(-5678), "-5,678");
    }

    #[test]
    fn found_in_a_chain() {
        let e = anyhow::Error::new(Foreign::new(ForeignKind::GoKine, "Go kine's")).context("open");
        assert_eq!(Foreign::find(&e).map(|f| f.kind), Some(ForeignKind::GoKine));
        assert!(Foreign::find(&anyhow::anyhow!("other")).is_none());
        let worded = Explained {
            text: "--endpoint x: Go kine's. Run y".into(),
            foreign: Foreign::new(ForeignKind::GoKine, "Go kine's"),
        };
        let e = anyhow::Error::new(worded);
        assert_eq!(format!("{e:#}"), "--endpoint x: Go kine's. Run y", "shown once");
        assert_eq!(Foreign::find(&e).map(|f| f.kind), Some(ForeignKind::GoKine));
    }
}
