//! kine-rs on PostgreSQL end to end. Two processes on one database: conflicting conditional
//! updates from both (exactly one wins each round, the loser sees the winner's value),
//! concurrent writers on both, gap-free revisions, identical watch streams on both nodes, reads
//! after the other node's writes, and a lease kept alive through one node that the other does
//! not expire. A wrong password fails at once, and never shows in the log.

mod common;
use common::*;
use kine_testkit::postgres::PgServer;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_database() {
    let pg = PgServer::start();
    shared_db::two_nodes_on_one_database(&pg.url("multi")).await;
}

#[test]
fn a_wrong_password_fails_at_once_and_is_never_shown() {
    let pg = PgServer::start();
    let url = pg.url("db").replace(kine_testkit::postgres::PASSWORD, "not-the-password");
    let started = std::time::Instant::now();
    let (ok, _, stderr) =
        run(std::process::Command::new(server_bin()).args(["--listen-address", "127.0.0.1:0", "--endpoint", &url]));
    assert!(!ok, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "a refusal is not retried");
    assert!(stderr.contains("--endpoint postgres://kine:***@127.0.0.1"), "{stderr}");
    assert!(stderr.contains("password authentication failed"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "the password leaked: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_loses_nothing_acknowledged() {
    let mut pg = PgServer::start();
    let url = pg.url("restart");
    shared_db::a_restart_under_load_loses_nothing_acknowledged(&mut pg, &url).await;
}

#[tokio::test]
async fn tls_with_a_client_certificate() {
    let certs = TempDir::new("pg-certs");
    kine_testkit::certs::make_certs(certs.path());
    let pg = PgServer::start_tls(certs.path());
    let url = pg.url("tls").replace("sslmode=disable", "sslmode=verify-full");
    let file = |name: &str| certs.path().join(name).display().to_string();
    let node = Server::start(&[
        "--endpoint",
        &url,
        "--ca-file",
        &file("ca.crt"),
        "--cert-file",
        &file("client.crt"),
        "--key-file",
        &file("client.key"),
    ]);
    let mut c = node.client().await;
    c.put("k", "over TLS", None).await.unwrap();
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"over TLS");
    drop(node);

    // Without the client certificate the server refuses (hostssl … clientcert=verify-ca), and
    // without TLS too: kine-rs says so and stops.
    let plain = pg.url("tls");
    for args in [vec!["--endpoint", url.as_str(), "--ca-file", &file("ca.crt")], vec!["--endpoint", plain.as_str()]] {
        let (ok, _, stderr) =
            run(std::process::Command::new(server_bin()).args(["--listen-address", "127.0.0.1:0"]).args(&args));
        assert!(!ok, "{args:?}: {stderr}");
        assert!(stderr.contains("--endpoint postgres://kine:***@"), "{stderr}");
    }
    // A server certificate from another CA is refused.
    let other = TempDir::new("pg-other-certs");
    kine_testkit::certs::make_certs(other.path());
    let (ok, _, stderr) = run(std::process::Command::new(server_bin()).args([
        "--listen-address",
        "127.0.0.1:0",
        "--endpoint",
        &url,
        "--ca-file",
        &other.path().join("ca.crt").display().to_string(),
        "--cert-file",
        &file("client.crt"),
        "--key-file",
        &file("client.key"),
    ]));
    assert!(!ok && stderr.to_lowercase().contains("certificate"), "{stderr}");
}

/// PostgreSQL's B-tree limit is an error naming the datastore's key limit (InvalidArgument),
/// never an internal error, and a Txn holding such a put writes nothing.
#[tokio::test]
async fn a_key_longer_than_the_index_holds_is_refused_by_name() {
    let pg = PgServer::start();
    let node = Server::start(&["--endpoint", &pg.url("keys")]);
    let mut c = node.client().await;
    // Bytes that do not compress, as PostgreSQL would otherwise fit some longer keys.
    let key = |len: usize| -> Vec<u8> { (0..len).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect() };
    let e = c.put(key(2601), "v", None).await.unwrap_err();
    let etcd_client::Error::GRpcStatus(status) = &e else { panic!("{e}") };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(status.message().contains("the PostgreSQL datastore stores keys of at most 2600 bytes"), "{e}");
    let before = c.get("any", None).await.unwrap().header().unwrap().revision();
    let txn = etcd_client::Txn::new()
        .and_then([etcd_client::TxnOp::put("short", "v", None), etcd_client::TxnOp::put(key(3000), "v", None)]);
    let e = c.txn(txn).await.unwrap_err();
    assert!(e.to_string().contains("at most 2600 bytes"), "{e}");
    let after = c.get("short", None).await.unwrap();
    assert_eq!((after.header().unwrap().revision(), after.kvs().len()), (before, 0), "the Txn wrote nothing");
    c.put(key(2600), "v", None).await.unwrap();
    assert_eq!(c.get(key(2600), None).await.unwrap().kvs()[0].value(), b"v");
}

/// With the default pool flags, a burst of concurrent reads reuses the pooled connections
/// instead of opening and closing one per request (the server's own connection log counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reads_reuses_pooled_connections() {
    let pg = PgServer::start();
    pg.sql("postgres", "ALTER SYSTEM SET log_connections = on");
    pg.sql("postgres", "SELECT pg_reload_conf()");
    let node = Server::start(&["--endpoint", &pg.url("burst")]);
    let c = node.client().await;
    c.kv_client().put("k", "v", None).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let mut kv = c.kv_client();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                assert_eq!(kv.get("k", None).await.unwrap().kvs()[0].value(), b"v");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let opened = pg.log().matches("connection authorized: user=kine database=burst").count();
    // 20 kept idle (the default) for reads, plus the writer, the feed, the compactor's removal
    // connection, the schema check and the first attempt that found no database.
    assert!(opened <= 25, "{opened} connections opened for 2000 reads by 100 clients:\n{}", pg.log());
}
