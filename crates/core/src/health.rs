//! The health check behind HTTP `/health` and the gRPC health service, as etcd runs it: active
//! alarms first (unless excluded), then a one-key read through the backend (linearizable
//! unless `serializable`), within a time limit. A failure carries etcd's reason text
//! (`ALARM NOSPACE`, `RANGE ERROR:<error>`).

use crate::alarm::AlarmKind;
use crate::request::RangeRequest;
use crate::store::Store;
use crate::types::KeyRange;
use std::time::Duration;

/// How long the read may take (etcd's default request timeout is 7 s).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn check(store: &Store, exclude: &[AlarmKind], serializable: bool) -> Result<(), String> {
    for alarm in store.alarms().list(None) {
        if !exclude.contains(&alarm.kind) {
            return Err(match alarm.kind {
                AlarmKind::NoSpace => "ALARM NOSPACE".to_string(),
                AlarmKind::Corrupt => "ALARM CORRUPT".to_string(),
            });
        }
    }
    let req = RangeRequest { limit: 1, keys_only: true, serializable, ..RangeRequest::new(KeyRange::single("health")) };
    match tokio::time::timeout(READ_TIMEOUT, store.range(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("RANGE ERROR:{e}")),
        Err(_) => Err(format!("RANGE ERROR:no answer within {READ_TIMEOUT:?}")),
    }
}
