//! kine-rs on MySQL (MariaDB) end to end: the shared-database scenarios (two processes on one
//! database; a database restart under load), both URL forms kine accepts, a wrong password that
//! fails at once and never shows, and a key longer than the schema stores.

mod common;
use common::*;
use kine_testkit::mysql::{MariaDbServer, PASSWORD, USER};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_database() {
    let db = MariaDbServer::start();
    shared_db::two_nodes_on_one_database(&db.url("multi")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_loses_nothing_acknowledged() {
    let mut db = MariaDbServer::start();
    let url = db.url("restart");
    shared_db::a_restart_under_load_loses_nothing_acknowledged(&mut db, &url).await;
}

/// `mysql://user:pass@host:port/db` (percent-encoded) reaches the same database as kine's
/// `mysql://user:pass@tcp(host:port)/db`, created on first use.
#[tokio::test]
async fn both_url_forms_reach_one_database() {
    let db = MariaDbServer::start();
    let dsn = db.url("forms");
    let a = Server::start(&["--endpoint", &dsn]);
    a.client().await.put("k", "via tcp()", None).await.unwrap();
    drop(a);
    let url = format!("mysql://{USER}:{}@127.0.0.1:{}/forms", PASSWORD.replace('-', "%2D"), db.port());
    let b = Server::start(&["--endpoint", &url]);
    let mut c = b.client().await;
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"via tcp()");
    // The schema's key limit is an error naming it, never a truncated key.
    let e = c.put(vec![b'k'; 3001], "v", None).await.unwrap_err();
    assert!(e.to_string().contains("at most 3000 bytes"), "{e}");
    c.put(vec![b'k'; 3000], "v", None).await.unwrap();
}

#[test]
fn a_wrong_password_fails_at_once_and_is_never_shown() {
    let db = MariaDbServer::start();
    let url = db.url("db").replace(PASSWORD, "not-the-password");
    let started = std::time::Instant::now();
    let (ok, _, stderr) =
        run(std::process::Command::new(server_bin()).args(["--listen-address", "127.0.0.1:0", "--endpoint", &url]));
    assert!(!ok, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "a refusal is not retried");
    assert!(stderr.contains("--endpoint mysql://kine:***@tcp(127.0.0.1"), "{stderr}");
    assert!(stderr.contains("Access denied"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "the password leaked: {stderr}");
}

#[tokio::test]
async fn tls_with_a_client_certificate() {
    let certs = TempDir::new("mysql-certs");
    kine_testkit::certs::make_certs(certs.path());
    let mut db = MariaDbServer::start();
    db.require_tls(certs.path());
    let url = db.url("tls");
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

    // Without the client certificate (REQUIRE X509), or without TLS (require_secure_transport):
    // refused at once, with the reason, the password never shown.
    let refused = |args: Vec<String>| {
        let started = std::time::Instant::now();
        let (ok, _, stderr) =
            run(std::process::Command::new(server_bin()).args(["--listen-address", "127.0.0.1:0"]).args(&args));
        assert!(!ok, "{args:?}: {stderr}");
        assert!(stderr.contains("--endpoint mysql://kine:***@"), "{stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(10), "a refusal is not retried: {stderr}");
        stderr
    };
    let e = refused(vec!["--endpoint".into(), url.clone(), "--ca-file".into(), file("ca.crt")]);
    assert!(e.contains("Access denied"), "{e}");
    let e = refused(vec!["--endpoint".into(), url.clone()]);
    assert!(e.contains("secure transport") || e.contains("Access denied"), "{e}");
    // A server certificate from another CA is refused.
    let other = TempDir::new("mysql-other-certs");
    kine_testkit::certs::make_certs(other.path());
    let e = refused(vec![
        "--endpoint".into(),
        url,
        "--ca-file".into(),
        other.path().join("ca.crt").display().to_string(),
        "--cert-file".into(),
        file("client.crt"),
        "--key-file".into(),
        file("client.key"),
    ]);
    assert!(e.to_lowercase().contains("certificate"), "{e}");
}
