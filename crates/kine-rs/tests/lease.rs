//! Leases over real gRPC: grant, keep-alive, time-to-live, list, revoke, expiry (also after
//! a restart).

mod common;
use common::*;
use etcd_client::*;
use std::time::Duration;

#[tokio::test]
async fn grant_keepalive_ttl_revoke() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let g = c.lease_grant(60, None).await.unwrap();
    assert_eq!(g.ttl(), 60);
    let id = g.id();
    assert!(id > 0);
    c.put("l/1", "v", Some(PutOptions::new().with_lease(id))).await.unwrap(); // 2
    c.put("l/2", "v", Some(PutOptions::new().with_lease(id))).await.unwrap(); // 3
    let t = c.lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
    assert_eq!(t.granted_ttl(), 60);
    assert!(t.ttl() > 55 && t.ttl() <= 60);
    assert_eq!(t.keys(), &[b"l/1".to_vec(), b"l/2".to_vec()]);
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let resp = stream.message().await.unwrap().unwrap();
    assert_eq!((resp.id(), resp.ttl()), (id, 60));
    assert_eq!(c.leases().await.unwrap().leases().iter().map(|l| l.id()).collect::<Vec<_>>(), vec![id]);
    // Client-chosen id; duplicate is refused.
    assert_eq!(c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(777))).await.unwrap().id(), 777);
    let e = c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(777))).await.unwrap_err();
    assert!(e.to_string().contains("etcdserver: lease already exists"), "{e}");
    let r = c.lease_revoke(id).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 4, "revoking deletes both keys in one revision");
    assert_eq!(c.get("l/", Some(GetOptions::new().with_prefix())).await.unwrap().count(), 0);
    // Unknown leases: TTL -1, keep-alive TTL 0, revoke NotFound.
    assert_eq!(c.lease_time_to_live(id, None).await.unwrap().ttl(), -1);
    keeper.keep_alive().await.unwrap();
    assert_eq!(stream.message().await.unwrap().unwrap().ttl(), 0);
    let e = c.lease_revoke(id).await.unwrap_err();
    assert!(e.to_string().contains("etcdserver: requested lease not found"), "{e}");
    let e = c.lease_grant(9_000_000_001, None).await.unwrap_err();
    assert!(e.to_string().contains("etcdserver: too large lease TTL"), "{e}");
}

#[tokio::test]
async fn short_lease_expires_and_deletes_keys_in_one_revision() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let g = c.lease_grant(1, None).await.unwrap();
    assert_eq!(g.ttl(), 2, "etcd's minimum TTL");
    c.put("e/1", "v", Some(PutOptions::new().with_lease(g.id()))).await.unwrap(); // 2
    c.put("e/2", "v", Some(PutOptions::new().with_lease(g.id()))).await.unwrap(); // 3
    let mut w = c.watch("e/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    w.message().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(6), w.message()).await.expect("expiry in time").unwrap().unwrap();
    assert_eq!(r.events().len(), 2);
    assert!(r.events().iter().all(|e| e.event_type() == EventType::Delete && e.kv().unwrap().mod_revision() == 4));
    assert_eq!(c.lease_time_to_live(g.id(), None).await.unwrap().ttl(), -1);
}

#[tokio::test]
async fn lease_survives_restart_and_still_expires() {
    let dir = TempDir::new("lease-restart");
    let endpoint = db_endpoint(dir.path());
    let mut server = Server::start(&["--endpoint", &endpoint]);
    let mut c = server.client().await;
    let id = c.lease_grant(3, None).await.unwrap().id();
    c.put("r", "v", Some(PutOptions::new().with_lease(id))).await.unwrap();
    assert!(server.stop("TERM").await.success());
    let server = Server::start(&["--endpoint", &endpoint]);
    let mut c = server.client().await;
    let t = c.lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
    assert_eq!((t.granted_ttl(), t.keys().len()), (3, 1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(c.get("r", None).await.unwrap().count(), 0, "the lease expired after the restart");
}
