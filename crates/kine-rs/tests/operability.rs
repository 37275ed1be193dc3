//! Operability: `/metrics` scraped after real traffic and parsed as Prometheus text (the
//! families exist and move by exactly what was done), `/health` in etcd's shape — true with a
//! working datastore, false with a reason when it is stopped or an alarm is raised — with the
//! gRPC health service following it, metrics over TLS, `--version`, slow operations logged, and
//! no datastore password in any log line of a failing connection.

mod common;
use common::*;
use etcd_client::*;
use kine_testkit::nats::free_port;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every sample of a scrape: (name, sorted labels) → value.
type Samples = HashMap<(String, Vec<(String, String)>), f64>;

async fn scrape(port: u16) -> Samples {
    let (status, body) = http_get(port, "/metrics", None).await;
    assert_eq!(status, 200, "{body}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    scrape
        .samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<(String, String)> = s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            labels.sort();
            let value = match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                prometheus_parse::Value::Untyped(v) => v,
                prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
                prometheus_parse::Value::Summary(_) => f64::NAN,
            };
            ((s.metric, labels), value)
        })
        .collect()
}

/// The value of `name` with exactly `labels` (0 when absent).
fn value(s: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut want: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    want.sort();
    s.get(&(name.to_string(), want)).copied().unwrap_or(0.0)
}

fn has_family(s: &Samples, name: &str) -> bool {
    s.keys().any(|(n, _)| n == name || n.starts_with(&format!("{name}_")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_traffic() {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let (server, _dir) = sqlite_server(&["--metrics-bind-address", &address]);
    let mut c = server.client().await;
    let before = scrape(port).await;
    assert_eq!(value(&before, "etcd_server_version", &[("server_version", "3.7.3")]), 1.0);
    let build = before.keys().find(|(n, _)| n == "kine_build_info").expect("build info");
    assert!(build.1.iter().any(|(k, v)| k == "commit" && !v.is_empty()), "{build:?}");

    // A watch, 25 puts, a lease granted and revoked, a compaction.
    let mut stream = c.watch("/m/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    assert!(stream.message().await.unwrap().unwrap().created());
    let mut last = 0;
    for i in 0..25 {
        last = c.put(format!("/m/{i}"), "v", None).await.unwrap().header().unwrap().revision();
    }
    let mut seen = 0;
    while seen < 25 {
        seen += stream.message().await.unwrap().unwrap().events().len();
    }
    let lease = c.lease_grant(60, None).await.unwrap().id();
    c.lease_revoke(lease).await.unwrap();
    c.compact(last, None).await.unwrap();
    let after = scrape(port).await;

    for family in [
        "grpc_server_started_total",
        "kine_build_info",
        "etcd_server_version",
        "etcd_debugging_mvcc_current_revision",
        "etcd_debugging_mvcc_compact_revision",
        "etcd_mvcc_db_total_size_in_bytes",
        "etcd_debugging_mvcc_watch_stream_total",
        "etcd_debugging_mvcc_watcher_total",
        "etcd_debugging_mvcc_events_total",
        "kine_watch_progress_notifications_total",
        "kine_watch_slow_resyncs_total",
        "etcd_debugging_lease_granted_total",
        "etcd_debugging_server_lease_expired_total",
        "kine_leases_alive",
        "kine_backend_total",
        "kine_backend_time_seconds",
        "kine_sql_total",
        "kine_sql_time_seconds",
        "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ] {
        assert!(has_family(&after, family), "{family} missing from /metrics after traffic");
    }
    let put = [("grpc_type", "unary"), ("grpc_service", "etcdserverpb.KV"), ("grpc_method", "Put")];
    let put_ok = [&put[..], &[("grpc_code", "OK")]].concat();
    let grew = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);
    assert_eq!(grew("grpc_server_handled_total", &put_ok), 25.0, "the put counter grows by exactly the puts");
    assert_eq!(grew("grpc_server_started_total", &put), 25.0);
    assert_eq!(grew("grpc_server_handling_seconds", &put), 25.0, "a latency per put");
    let txn = [("backend", "sqlite"), ("operation", "Txn"), ("error_code", "")];
    assert_eq!(grew("kine_backend_total", &txn), 25.0, "one backend write per put");
    assert_eq!(grew("kine_sql_total", &[("name", "Txn"), ("error_code", "")]), 25.0, "kine's name for it");
    assert_eq!(grew("etcd_debugging_mvcc_events_total", &[]), 25.0);
    assert_eq!(value(&after, "etcd_debugging_mvcc_watch_stream_total", &[]), 1.0);
    assert_eq!(value(&after, "etcd_debugging_mvcc_watcher_total", &[]), 1.0);
    assert_eq!(grew("etcd_debugging_lease_granted_total", &[]), 1.0);
    assert_eq!(grew("etcd_debugging_lease_revoked_total", &[]), 1.0);
    // A lease revoked with no keys costs no revision (as etcd).
    assert_eq!(value(&after, "etcd_debugging_mvcc_current_revision", &[]), last as f64);
    assert_eq!(value(&after, "etcd_debugging_mvcc_compact_revision", &[]), last as f64);
    assert_eq!(grew("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds", &[]), 1.0);
    assert!(value(&after, "etcd_mvcc_db_total_size_in_bytes", &[]) > 0.0);
    assert!(value(&after, "process_resident_memory_bytes", &[]) > 1e6);

    // An error is counted under its code.
    let e = c.get("/m/0", Some(GetOptions::new().with_revision(last + 100))).await.unwrap_err();
    assert!(e.to_string().contains("future revision"), "{e}");
    let range_out_of_range = [
        ("grpc_type", "unary"),
        ("grpc_service", "etcdserverpb.KV"),
        ("grpc_method", "Range"),
        ("grpc_code", "OutOfRange"),
    ];
    assert_eq!(value(&scrape(port).await, "grpc_server_handled_total", &range_out_of_range), 1.0);

    // The watch stream, closed by its client, leaves the gauges.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while value(&scrape(port).await, "etcd_debugging_mvcc_watch_stream_total", &[]) != 0.0 {
        assert!(Instant::now() < deadline, "the watch stream gauge never went back to 0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(value(&scrape(port).await, "etcd_debugging_mvcc_watcher_total", &[]), 0.0);
    assert_eq!(http_get(port, "/nothing", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_datastore_and_alarms() {
    let mut pg = kine_testkit::postgres::PgServer::start();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let url = pg.url("health");
    let server = Server::start(&["--endpoint", &url, "--metrics-bind-address", &address]);
    let healthy = r#"{"health":"true","reason":""}"#;
    assert_eq!(http_get(port, "/health", None).await, (200, healthy.to_string()));
    let channel = tonic::transport::Channel::from_shared(server.url.clone()).unwrap().connect().await.unwrap();
    let mut grpc = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = |grpc: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>| {
        let mut grpc = grpc.clone();
        async move {
            let req = tonic_health::pb::HealthCheckRequest { service: String::new() };
            grpc.check(req).await.map(|r| r.into_inner().status)
        }
    };
    assert_eq!(
        status(&mut grpc).await.unwrap(),
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // The datastore stops: unhealthy, with etcd's reason, on HTTP and (within its 5 s period) gRPC.
    pg.stop();
    let (code, body) = http_get(port, "/health", None).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.starts_with(r#"{"health":"false","reason":"RANGE ERROR:"#), "{body}");
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    let deadline = Instant::now() + Duration::from_secs(15);
    while status(&mut grpc).await.unwrap() != not_serving {
        assert!(Instant::now() < deadline, "gRPC health never went NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let feed = [("backend", "postgres"), ("connection", "feed")];
    let deadline = Instant::now() + Duration::from_secs(15);
    while value(&scrape(port).await, "kine_backend_connected", &feed) != 0.0 {
        assert!(Instant::now() < deadline, "the feed's connection gauge never went to 0");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(port, "/health", None).await.0 != 200 {
        assert!(Instant::now() < deadline, "never healthy again after the restart");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while value(&scrape(port).await, "kine_backend_connected", &feed) != 1.0 {
        assert!(Instant::now() < deadline, "the feed's connection gauge never went back to 1");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An alarm: unhealthy unless excluded.
    let mut c = server.client().await;
    let member = c.status().await.unwrap().header().unwrap().member_id();
    let mut on = AlarmOptions::new();
    on.with_member(member);
    c.alarm(AlarmAction::Activate, AlarmType::Nospace, Some(on)).await.unwrap();
    assert_eq!(
        http_get(port, "/health", None).await,
        (503, "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n".into())
    );
    assert_eq!(http_get(port, "/health?exclude=NOSPACE", None).await, (200, healthy.to_string()));
    let metrics = scrape(port).await;
    assert!(value(&metrics, "etcd_server_health_failures", &[]) >= 2.0);
    assert!(value(&metrics, "etcd_server_health_success", &[]) >= 2.0);
}

#[tokio::test]
async fn metrics_over_tls_with_the_server_certificate() {
    let certs = TempDir::new("metrics-certs");
    kine_testkit::certs::make_certs(certs.path());
    let file = |name: &str| certs.path().join(name).display().to_string();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let (_server, _dir) = sqlite_server(&[
        "--server-cert-file",
        &file("server.crt"),
        "--server-key-file",
        &file("server.key"),
        "--metrics-bind-address",
        &address,
    ]);
    let (status, body) = http_get(port, "/metrics", Some(&certs.path().join("ca.crt"))).await;
    assert_eq!(status, 200);
    assert!(body.contains("kine_build_info"), "{body}");
    // Plain HTTP on a TLS port gets no metrics.
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        String::from_utf8_lossy(&raw).into_owned()
    })
    .await
    .unwrap();
    assert!(!plain.contains("kine_build_info"));

    // --metrics-ignore-tls-config: plain HTTP beside a TLS etcd port.
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let (_server, _dir) = sqlite_server(&[
        "--server-cert-file",
        &file("server.crt"),
        "--server-key-file",
        &file("server.key"),
        "--metrics-bind-address",
        &address,
        "--metrics-ignore-tls-config",
    ]);
    assert_eq!(http_get(port, "/health", None).await.0, 200);
}

#[test]
fn version_names_commit_and_features() {
    let (ok, out, _) = run(std::process::Command::new(server_bin()).arg("--version"));
    assert!(ok);
    assert!(out.starts_with(&format!("kine-rs {} (commit ", env!("CARGO_PKG_VERSION"))), "{out}");
    assert!(out.contains("features: "), "{out}");
    #[cfg(feature = "embedded-nats")]
    assert!(out.contains("embedded-nats"), "{out}");
}

#[test]
fn help_lists_every_endpoint_form() {
    let (ok, out, _) = run(std::process::Command::new(server_bin()).arg("--help"));
    assert!(ok);
    for form in ["sqlite://", "memory://", "postgres://", "mysql://", "nats://", "?noEmbed", "mirror="] {
        assert!(out.contains(form), "--help does not name {form}:\n{out}");
    }
}

#[tokio::test]
async fn slow_operations_are_logged_once_with_their_keys() {
    let (server, _dir) = sqlite_server(&["--slow-sql-threshold", "1ns", "--slow-sql-warning-threshold", "0"]);
    let mut c = server.client().await;
    c.put("/slow/key", "v", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("slow backend operation") && l.contains("/slow/key"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("INFO") && line.contains("operation=\"Txn\"") && line.contains("elapsed_ms="), "{line}");
    assert!(!line.contains("WARN"), "{line}");
}

/// Starts kine-rs (debug logging) on an endpoint whose datastore is not there, for a few
/// seconds, and returns everything it logged.
fn logs_of_failing_start(endpoint: &str) -> String {
    use std::io::Read;
    let mut child = std::process::Command::new(server_bin())
        .args(["--listen-address", "127.0.0.1:0", "--metrics-bind-address", "0", "--debug", "--endpoint", endpoint])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut log = String::new();
    child.stdout.take().unwrap().read_to_string(&mut log).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    log
}

#[test]
fn no_datastore_password_in_any_log_line() {
    let closed = free_port();
    for endpoint in [
        format!("postgres://kine:s3cret-pg-pw@127.0.0.1:{closed}/db?sslmode=disable"),
        format!("mysql://kine:s3cret-my-pw@tcp(127.0.0.1:{closed})/db"),
        format!("mysql://kine:s3cret-my-pw@127.0.0.1:{closed}/db"),
        format!("nats://kine:s3cret-nats-pw@127.0.0.1:{closed}?noEmbed"),
    ] {
        let log = logs_of_failing_start(&endpoint);
        assert!(!log.is_empty(), "{endpoint}: nothing logged");
        assert!(!log.contains("s3cret"), "{endpoint}: the password is in the log:\n{log}");
    }
}
