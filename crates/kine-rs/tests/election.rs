//! The Election service (v3election) over real gRPC: campaign, proclaim, leader, observe,
//! resign, etcd's errors, `etcdctl elect` candidates mixed in, and two nodes on one NATS bucket.

mod common;
use common::copies::status_of;
use common::*;
use etcd_client::*;
use kine_testkit::nats::NatsServer;
use std::process::Stdio;
use std::time::Duration;

const WAIT: Duration = Duration::from_millis(500);
const WOKEN: Duration = Duration::from_secs(5);

fn campaign_in_task(
    mut c: Client,
    name: &'static str,
    value: &'static str,
    lease: i64,
) -> tokio::task::JoinHandle<CampaignResponse> {
    tokio::spawn(async move { c.campaign(name, value, lease).await.unwrap() })
}

async fn leader_value(c: &mut Client, name: &str) -> Vec<u8> {
    c.leader(name).await.unwrap().kv().unwrap().value().to_vec()
}

/// The next value an observer reports.
async fn observed(o: &mut ObserveStream) -> Vec<u8> {
    let r = tokio::time::timeout(WOKEN, o.message()).await.expect("an observed change").unwrap().unwrap();
    r.kv().unwrap().value().to_vec()
}

#[tokio::test]
async fn campaign_proclaim_resign_and_etcds_errors() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let a = c.lease_grant(60, None).await.unwrap().id();
    let b = c.lease_grant(60, None).await.unwrap().id();
    let e = c.leader("e").await.unwrap_err();
    assert_eq!(status_of(e), (tonic::Code::Unknown, "election: no leader".into()));

    let won = c.campaign("e", "v1", a).await.unwrap();
    let leader = won.leader().unwrap().clone();
    assert_eq!((leader.name(), leader.key(), leader.lease()), (&b"e"[..], format!("e/{a:x}").as_bytes(), a));
    assert_eq!(leader.rev(), won.header().unwrap().revision());
    assert_eq!(leader_value(&mut c, "e").await, b"v1");
    c.proclaim("v2", Some(ProclaimOptions::new().with_leader(leader.clone()))).await.unwrap();
    assert_eq!(leader_value(&mut c, "e").await, b"v2");

    let second = campaign_in_task(server.client().await, "e", "b1", b);
    tokio::time::sleep(WAIT).await;
    assert!(!second.is_finished(), "two leaders at once");
    c.resign(Some(ResignOptions::new().with_leader(leader.clone()))).await.unwrap();
    let second = tokio::time::timeout(WOKEN, second).await.expect("elected after the resignation").unwrap();
    assert_eq!(second.leader().unwrap().key(), format!("e/{b:x}").as_bytes());
    assert_eq!(leader_value(&mut c, "e").await, b"b1");

    // The old leader can no longer proclaim; resigning again changes nothing.
    let e = c.proclaim("late", Some(ProclaimOptions::new().with_leader(leader.clone()))).await.unwrap_err();
    assert_eq!(status_of(e), (tonic::Code::Unknown, "election: not leader".into()));
    c.resign(Some(ResignOptions::new().with_leader(leader))).await.unwrap();
    assert_eq!(leader_value(&mut c, "e").await, b"b1");
    let e = c.proclaim("x", None).await.unwrap_err();
    assert_eq!(status_of(e), (tonic::Code::Unknown, "\"leader\" field must be provided".into()));
    let e = c.resign(None).await.unwrap_err();
    assert_eq!(status_of(e), (tonic::Code::Unknown, "\"leader\" field must be provided".into()));
    let e = c.campaign("e", "v", 999).await.unwrap_err();
    assert_eq!(status_of(e), (tonic::Code::Unknown, "etcdserver: requested lease not found".into()));

    // The leader's lease expiring ends its leadership too.
    let short = c.lease_grant(2, None).await.unwrap().id();
    c.campaign("t", "short", short).await.unwrap();
    let next = campaign_in_task(server.client().await, "t", "next", b);
    tokio::time::timeout(Duration::from_secs(10), next).await.expect("elected after the expiry").unwrap();
    assert_eq!(leader_value(&mut c, "t").await, b"next");
}

#[tokio::test]
async fn observers_see_every_leader_and_value() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let a = c.lease_grant(60, None).await.unwrap().id();
    let b = c.lease_grant(60, None).await.unwrap().id();
    // Observing before anyone campaigns: the first candidate is reported.
    let mut o = server.client().await.observe("o").await.unwrap();
    let leader = c.campaign("o", "a1", a).await.unwrap().leader().unwrap().clone();
    assert_eq!(observed(&mut o).await, b"a1");
    c.proclaim("a2", Some(ProclaimOptions::new().with_leader(leader.clone()))).await.unwrap();
    assert_eq!(observed(&mut o).await, b"a2");
    // A waiting candidate is not reported until it leads.
    let second = campaign_in_task(server.client().await, "o", "b1", b);
    tokio::time::sleep(WAIT).await;
    c.resign(Some(ResignOptions::new().with_leader(leader))).await.unwrap();
    assert_eq!(observed(&mut o).await, b"b1");
    second.await.unwrap();
    // A late observer starts with the current leader.
    let mut late = server.client().await.observe("o").await.unwrap();
    assert_eq!(observed(&mut late).await, b"b1");
}

#[tokio::test]
async fn the_election_service_and_etcdctl_elect_share_an_election() {
    let (server, _dir) = sqlite_server(&[]);
    let mut c = server.client().await;
    let mut etcdctl = std::process::Command::new("etcdctl")
        .args(["--endpoints", &server.url, "elect", "mixed", "from-etcdctl"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("etcdctl (install-test-deps installs it)");
    let deadline = std::time::Instant::now() + WOKEN;
    while c.leader("mixed").await.is_err() {
        assert!(std::time::Instant::now() < deadline, "etcdctl never became leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(leader_value(&mut c, "mixed").await, b"from-etcdctl");
    let lease = c.lease_grant(60, None).await.unwrap().id();
    let mine = campaign_in_task(server.client().await, "mixed", "from-the-service", lease);
    tokio::time::sleep(WAIT).await;
    assert!(!mine.is_finished(), "elected while etcdctl leads");
    // etcdctl resigns when interrupted.
    std::process::Command::new("kill").args(["-INT", &etcdctl.id().to_string()]).status().unwrap();
    tokio::time::timeout(WOKEN, mine).await.expect("elected once etcdctl resigned").unwrap();
    assert_eq!(leader_value(&mut c, "mixed").await, b"from-the-service");
    let _ = etcdctl.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_bucket_share_an_election() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=elections", nats.url());
    let (one, two) = (Server::start(&["--endpoint", &endpoint]), Server::start(&["--endpoint", &endpoint]));
    let mut c1 = one.client().await;
    let mut c2 = two.client().await;
    let a = c1.lease_grant(60, None).await.unwrap().id();
    let b = c1.lease_grant(60, None).await.unwrap().id();
    let mut o = c2.observe("shared").await.unwrap();
    let leader = c1.campaign("shared", "one", a).await.unwrap().leader().unwrap().clone();
    assert_eq!(observed(&mut o).await, b"one");
    let waiting = campaign_in_task(c2.clone(), "shared", "two", b);
    tokio::time::sleep(WAIT).await;
    assert!(!waiting.is_finished(), "the other node elected a second leader");
    c1.resign(Some(ResignOptions::new().with_leader(leader))).await.unwrap();
    tokio::time::timeout(WOKEN, waiting).await.expect("elected on the other node").unwrap();
    assert_eq!(observed(&mut o).await, b"two");
}
