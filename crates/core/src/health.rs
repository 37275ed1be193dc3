//! The health check behind HTTP `/health` and the gRPC health service, as etcd runs it: active
//! alarms first (unless excluded), then a one-key read through the backend (linearizable
//! unless `serializable`), within a time limit. A failure carries etcd's reason text
//! (`ALARM NOSPACE`, `RANGE ERROR:<error>`).
//!
//! kine-rs adds two reasons of its own: a datastore superseded by a promoted copy is never
//! healthy (`SUPERSEDED:<why>`), and a read-only copy asked to be no more than `lag` behind its
//! origin fails when it is further behind or its link is down (`COPY LAG:<why>`).

use crate::alarm::AlarmKind;
use crate::backend::Role;
use crate::request::RangeRequest;
use crate::store::Store;
use crate::types::KeyRange;
use std::time::Duration;

/// How long the read may take (etcd's default request timeout is 7 s).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How far behind its origin a read-only copy may be and still be healthy (nothing: any lag).
/// A limit also requires the link to the origin to be up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LagLimit {
    pub seconds: Option<Duration>,
    pub revisions: Option<i64>,
}

impl LagLimit {
    fn is_set(&self) -> bool {
        self.seconds.is_some() || self.revisions.is_some()
    }
}

pub async fn check(store: &Store, exclude: &[AlarmKind], serializable: bool, lag: LagLimit) -> Result<(), String> {
    for alarm in store.alarms().list(None) {
        if !exclude.contains(&alarm.kind) {
            return Err(match alarm.kind {
                AlarmKind::NoSpace => "ALARM NOSPACE".to_string(),
                AlarmKind::Corrupt => "ALARM CORRUPT".to_string(),
            });
        }
    }
    if let Role::Superseded { by } = store.backend().role() {
        return Err(format!("SUPERSEDED:this datastore was superseded by {by}"));
    }
    if lag.is_set()
        && let Some(r) = store.backend().replication()
    {
        if !r.link_up {
            let why = r.link_error.as_deref().unwrap_or("nothing heard from the origin");
            return Err(format!("COPY LAG:the link to {} is down ({why})", r.origin));
        }
        if let Some(limit) = lag.seconds
            && r.lag_seconds > limit.as_secs_f64()
        {
            return Err(format!("COPY LAG:{:.1}s behind {} (limit {limit:?})", r.lag_seconds, r.origin));
        }
        if let Some(limit) = lag.revisions
            && r.lag_revisions > limit
        {
            return Err(format!("COPY LAG:{} revisions behind {} (limit {limit})", r.lag_revisions, r.origin));
        }
    }
    let req = RangeRequest { limit: 1, keys_only: true, serializable, ..RangeRequest::new(KeyRange::single("health")) };
    match tokio::time::timeout(READ_TIMEOUT, store.range(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("RANGE ERROR:{e}")),
        Err(_) => Err(format!("RANGE ERROR:no answer within {READ_TIMEOUT:?}")),
    }
}
