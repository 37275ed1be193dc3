//! A database written by an older schema is migrated when a node opens it: lists, counts and
//! historical reads answer as before, and writes go on, the auth record's and the member
//! registry's too. `downgrade` turns a freshly written database back into the older schema (for
//! schema 1: drops `live`, `kine_rs_auth` and `kine_rs_members`, sets `schema_version` to 1), the
//! way such a database looks.

use crate::contract::{prefix, put, store};
use kine_core::backend::Backend;
use kine_core::request::{DeleteRangeRequest, RangeRequest, RangeResponse};
use kine_core::{KeyRange, Revision};
use std::sync::Arc;

async fn read(b: &Arc<dyn Backend>, revision: Revision) -> (RangeResponse, i64) {
    let s = store(b.clone()).await;
    let all = RangeRequest { revision, ..RangeRequest::new(prefix("/m/")) };
    let page = RangeRequest { limit: 5, ..all.clone() };
    let list = s.range(all).await.expect("list").value;
    let paged = s.range(page).await.expect("page").value;
    (list, paged.count)
}

pub async fn schema_1_is_migrated(open: impl Fn() -> Arc<dyn Backend>, downgrade: impl FnOnce()) {
    let b = open();
    let s = store(b.clone()).await;
    for i in 0..20 {
        put(&s, &format!("/m/{i:02}"), "v1").await;
    }
    let middle = put(&s, "/m/03", "v2").await;
    s.delete_range(DeleteRangeRequest { range: KeyRange::single("/m/05"), prev_kv: false }).await.expect("delete");
    put(&s, "/m/07", "v2").await;
    let (now, old) = (read(&b, 0).await, read(&b, middle).await);
    assert_eq!((now.0.kvs.len(), now.1), (19, 19));
    b.close().await;
    drop((s, b));

    downgrade();
    let b = open();
    assert_eq!(read(&b, 0).await, now, "the newest state after migration");
    assert_eq!(read(&b, middle).await, old, "history after migration");
    let s = store(b.clone()).await;
    put(&s, "/m/05", "back").await;
    let (list, count) = read(&b, 0).await;
    assert_eq!((list.kvs.len(), count), (20, 20), "writes after migration are indexed");
    assert!(b.auth_replace(None, b"auth".to_vec()).await.expect("auth record after migration"));
    b.member_put(7, b"member".to_vec()).await.expect("member record after migration");
    if let Some(records) = b.member_records().await.expect("member records after migration") {
        assert_eq!(records, [(7, b"member".to_vec())], "member records after migration");
    }
    b.close().await;
}
