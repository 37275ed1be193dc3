//! The auth record on a datastore shared by several nodes: each node sees what another wrote,
//! a replacement from a version another node has replaced loses, and of concurrent writers
//! exactly one wins.

use kine_core::backend::{AuthRecord, Backend};
use std::sync::Arc;
use std::time::Duration;

/// Waits until `b` reads a record (a NATS copy gets it through its mirror, asynchronously).
pub async fn wait_for_record(b: &Arc<dyn Backend>, want: &AuthRecord) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = b.auth_record().await.expect("read");
        if got.as_ref() == Some(want) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the other node reads {got:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Of `a` and `b` replacing the record from `expected` at once, exactly one wins: returns it.
async fn race(a: &Arc<dyn Backend>, b: &Arc<dyn Backend>, expected: Option<u64>) -> AuthRecord {
    let (ra, rb) =
        tokio::join!(a.auth_replace(expected, b"from a".to_vec()), b.auth_replace(expected, b"from b".to_vec()));
    let (ra, rb) = (ra.expect("replace on a"), rb.expect("replace on b"));
    assert!(ra != rb, "exactly one of two racing replacements from {expected:?} wins (a: {ra}, b: {rb})");
    let record = a.auth_record().await.expect("read").expect("record");
    assert_eq!(record.data, if ra { b"from a".to_vec() } else { b"from b".to_vec() });
    wait_for_record(b, &record).await;
    record
}

/// `a` and `b`: two nodes on one fresh datastore.
pub async fn two_nodes_share_the_auth_record(a: Arc<dyn Backend>, b: Arc<dyn Backend>) {
    assert_eq!(a.auth_record().await.expect("read"), None);
    assert_eq!(b.auth_record().await.expect("read"), None);
    let created = race(&a, &b, None).await;
    assert!(!b.auth_replace(None, b"again".to_vec()).await.expect("create"), "the record exists");
    assert!(b.auth_replace(Some(created.version), b"b1".to_vec()).await.expect("replace on b"));
    let from_b = b.auth_record().await.expect("read").expect("record");
    assert_eq!(from_b.data, b"b1");
    wait_for_record(&a, &from_b).await;
    assert!(!a.auth_replace(Some(created.version), b"stale".to_vec()).await.expect("stale"), "a stale version loses");
    assert_eq!(b.auth_record().await.expect("read"), Some(from_b.clone()), "a stale replacement changes nothing");
    assert!(a.auth_replace(Some(from_b.version), b"a1".to_vec()).await.expect("replace on a"));
    let from_a = a.auth_record().await.expect("read").expect("record");
    wait_for_record(&b, &from_a).await;
    let raced = race(&a, &b, Some(from_a.version)).await;
    assert_ne!(raced.version, from_a.version);
    for node in [&a, &b] {
        assert_eq!(node.revisions().await.expect("revisions").current, 1, "the auth record spends no revision");
    }
}
