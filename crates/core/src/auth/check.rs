//! The permission each KV and lease request needs, as etcd 3.7 checks it.

use super::{Auth, Caller, PermKind};
use crate::error::{Error, Result};
use crate::request::{DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};
use crate::types::{KeyRange, LeaseId};

/// One check of a Txn, in etcd's order.
enum Step<'a> {
    Read(&'a KeyRange),
    Write(&'a KeyRange),
    Put(&'a PutRequest),
}

/// Every check a Txn needs: its compares, then the operations of both branches (whichever
/// runs), nested Txns included.
fn steps<'a>(txn: &'a TxnRequest, out: &mut Vec<Step<'a>>) {
    out.extend(txn.compare.iter().map(|c| Step::Read(&c.range)));
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            RequestOp::Range(r) => out.push(Step::Read(&r.range)),
            RequestOp::Put(p) => out.push(Step::Put(p)),
            RequestOp::DeleteRange(d) => {
                if d.prev_kv {
                    out.push(Step::Read(&d.range));
                }
                out.push(Step::Write(&d.range));
            }
            RequestOp::Txn(t) => steps(t, out),
        }
    }
}

impl Auth {
    /// Range (and RangeStream, Watch): read on the whole range.
    pub fn check_read(&self, caller: &Caller, range: &KeyRange) -> Result<()> {
        self.permitted(caller, PermKind::Read, range)
    }

    /// Put: write on the key; write on every key already on its lease (unless an admin puts);
    /// read on the key when the previous value is asked for.
    pub async fn check_put(&self, caller: &Caller, put: &PutRequest) -> Result<()> {
        if *caller == Caller::Anyone {
            return Ok(());
        }
        let key = KeyRange::single(put.key.clone());
        self.permitted(caller, PermKind::Write, &key)?;
        if put.lease != 0 {
            self.check_lease_keys(caller, put.lease, PermKind::Write).await?;
        }
        if put.prev_kv {
            self.permitted(caller, PermKind::Read, &key)?;
        }
        Ok(())
    }

    /// DeleteRange: write on the range, and read when the previous values are asked for.
    pub fn check_delete(&self, caller: &Caller, delete: &DeleteRangeRequest) -> Result<()> {
        self.permitted(caller, PermKind::Write, &delete.range)?;
        if delete.prev_kv {
            self.permitted(caller, PermKind::Read, &delete.range)?;
        }
        Ok(())
    }

    pub async fn check_txn(&self, caller: &Caller, txn: &TxnRequest) -> Result<()> {
        if *caller == Caller::Anyone {
            return Ok(());
        }
        let mut all = Vec::new();
        steps(txn, &mut all);
        for step in all {
            match step {
                Step::Read(r) => self.permitted(caller, PermKind::Read, r)?,
                Step::Write(r) => self.permitted(caller, PermKind::Write, r)?,
                Step::Put(p) => self.check_put(caller, p).await?,
            }
        }
        Ok(())
    }

    /// `kind` on every key attached to a lease (LeaseRevoke, LeaseKeepAlive: write;
    /// LeaseTimeToLive with keys, LeaseLeases: read). Admins need nothing; a caller must be
    /// authenticated either way.
    pub async fn check_lease_keys(&self, caller: &Caller, id: LeaseId, kind: PermKind) -> Result<()> {
        self.authenticated(caller)?;
        if *caller == Caller::Anyone || self.is_admin(caller) {
            return Ok(());
        }
        let keys = match self.backend.lease_keys(id).await {
            // A missing lease fails later, with the lease's own error.
            Err(Error::LeaseNotFound) => Vec::new(),
            other => other?,
        };
        for key in keys {
            self.permitted(caller, kind, &KeyRange::single(key))?;
        }
        Ok(())
    }
}
