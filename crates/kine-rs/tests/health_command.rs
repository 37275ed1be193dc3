//! `kine-rs health`, the probe for a container's HEALTHCHECK: 0 and the answer when the
//! kine-rs on --metrics-bind-address is healthy (asked on loopback for `:PORT`), a failure
//! naming what it asked when nothing answers, a refusal when there is no /health to ask.

mod common;
use common::*;
use kine_testkit::nats::free_port;
use std::process::Command;

fn health(args: &[&str]) -> (bool, String, String) {
    run(Command::new(server_bin()).arg("health").args(args).env_remove("KINE_METRICS_BIND_ADDRESS"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_for_the_running_kine_rs() {
    let dir = TempDir::new("health");
    let port = free_port();
    let _server =
        Server::start(&["--endpoint", &db_endpoint(dir.path()), "--metrics-bind-address", &format!(":{port}")]);
    let (ok, out, err) = health(&["--metrics-bind-address", &format!(":{port}")]);
    assert!(ok && out.contains("\"health\":\"true\""), "{out}{err}");
    let (ok, out, err) = health(&["--metrics-bind-address", &format!("127.0.0.1:{port}")]);
    assert!(ok && out.contains("\"health\":\"true\""), "{out}{err}");

    let nobody = free_port();
    let (ok, _, err) = health(&["--metrics-bind-address", &format!("127.0.0.1:{nobody}")]);
    assert!(!ok && err.contains(&format!("GET http://127.0.0.1:{nobody}/health")), "{err}");
    let (ok, _, err) = health(&["--metrics-bind-address", "0"]);
    assert!(!ok && err.contains("serves no /health"), "{err}");
}
