//! `txn::apply` over a view that counts its reads (the memory table underneath).

use super::MemTable;
use crate::request::{Compare, CompareResult, CompareTarget, PutRequest, RequestOp, ResponseOp, TxnRequest};
use crate::txn::{WriteOp, WriteResponse, apply};
use crate::view::{ReadView, WriteView};
use crate::{Event, EventKind, KeyRange, KeyValue, LeaseId, Result, Revision};

/// A view that counts the reads reaching it.
struct Counting {
    table: MemTable,
    scans: usize,
}

impl ReadView for Counting {
    fn scan(&mut self, range: &KeyRange, rev: Revision, limit: usize, keys_only: bool) -> Result<Vec<KeyValue>> {
        self.scans += 1;
        self.table.scan(range, rev, limit, keys_only)
    }
    fn count(&mut self, range: &KeyRange, rev: Revision) -> Result<i64> {
        self.table.count(range, rev)
    }
}

impl WriteView for Counting {
    fn revision(&self) -> Revision {
        self.table.revision()
    }
    fn compact_revision(&self) -> Revision {
        self.table.compact_revision()
    }
    fn keys_with_lease(&mut self, lease: LeaseId, rev: Revision) -> Result<Vec<Vec<u8>>> {
        self.table.keys_with_lease(lease, rev)
    }
    fn lease(&mut self, id: LeaseId) -> Result<Option<i64>> {
        self.table.lease(id)
    }
    fn insert_lease(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        self.table.insert_lease(id, ttl)
    }
    fn remove_lease(&mut self, id: LeaseId) -> Result<()> {
        self.table.remove_lease(id)
    }
    fn append(&mut self, rev: Revision, index: usize, event: &Event) -> Result<()> {
        self.table.append(rev, index, event)
    }
}

fn put(key: &str, value: &str) -> RequestOp {
    RequestOp::Put(PutRequest { key: key.into(), value: value.into(), prev_kv: true, ..Default::default() })
}

fn txn(target: CompareTarget, success: RequestOp) -> WriteOp {
    let compare = Compare { range: KeyRange::single("a"), result: CompareResult::Equal, target };
    WriteOp::Txn(TxnRequest { compare: vec![compare], success: vec![success], failure: vec![] })
}

/// A create and a conditional update (kube-apiserver's two writes) read their key once,
/// though the compare, the previous version and the event's previous version all need it.
#[test]
fn a_create_or_an_update_reads_its_key_once() {
    let mut view = Counting { table: MemTable::default(), scans: 0 };
    let created = apply(&mut view, &txn(CompareTarget::Create(0), put("a", "1"))).unwrap();
    assert_eq!(view.scans, 1);
    let events = created.events.expect("a create writes");
    assert_eq!((events.revision, events.events[0].prev_kv.is_none()), (2, true));

    // The table's revision stays 1 (the memory backend advances it); the update compares
    // against what it reads at revision 1, which holds nothing: the memo must not serve the
    // create's own write as the key's state before the txn.
    view.scans = 0;
    let update = apply(&mut view, &txn(CompareTarget::Mod(2), put("a", "2"))).unwrap();
    assert_eq!(view.scans, 1);
    let WriteResponse::Txn(response) = update.response else { panic!("a txn answer") };
    assert!(!response.succeeded, "the key does not exist at revision 1");
}

#[test]
fn an_update_sees_the_previous_version_for_its_answer_and_its_event() {
    let mut table = MemTable::default();
    let v1 = KeyValue { key: "a".into(), value: "1".into(), create_revision: 1, mod_revision: 1, version: 1, lease: 0 };
    table.append(1, 0, &Event { kind: EventKind::Put, kv: v1.clone(), prev_kv: None }).unwrap();
    let mut view = Counting { table, scans: 0 };
    let applied = apply(&mut view, &txn(CompareTarget::Mod(1), put("a", "2"))).unwrap();
    assert_eq!(view.scans, 1);
    let WriteResponse::Txn(response) = applied.response else { panic!("a txn answer") };
    assert!(response.succeeded);
    let ResponseOp::Put(put) = &response.responses[0] else { panic!("a put answer") };
    assert_eq!(put.value.prev_kv.as_ref(), Some(&v1));
    let event = &applied.events.expect("an update writes").events[0];
    assert_eq!((event.kv.version, event.kv.create_revision, event.prev_kv.as_ref()), (2, 1, Some(&v1)));
}
