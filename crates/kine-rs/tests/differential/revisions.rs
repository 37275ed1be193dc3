//! Revision renaming for the NATS backend. There, a request that changes n keys advances the
//! revision by n (COMPAT.md: each key change is one stream message, and per-key conditional
//! writes need a message on each key's subject), so its revisions are etcd's up to a strictly
//! increasing renaming. The harness learns the renaming from the write responses, translates
//! the revisions of each request from etcd's numbering into kine-rs's, and those of each answer
//! back, so that everything else is still compared exactly.

use kine_proto::etcdserverpb as pb;
use kine_proto::mvccpb;
use std::collections::BTreeMap;

#[derive(Default)]
pub struct Renaming {
    /// etcd revision → kine-rs revision, for every revision a write created (and 1).
    to_kine: BTreeMap<i64, i64>,
    to_etcd: BTreeMap<i64, i64>,
}

impl Renaming {
    pub fn new() -> Renaming {
        let mut r = Renaming::default();
        r.record(1, 1);
        r
    }

    /// After a request: etcd reports revision `etcd`, kine-rs `kine`.
    pub fn record(&mut self, etcd: i64, kine: i64) {
        self.to_kine.insert(etcd, kine);
        self.to_etcd.insert(kine, etcd);
    }

    fn kine(&self, rev: i64) -> i64 {
        if rev <= 0 {
            return rev;
        }
        if let Some(k) = self.to_kine.get(&rev) {
            return *k;
        }
        // Beyond the current revision: the same distance beyond kine-rs's.
        match self.to_kine.last_key_value() {
            Some((e, k)) if rev > *e => k + (rev - e),
            _ => rev,
        }
    }

    fn etcd(&self, rev: i64) -> i64 {
        if rev <= 0 {
            return rev;
        }
        match self.to_etcd.get(&rev) {
            Some(e) => *e,
            // Not a revision any write created: make it stand out.
            None => -1_000_000 - rev,
        }
    }

    pub fn request(&self, op: &mut super::requests::Op) {
        use super::requests::Op;
        match op {
            Op::Range(r) | Op::RangeStream(r) => self.range(r),
            Op::Txn(t) => self.txn_request(t),
            Op::Compact(c) => c.revision = self.kine(c.revision),
            Op::Watch(w) => w.start_revision = self.kine(w.start_revision),
            Op::HashKv(h) => h.revision = self.kine(h.revision),
            Op::Put(_)
            | Op::Delete(_)
            | Op::LeaseGrant(_)
            | Op::LeaseRevoke(_)
            | Op::LeaseTimeToLive(_)
            | Op::LeaseLeases
            | Op::Alarm(_) => {}
        }
    }

    fn range(&self, r: &mut pb::RangeRequest) {
        r.revision = self.kine(r.revision);
        r.min_mod_revision = self.kine(r.min_mod_revision);
        r.max_mod_revision = self.kine(r.max_mod_revision);
        r.min_create_revision = self.kine(r.min_create_revision);
        r.max_create_revision = self.kine(r.max_create_revision);
    }

    fn txn_request(&self, t: &mut pb::TxnRequest) {
        use pb::compare::TargetUnion;
        use pb::request_op::Request;
        for c in &mut t.compare {
            match &mut c.target_union {
                Some(TargetUnion::ModRevision(r)) | Some(TargetUnion::CreateRevision(r)) => *r = self.kine(*r),
                _ => {}
            }
        }
        for op in t.success.iter_mut().chain(t.failure.iter_mut()) {
            match &mut op.request {
                Some(Request::RequestRange(r)) => self.range(r),
                Some(Request::RequestTxn(t)) => self.txn_request(t),
                _ => {}
            }
        }
    }

    fn header(&self, h: &mut Option<pb::ResponseHeader>) {
        if let Some(h) = h {
            h.revision = self.etcd(h.revision);
        }
    }

    fn kv(&self, kv: &mut mvccpb::KeyValue) {
        kv.create_revision = self.etcd(kv.create_revision);
        kv.mod_revision = self.etcd(kv.mod_revision);
    }

    fn txn(&self, t: &mut pb::TxnResponse) {
        use pb::response_op::Response;
        self.header(&mut t.header);
        for r in &mut t.responses {
            match &mut r.response {
                Some(Response::ResponseRange(x)) => {
                    self.header(&mut x.header);
                    x.kvs.iter_mut().for_each(|kv| self.kv(kv));
                }
                Some(Response::ResponsePut(x)) => {
                    self.header(&mut x.header);
                    x.prev_kv.iter_mut().for_each(|kv| self.kv(kv));
                }
                Some(Response::ResponseDeleteRange(x)) => {
                    self.header(&mut x.header);
                    x.prev_kvs.iter_mut().for_each(|kv| self.kv(kv));
                }
                Some(Response::ResponseTxn(x)) => self.txn(x),
                None => {}
            }
        }
    }

    pub fn watch(&self, w: &mut pb::WatchResponse) {
        self.header(&mut w.header);
        w.compact_revision = self.etcd(w.compact_revision);
        for e in &mut w.events {
            e.kv.iter_mut().for_each(|kv| self.kv(kv));
            e.prev_kv.iter_mut().for_each(|kv| self.kv(kv));
        }
    }

    pub fn outcome(&self, o: &mut super::exec::Outcome) {
        use super::exec::Outcome;
        match o {
            Outcome::Range(r) => {
                self.header(&mut r.header);
                r.kvs.iter_mut().for_each(|kv| self.kv(kv));
            }
            Outcome::RangeStream(parts, _) => {
                for r in parts {
                    self.header(&mut r.header);
                    r.kvs.iter_mut().for_each(|kv| self.kv(kv));
                }
            }
            Outcome::Put(r) => {
                self.header(&mut r.header);
                r.prev_kv.iter_mut().for_each(|kv| self.kv(kv));
            }
            Outcome::Delete(r) => {
                self.header(&mut r.header);
                r.prev_kvs.iter_mut().for_each(|kv| self.kv(kv));
            }
            Outcome::Txn(t) => self.txn(t),
            Outcome::Compact(r) => self.header(&mut r.header),
            Outcome::LeaseGrant(r) => self.header(&mut r.header),
            Outcome::LeaseRevoke(r) => self.header(&mut r.header),
            Outcome::LeaseTimeToLive(r) => self.header(&mut r.header),
            Outcome::Leases(r) => self.header(&mut r.header),
            Outcome::Alarm(r) => self.header(&mut r.header),
            Outcome::HashKv(r) => {
                self.header(&mut r.header);
                r.hash_revision = self.etcd(r.hash_revision);
                r.compact_revision = self.etcd(r.compact_revision);
            }
            Outcome::Watch(ws) => ws.iter_mut().for_each(|w| self.watch(w)),
            Outcome::Error(..) => {}
        }
    }
}
