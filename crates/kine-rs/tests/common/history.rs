//! A store with a history (2,500 keys, updates, deletes, a compaction, a lease) and the events
//! a watch delivers from a revision: what tests of tools that read or copy whole stores check
//! against.

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};

/// (revision, PUT/DELETE, key, value) of a watch event.
pub type Watched = (i64, String, Vec<u8>, Vec<u8>);

/// 2,500 keys (more than one page), updates, deletes, a compaction, a key on a lease, binary
/// values. Returns (compact revision, a revision between it and the end).
pub async fn load(c: &mut etcd_client::Client) -> (i64, i64) {
    for batch in 0..25 {
        let puts: Vec<TxnOp> = (0..100)
            .map(|i| TxnOp::put(format!("/registry/cm/{:05}", batch * 100 + i), vec![0, 1, i as u8], None))
            .collect();
        c.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    for i in (0..2500).step_by(7) {
        c.put(format!("/registry/cm/{i:05}"), format!("updated {i}"), None).await.unwrap();
    }
    let compact = c.delete("/registry/cm/00003", None).await.unwrap().header().unwrap().revision();
    c.compact(compact, None).await.unwrap();
    let middle = c.put("/registry/cm/00003", "back", None).await.unwrap().header().unwrap().revision();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("/registry/leases/x", "held", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    for i in (0..2500).step_by(11) {
        let key = format!("/registry/cm/{i:05}");
        let txn = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Greater, 0)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        c.txn(txn).await.unwrap();
    }
    c.put("/registry/cm/00001", "changed again", None).await.unwrap();
    (compact, middle)
}

/// Every event of the prefix after `after`, as the server's own watch delivers them:
/// (revision, PUT/DELETE, key, value).
pub async fn watched(c: &mut etcd_client::Client, prefix: &str, after: i64, until: i64) -> Vec<Watched> {
    let mut stream =
        c.watch(prefix, Some(WatchOptions::new().with_prefix().with_start_revision(after + 1))).await.unwrap();
    let mut out = Vec::new();
    while out.last().is_none_or(|e: &Watched| e.0 < until) {
        let resp = stream.message().await.unwrap().expect("watch open");
        for e in resp.events() {
            let kv = e.kv().unwrap();
            let kind = if e.event_type() == EventType::Put { "PUT" } else { "DELETE" };
            out.push((kv.mod_revision(), kind.to_string(), kv.key().to_vec(), kv.value().to_vec()));
        }
    }
    out
}

/// [`load`]'s history with one change per revision, as Kubernetes writes (300 keys, updates,
/// deletes, a compaction, a key on a lease): a store whose keys a NATS bucket can hold at their
/// revisions. Returns (compact revision, a revision between it and the end).
pub async fn load_one_change_per_revision(c: &mut etcd_client::Client) -> (i64, i64) {
    for i in 0..300 {
        c.put(format!("/registry/cm/{i:05}"), vec![0, 1, i as u8], None).await.unwrap();
    }
    for i in (0..300).step_by(7) {
        c.put(format!("/registry/cm/{i:05}"), format!("updated {i}"), None).await.unwrap();
    }
    let compact = c.delete("/registry/cm/00003", None).await.unwrap().header().unwrap().revision();
    c.compact(compact, None).await.unwrap();
    let middle = c.put("/registry/cm/00003", "back", None).await.unwrap().header().unwrap().revision();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("/registry/leases/x", "held", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    for i in (0..300).step_by(11) {
        let key = format!("/registry/cm/{i:05}");
        let txn = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Greater, 0)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        c.txn(txn).await.unwrap();
    }
    c.put("/registry/cm/00001", "changed again", None).await.unwrap();
    (compact, middle)
}
