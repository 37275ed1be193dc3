//! The member registry on a datastore shared by several nodes: each node's record is seen by
//! every node, a put replaces the node's record, a delete removes it (twice is fine), and none
//! of it spends a revision or reaches the event feed.

use kine_core::backend::Backend;
use std::sync::Arc;
use std::time::Duration;

type Records = Vec<(u64, Vec<u8>)>;

/// Waits until `b` lists exactly `want` (a NATS copy gets records through its mirror,
/// asynchronously).
pub async fn wait_for_records(b: &Arc<dyn Backend>, want: &[(u64, Vec<u8>)]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got: Option<Records> = b.member_records().await.expect("member records");
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the node lists {got:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `a` and `b`: two nodes on one fresh datastore.
pub async fn members_registry_is_shared(a: Arc<dyn Backend>, b: Arc<dyn Backend>) {
    let before = a.revisions().await.expect("revisions").current;
    let (mut feed_a, mut feed_b) = (a.subscribe(), b.subscribe());
    // Ids beyond i64::MAX are stored (as negative i64 in SQL) and come back unchanged.
    let (id_a, id_b) = (u64::MAX - 1, 42);
    assert_eq!(a.member_records().await.expect("records"), Some(vec![]));
    assert_eq!(b.member_records().await.expect("records"), Some(vec![]));

    a.member_put(id_a, b"a1".to_vec()).await.expect("put on a");
    b.member_put(id_b, b"b1".to_vec()).await.expect("put on b");
    let mut both = vec![(id_a, b"a1".to_vec()), (id_b, b"b1".to_vec())];
    both.sort();
    for node in [&a, &b] {
        wait_for_records(node, &both).await;
    }

    a.member_put(id_a, b"a2".to_vec()).await.expect("put again on a");
    let mut replaced = vec![(id_a, b"a2".to_vec()), (id_b, b"b1".to_vec())];
    replaced.sort();
    for node in [&a, &b] {
        wait_for_records(node, &replaced).await;
    }

    a.member_delete(id_a).await.expect("delete on a");
    let only_b = [(id_b, b"b1".to_vec())];
    for node in [&a, &b] {
        wait_for_records(node, &only_b).await;
    }
    a.member_delete(id_a).await.expect("deleting a missing record is Ok");
    b.member_delete(id_a).await.expect("deleting a missing record is Ok");
    wait_for_records(&a, &only_b).await;

    for node in [&a, &b] {
        assert_eq!(node.revisions().await.expect("revisions").current, before, "member records spend no revision");
    }
    for feed in [&mut feed_a, &mut feed_b] {
        let event = feed.try_recv();
        assert!(event.is_err(), "member records publish no event: {event:?}");
    }
}

/// A single-node datastore has no registry.
pub async fn no_registry(b: Arc<dyn Backend>) {
    b.member_put(1, b"x".to_vec()).await.expect("put");
    assert_eq!(b.member_records().await.expect("records"), None);
    b.member_delete(1).await.expect("delete");
}
