//! Alarms, as etcd keeps them: a set of (member, kind). NOSPACE refuses requests that would add
//! data (a Put, a Txn with a put in any branch, a lease grant) until it is deactivated; CORRUPT
//! refuses every write. Reads always work. NOSPACE is raised by the store itself when the
//! datastore reports that it is full.
//!
//! Unlike etcd's, the set lives in this node's memory: it is not shared with the other nodes of
//! a datastore and a restart clears it (the next write that finds the datastore full raises
//! NOSPACE again).

use crate::error::{Error, Result};
use crate::request::{RequestOp, TxnRequest};
use std::collections::BTreeSet;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmKind {
    NoSpace,
    Corrupt,
}

/// One raised alarm: the member it is about and its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Alarm {
    pub member_id: u64,
    pub kind: AlarmKind,
}

/// What a request does, for deciding whether an alarm refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Adds data: Put, a Txn with a put, lease grant.
    Grow,
    /// Changes data without adding: delete, a Txn without puts, compaction, lease revoke.
    Write,
}

#[derive(Default)]
pub struct Alarms {
    raised: Mutex<BTreeSet<Alarm>>,
}

impl Alarms {
    /// The raised alarms of `kind` (every alarm for `None`), ordered by member then kind.
    pub fn list(&self, kind: Option<AlarmKind>) -> Vec<Alarm> {
        let raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        raised.iter().filter(|a| kind.is_none_or(|k| a.kind == k)).copied().collect()
    }

    /// Raises an alarm. Returns it, or the identical one already raised.
    pub fn activate(&self, alarm: Alarm) -> Alarm {
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        if raised.insert(alarm) {
            tracing::warn!(member = format!("{:x}", alarm.member_id), kind = ?alarm.kind, "alarm raised");
        }
        alarm
    }

    /// Clears an alarm. Returns it if it was raised.
    pub fn deactivate(&self, alarm: Alarm) -> Option<Alarm> {
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        if raised.remove(&alarm) {
            tracing::info!(member = format!("{:x}", alarm.member_id), kind = ?alarm.kind, "alarm cleared");
            Some(alarm)
        } else {
            None
        }
    }

    /// Refuses a request as etcd does while an alarm is raised (CORRUPT first).
    pub fn check(&self, access: Access) -> Result<()> {
        let raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        if raised.iter().any(|a| a.kind == AlarmKind::Corrupt) {
            return Err(Error::Corrupt);
        }
        if access == Access::Grow && raised.iter().any(|a| a.kind == AlarmKind::NoSpace) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }
}

/// Whether a Txn holds a put in any branch at any depth (etcd charges such a Txn for space even
/// if the put's branch does not run).
pub fn txn_puts(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).any(|op| match op {
        RequestOp::Put(_) => true,
        RequestOp::Txn(inner) => txn_puts(inner),
        RequestOp::Range(_) | RequestOp::DeleteRange(_) => false,
    })
}

/// Whether a Txn can change anything (a Txn of only ranges and compares is a read).
pub fn txn_writes(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).any(|op| match op {
        RequestOp::Put(_) | RequestOp::DeleteRange(_) => true,
        RequestOp::Txn(inner) => txn_writes(inner),
        RequestOp::Range(_) => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nospace_refuses_growth_and_corrupt_refuses_writes() {
        let alarms = Alarms::default();
        assert!(alarms.check(Access::Grow).is_ok());
        let nospace = Alarm { member_id: 7, kind: AlarmKind::NoSpace };
        assert_eq!(alarms.activate(nospace), nospace);
        assert!(matches!(alarms.check(Access::Grow), Err(Error::NoSpace)));
        assert!(alarms.check(Access::Write).is_ok());
        let corrupt = Alarm { member_id: 7, kind: AlarmKind::Corrupt };
        alarms.activate(corrupt);
        assert!(matches!(alarms.check(Access::Write), Err(Error::Corrupt)));
        assert!(matches!(alarms.check(Access::Grow), Err(Error::Corrupt)));
        assert_eq!(alarms.list(None), vec![nospace, corrupt]);
        assert_eq!(alarms.list(Some(AlarmKind::Corrupt)), vec![corrupt]);
        assert_eq!(alarms.deactivate(corrupt), Some(corrupt));
        assert_eq!(alarms.deactivate(corrupt), None);
        assert_eq!(alarms.deactivate(nospace), Some(nospace));
        assert!(alarms.check(Access::Grow).is_ok());
    }
}
