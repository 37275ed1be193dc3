//! The write engine: etcd's Txn / Put / DeleteRange / lease-revoke semantics over a [`WriteView`].
//!
//! Every write request is applied here, inside the backend's serialized write transaction, so
//! all backends that can offer a [`WriteView`] share one implementation. A request that changes
//! at least one key produces exactly one new revision; everything else produces none.

use crate::error::{Error, Result};
use crate::range;
use crate::request::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse,
    RangeRequest, RequestOp, ResponseOp, Revisioned, TxnRequest, TxnResponse,
};
use crate::types::{Event, EventKind, KeyRange, KeyValue, LeaseId, RangeEnd, Revision, RevisionEvents};
use crate::view::WriteView;
use std::collections::HashMap;

/// A request that goes through the backend's writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    Txn(TxnRequest),
    LeaseGrant {
        id: LeaseId,
        ttl: i64,
    },
    /// `expired`: revoked by expiry, not by a client; a shared datastore revokes only if no
    /// node renewed the lease meanwhile.
    LeaseRevoke {
        id: LeaseId,
        expired: bool,
    },
    /// Versions copied from another store with their own revisions (`kine-rs migrate`), never
    /// a client's request.
    Import(Import),
}

/// A batch of another store's versions, written as they were.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    /// Each version at its revision and sub revision (its place among the changes of that
    /// revision). A (revision, sub) the store holds already fails the import.
    pub versions: Vec<ImportedVersion>,
    /// The store's revision afterwards (not below the current one).
    pub revision: Revision,
    pub add_leases: Vec<(LeaseId, i64)>,
    pub remove_leases: Vec<LeaseId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportedVersion {
    pub revision: Revision,
    pub sub: usize,
    /// A put (the version) or a delete (a tombstone of `kv.key`).
    pub event: Event,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteResponse {
    Txn(TxnResponse),
    LeaseGranted,
    LeaseRevoked,
    Imported,
}

/// The result of applying one [`WriteOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub response: WriteResponse,
    /// The changes, when the op created a revision.
    pub events: Option<RevisionEvents>,
}

impl Applied {
    /// The store revision after this op, given the revision it was applied on.
    pub fn revision_after(&self, base: Revision) -> Revision {
        self.events.as_ref().map_or(base, |e| e.revision)
    }
}

/// Applies one write op. On error nothing has been appended: all checks that can fail run
/// before the first write, as in etcd.
pub fn apply(view: &mut dyn WriteView, op: &WriteOp) -> Result<Applied> {
    if let WriteOp::Import(import) = op {
        return apply_import(view, import);
    }
    let base = view.revision();
    let mut exec = Exec { view, base, events: Vec::new(), at_base: HashMap::new() };
    let response = match op {
        WriteOp::Txn(t) => {
            let plan = exec.plan(t)?;
            exec.check(t, &plan)?;
            WriteResponse::Txn(exec.run(t, &plan)?)
        }
        WriteOp::LeaseGrant { id, ttl } => {
            if exec.view.lease(*id)?.is_some() {
                return Err(Error::LeaseExists);
            }
            exec.view.insert_lease(*id, *ttl)?;
            WriteResponse::LeaseGranted
        }
        WriteOp::LeaseRevoke { id, .. } => {
            if exec.view.lease(*id)?.is_none() {
                return Err(Error::LeaseNotFound);
            }
            let keys = exec.view.keys_with_lease(*id, base)?;
            for key in keys {
                exec.delete(&DeleteRangeRequest { range: KeyRange::single(key), prev_kv: false })?;
            }
            exec.view.remove_lease(*id)?;
            WriteResponse::LeaseRevoked
        }
        WriteOp::Import(_) => unreachable!("imports are applied by apply_import"),
    };
    let events =
        if exec.events.is_empty() { None } else { Some(RevisionEvents { revision: base + 1, events: exec.events }) };
    Ok(Applied { response, events })
}

/// Writes another store's versions as they were: no etcd rule applies (they were applied in
/// their store); the revision only moves forward.
fn apply_import(view: &mut dyn WriteView, import: &Import) -> Result<Applied> {
    let base = view.revision();
    if import.revision < base {
        return Err(Error::InvalidArgument(format!(
            "an import may not move the store's revision back from {base} to {}",
            import.revision
        )));
    }
    if let Some(v) = import.versions.iter().find(|v| v.revision > import.revision || v.revision < 1) {
        return Err(Error::InvalidArgument(format!(
            "an imported version's revision {} is outside 1..={}",
            v.revision, import.revision
        )));
    }
    for v in &import.versions {
        view.append(v.revision, v.sub, &v.event)?;
    }
    for id in &import.remove_leases {
        view.remove_lease(*id)?;
    }
    for (id, ttl) in &import.add_leases {
        if view.lease(*id)?.is_none() {
            view.insert_lease(*id, *ttl)?;
        }
    }
    let events = (import.revision > base).then(|| RevisionEvents { revision: import.revision, events: Vec::new() });
    Ok(Applied { response: WriteResponse::Imported, events })
}

/// Which branch each (nested) txn takes, decided on the pre-txn state before anything runs.
struct Plan {
    succeeded: bool,
    /// One plan per nested `RequestOp::Txn` of the chosen branch, in order.
    nested: Vec<Plan>,
}

struct Exec<'a> {
    view: &'a mut dyn WriteView,
    /// The committed revision this op builds on; writes land at `base + 1`.
    base: Revision,
    events: Vec<Event>,
    /// Single keys' newest versions at `base`, as read so far: a create or an update reads its
    /// key up to three times (compare, previous version, the event's previous version), each a
    /// round trip on a network database.
    at_base: HashMap<Vec<u8>, Option<KeyValue>>,
}

impl Exec<'_> {
    fn plan(&mut self, t: &TxnRequest) -> Result<Plan> {
        let mut succeeded = true;
        for c in &t.compare {
            if !self.compare(c)? {
                succeeded = false;
                break;
            }
        }
        let branch = if succeeded { &t.success } else { &t.failure };
        let mut nested = Vec::new();
        for op in branch {
            if let RequestOp::Txn(inner) = op {
                nested.push(self.plan(inner)?);
            }
        }
        Ok(Plan { succeeded, nested })
    }

    fn compare(&mut self, c: &Compare) -> Result<bool> {
        let kvs = match c.range.end {
            RangeEnd::Single => self.key_at_base(&c.range.start)?.into_iter().collect(),
            _ => self.view.scan(&c.range, self.base, 0, false)?,
        };
        if kvs.is_empty() {
            // As etcd: a value compare on a missing key always fails; the other targets compare
            // against zero values.
            if matches!(c.target, CompareTarget::Value(_)) {
                return Ok(false);
            }
            return Ok(compare_kv(c, &KeyValue::default()));
        }
        Ok(kvs.iter().all(|kv| compare_kv(c, kv)))
    }

    /// The checks etcd makes before applying: puts that keep the old value or lease need the
    /// key, attached leases must exist, and ranges must name a readable revision.
    fn check(&mut self, t: &TxnRequest, plan: &Plan) -> Result<()> {
        let branch = if plan.succeeded { &t.success } else { &t.failure };
        let mut nested = plan.nested.iter();
        for op in branch {
            match op {
                RequestOp::Range(r) => self.check_range(r)?,
                RequestOp::Put(p) => self.check_put(p)?,
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(inner) => {
                    let plan = nested.next().expect("one plan per nested txn");
                    self.check(inner, plan)?;
                }
            }
        }
        Ok(())
    }

    /// etcd's `checkRange` for a Range in a txn: revision 0 is current; one above the current
    /// revision is a future one; one below the compact revision is compacted — which is -1
    /// before the first compaction, so a revision below -1 counts as compacted even then.
    fn check_range(&mut self, r: &RangeRequest) -> Result<()> {
        let compacted = self.view.compact_revision();
        if r.revision == 0 {
            Ok(())
        } else if r.revision > self.base {
            Err(Error::FutureRevision)
        } else if r.revision < compacted {
            Err(Error::Compacted { compact_revision: compacted })
        } else {
            Ok(())
        }
    }

    fn check_put(&mut self, p: &PutRequest) -> Result<()> {
        let lease_missing = p.lease != 0 && self.view.lease(p.lease)?.is_none();
        if (p.ignore_value || p.ignore_lease) && self.key_at_base(&p.key)?.is_none() {
            return Err(if lease_missing { Error::KeyAndLeaseNotFound } else { Error::KeyNotFound });
        }
        if lease_missing {
            return Err(Error::LeaseNotFound);
        }
        Ok(())
    }

    fn run(&mut self, t: &TxnRequest, plan: &Plan) -> Result<TxnResponse> {
        let branch = if plan.succeeded { &t.success } else { &t.failure };
        let mut nested = plan.nested.iter();
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            responses.push(match op {
                RequestOp::Range(r) => {
                    let revision = self.read_rev();
                    ResponseOp::Range(Revisioned { revision, value: self.range(r)? })
                }
                RequestOp::Put(p) => ResponseOp::Put(Revisioned { revision: self.base + 1, value: self.put(p)? }),
                RequestOp::DeleteRange(d) => {
                    let value = self.delete(d)?;
                    // As etcd: the new revision once the txn changed anything, else the old one.
                    let revision = self.read_rev();
                    ResponseOp::DeleteRange(Revisioned { revision, value })
                }
                RequestOp::Txn(inner) => {
                    let plan = nested.next().expect("one plan per nested txn");
                    ResponseOp::Txn(self.run(inner, plan)?)
                }
            });
        }
        Ok(TxnResponse { succeeded: plan.succeeded, responses })
    }

    /// The revision that reads inside this txn see: its own writes once it has made any.
    fn read_rev(&self) -> Revision {
        if self.events.is_empty() { self.base } else { self.base + 1 }
    }

    fn range(&mut self, r: &RangeRequest) -> Result<crate::request::RangeResponse> {
        let rev = if r.revision > 0 { r.revision } else { self.read_rev() };
        range::execute(&mut *self.view, r, rev)
    }

    fn put(&mut self, p: &PutRequest) -> Result<PutResponse> {
        let rev = self.base + 1;
        let prev = if self.events.iter().any(|e| e.kv.key == p.key) {
            // Written earlier in this txn (another branch of a nested txn): that version.
            self.view.scan(&KeyRange::single(p.key.clone()), rev, 1, false)?.pop()
        } else {
            self.key_at_base(&p.key)?
        };
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(rev, |kv| kv.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |kv| kv.version + 1),
            value: if p.ignore_value {
                prev.as_ref().map(|kv| kv.value.clone()).unwrap_or_default()
            } else {
                p.value.clone()
            },
            lease: if p.ignore_lease { prev.as_ref().map_or(0, |kv| kv.lease) } else { p.lease },
        };
        let mut event = Event { kind: EventKind::Put, kv, prev_kv: None };
        if !event.is_create() {
            event.prev_kv = self.before(&p.key)?;
        }
        self.view.append(rev, self.events.len(), &event)?;
        self.events.push(event);
        Ok(PutResponse { prev_kv: if p.prev_kv { prev } else { None } })
    }

    /// A key's version before this txn: what etcd reports to watchers as an event's previous
    /// version (not a version this txn wrote earlier).
    fn before(&mut self, key: &[u8]) -> Result<Option<KeyValue>> {
        self.key_at_base(key)
    }

    /// The key's newest version at `base` (unchanged by this txn's own writes, which land at
    /// `base + 1`), read once per txn.
    fn key_at_base(&mut self, key: &[u8]) -> Result<Option<KeyValue>> {
        if let Some(kv) = self.at_base.get(key) {
            return Ok(kv.clone());
        }
        let kv = self.view.scan(&KeyRange::single(key.to_vec()), self.base, 1, false)?.pop();
        self.at_base.insert(key.to_vec(), kv.clone());
        Ok(kv)
    }

    fn delete(&mut self, d: &DeleteRangeRequest) -> Result<DeleteRangeResponse> {
        let rev = self.base + 1;
        let live = self.view.scan(&d.range, rev, 0, false)?;
        let deleted = live.len() as i64;
        for prev in &live {
            let event = Event {
                kind: EventKind::Delete,
                kv: KeyValue { key: prev.key.clone(), mod_revision: rev, ..Default::default() },
                prev_kv: self.before(&prev.key)?,
            };
            self.view.append(rev, self.events.len(), &event)?;
            self.events.push(event);
        }
        Ok(DeleteRangeResponse { deleted, prev_kvs: if d.prev_kv { live } else { Vec::new() } })
    }
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
        CompareTarget::Create(r) => kv.create_revision.cmp(r),
        CompareTarget::Mod(r) => kv.mod_revision.cmp(r),
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Lease(l) => kv.lease.cmp(l),
    };
    match c.result {
        CompareResult::Equal => ord.is_eq(),
        CompareResult::NotEqual => ord.is_ne(),
        CompareResult::Greater => ord.is_gt(),
        CompareResult::Less => ord.is_lt(),
    }
}

/// etcd's checks for a Compact request.
pub fn check_compact(rev: Revision, current: Revision, compacted: Revision) -> Result<()> {
    if rev > current {
        return Err(Error::FutureRevision);
    }
    if rev <= compacted {
        return Err(Error::Compacted { compact_revision: compacted });
    }
    Ok(())
}
