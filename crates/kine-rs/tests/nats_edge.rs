//! The edge/hub topology of docs/nats.md, end to end, with the example config files of
//! `docs/examples/nats/` (only addresses and directories replaced): an edge kine-rs whose
//! embedded server is a leaf node of a hub nats-server (JetStream domain `edge`); the hub
//! mirrors the edge bucket and a kine-rs serves that mirror read-only; a second site's kine-rs
//! (its own embedded server, a leaf node of the hub too) serves another copy. Under a
//! Kubernetes-shaped write load on the edge, the leaf link is cut and restored; then the edge
//! is lost, the hub's copy promoted, and the edge comes back.

mod common;
use common::copies::*;
use common::*;
use etcd_client::*;
use kine_testkit::nats::{NatsServer, free_port};
use kine_testkit::proxy::Proxy;
use std::path::Path;
use std::time::{Duration, Instant};

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/nats").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The value of an unlabelled sample in a scrape.
fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

async fn metric(port: u16, name: &str) -> f64 {
    let (_, text) = http_get(port, "/metrics", None).await;
    sample(&text, name).unwrap_or_else(|| panic!("no {name} in the scrape"))
}

async fn revision(c: &mut Client) -> i64 {
    c.get("health", Some(GetOptions::new().with_serializable())).await.unwrap().header().unwrap().revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_hub_copies_link_cut_and_promotion() {
    let dir = TempDir::new("edge");
    // The hub (its client port and store directory come from the test's command line).
    let leaf_port = free_port();
    // (The hub must not advertise its own leaf address, or the edge would reconnect around the
    // link the test cuts.)
    let hub_conf = example("hub.conf")
        .replace("0.0.0.0:7422", &format!("127.0.0.1:{leaf_port}, no_advertise: true"))
        .replace("jetstream { store_dir: /var/lib/nats }", "jetstream {}");
    let hub = NatsServer::start_with_config(&hub_conf);
    // The edge reaches the hub through a link the test can cut.
    let link = Proxy::start(leaf_port);
    let edge_conf = dir.path().join("edge.conf");
    std::fs::write(&edge_conf, example("edge.conf").replace("hub.example:7422", &format!("127.0.0.1:{}", link.port)))
        .unwrap();
    let edge_endpoint =
        format!("nats://?serverConfig={}&dataDir={}", edge_conf.display(), dir.path().join("edge").display());
    let mut edge = Server::start(&["--endpoint", &edge_endpoint]);
    let mut e = edge.client().await;
    let mut load = K8sLoad::new(&mut e, "/registry").await;
    for _ in 0..100 {
        load.step(&mut e).await.unwrap();
    }

    // A backup on the hub: the two mirrors of docs/examples/nats/kine-backup*.json, as written
    // (`nats stream add --config …` sends them to the same API).
    let hub_nats = async_nats::connect(hub.url()).await.unwrap();
    for file in ["kine-backup.json", "kine-backup-meta.json"] {
        let config: serde_json::Value = serde_json::from_str(&example(file)).unwrap();
        let subject = format!("$JS.API.STREAM.CREATE.{}", config["name"].as_str().unwrap());
        let answer = hub_nats.request(subject, example(file).into()).await.unwrap();
        let answer = String::from_utf8_lossy(&answer.payload).into_owned();
        assert!(!answer.contains("\"error\""), "{file}: {answer}");
    }

    // The hub's copy, served by a kine-rs connected to the hub; a second site's copy in its own
    // embedded server, a leaf node of the hub.
    let metrics = free_port();
    let copy_endpoint = format!("{}?noEmbed&bucket=kine-copy&mirror=kine&mirrorDomain=edge", hub.url());
    let copy =
        Server::start(&["--endpoint", &copy_endpoint, "--metrics-bind-address", &format!("127.0.0.1:{metrics}")]);
    assert!(copy.log().contains("serving a read-only copy"), "{}", copy.log());
    let site2_conf = dir.path().join("site2.conf");
    std::fs::write(&site2_conf, example("site2.conf").replace("hub.example:7422", &format!("127.0.0.1:{leaf_port}")))
        .unwrap();
    let site2_endpoint = format!(
        "nats://?serverConfig={}&dataDir={}&bucket=kine-copy&mirror=kine&mirrorDomain=edge",
        site2_conf.display(),
        dir.path().join("site2").display()
    );
    let site2 = Server::start(&["--endpoint", &site2_endpoint]);
    let mut c = copy.client().await;
    let mut s2 = site2.client().await;
    let from = revision(&mut e).await;
    let w_edge = Collector::start(watch_from(&mut e, "/registry/", from).await);
    let w_copy = Collector::start(watch_from(&mut c, "/registry/", from).await);
    let w_site2 = Collector::start(watch_from(&mut s2, "/registry/", from).await);

    // A steady load on the edge, with compactions (keeping more history than is written while
    // the link is cut: a copy cut off for longer than the origin keeps history cannot deliver
    // the events compacted meanwhile, and its watches behind them are cancelled, as etcd's
    // behind a compaction); the link is cut for a while.
    let writer = {
        let mut e = e.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(14);
            let mut n = 0u64;
            while Instant::now() < deadline {
                load.step(&mut e).await.unwrap();
                n += 1;
                if n.is_multiple_of(500) {
                    let rev = revision(&mut e).await;
                    if rev > 4000 {
                        e.compact(rev - 4000, None).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            load
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    link.cut();
    // The copy notices: its link is down, health with a lag limit fails, reads go on.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, body) = http_get(metrics, "/health?lag=2s", None).await;
        if code == 503 {
            assert!(body.contains("COPY LAG:the link to KV_kine (JetStream domain edge) is down"), "{body}");
            break;
        }
        if Instant::now() > deadline {
            let (_, scrape) = http_get(metrics, "/metrics", None).await;
            let copy_lines: Vec<&str> = scrape.lines().filter(|l| l.starts_with("kine_copy")).collect();
            panic!("health still {code} {body}; {copy_lines:?}\n{}", copy.log());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(metric(metrics, "kine_copy_link_up").await, 0.0);
    assert_eq!(http_get(metrics, "/health", None).await.0, 200, "without a limit a lagging copy is healthy");
    c.get("/registry/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // How far behind is unknown to the copy while it cannot hear from the origin; how stale it
    // may be grows.
    let stale = metric(metrics, "kine_copy_lag_seconds").await;
    assert!(stale > 4.0, "the copy's lag in seconds while the link is cut: {stale}");
    link.restore();
    let mut load = writer.await.unwrap();
    let last = revision(&mut e).await;
    wait_for_revision(&mut c, last, Duration::from_secs(30)).await;
    wait_for_revision(&mut s2, last, Duration::from_secs(30)).await;

    // Both copies saw every event, in order, once; every revision reads the same.
    let edge_events = w_edge.until(last).await;
    assert_eq!(edge_events, w_copy.until(last).await, "the hub copy's watch stream");
    assert_eq!(edge_events, w_site2.until(last).await, "the second site's watch stream");
    let deadline = Instant::now() + Duration::from_secs(10);
    let compacted = loop {
        let (x, y) = (e.hash_kv(last).await.unwrap(), c.hash_kv(last).await.unwrap());
        if (x.hash(), x.compact_version()) == (y.hash(), y.compact_version()) {
            break x.compact_version();
        }
        assert!(Instant::now() < deadline, "HashKV differs: {x:?} {y:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    same_at_every_revision(&mut e, &mut c, "/registry/", compacted, last).await;
    // The backup made by hand is served too: detected as a mirror, read-only.
    let backup = Server::start(&["--endpoint", &format!("{}?noEmbed&bucket=kine-backup", hub.url())]);
    let mut b = backup.client().await;
    wait_for_revision(&mut b, last, Duration::from_secs(20)).await;
    assert!(b.status().await.unwrap().is_learner());
    assert_eq!(b.hash_kv(last).await.unwrap().hash(), e.hash_kv(last).await.unwrap().hash());
    drop(backup);
    assert_eq!(metric(metrics, "kine_copy_link_up").await, 1.0);
    assert_eq!(http_get(metrics, "/health?lag=2s", None).await.0, 200);

    // The edge is lost; the hub's copy is promoted (the old origin cannot be reached).
    edge.child.kill().unwrap();
    edge.child.wait().unwrap();
    let id = own_member(&mut c).await.id();
    c.member_promote(id).await.unwrap();
    for a in &load.acked {
        let r = c.get(a.key.as_str(), Some(GetOptions::new().with_revision(a.revision))).await.unwrap();
        assert_eq!(r.kvs().first().map(|kv| kv.value_str().unwrap().to_string()), a.value, "{a:?}");
    }
    let next = c.put("/registry/after", "v", None).await.unwrap().header().unwrap().revision();
    assert_eq!(next, last + 1, "revisions continue after the copy's newest");
    for _ in 0..20 {
        load.step(&mut c).await.unwrap();
    }

    // The old edge comes back: it is fenced as soon as the new primary reaches it, and what it
    // took meanwhile never reaches the new primary.
    let promoted_revision = revision(&mut c).await;
    edge = Server::start(&["--endpoint", &edge_endpoint]);
    let mut e = edge.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut forked = 0;
    let refusal = loop {
        match e.put(format!("/registry/fork-{forked}"), "x", None).await {
            Ok(_) => forked += 1,
            Err(err) => break status_of(err),
        }
        assert!(
            Instant::now() < deadline,
            "the old origin still takes writes; the new primary's log:\n{}\nthe old origin's:\n{}",
            copy.log(),
            edge.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refusal.0, tonic::Code::FailedPrecondition);
    assert!(refusal.1.contains("superseded by the promoted copy KV_kine-copy"), "{}", refusal.1);
    assert!(edge.log().contains("superseded by a promoted copy"), "{}", edge.log());
    assert!(c.get("/registry/fork-", Some(GetOptions::new().with_prefix())).await.unwrap().kvs().is_empty());
    assert_eq!(revision(&mut c).await, promoted_revision);
    if forked > 0 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !copy.log().contains("the old origin took") {
            assert!(Instant::now() < deadline, "the fork of {forked} write(s) was not reported:\n{}", copy.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
