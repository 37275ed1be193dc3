//! The embedded nats-server (cargo feature `embedded-nats`), end to end through the real
//! kine-rs binary: bare `nats://`, `dontListen`, credentials, `noEmbed`, startup errors,
//! logging, signals and the store lock (clusters and leaf nodes: nats_embedded_cluster.rs).
#![cfg(feature = "embedded-nats")]

mod common;

use common::{Server, TempDir, json_number};
use kine_testkit::nats::{NatsServer, free_port};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The value of `key=` in the log line that contains `marker`.
fn log_field(log: &str, marker: &str, key: &str) -> String {
    let line = log.lines().find(|l| l.contains(marker)).unwrap_or_else(|| panic!("no {marker:?} in log:\n{log}"));
    let start = line.find(&format!(" {key}=")).unwrap_or_else(|| panic!("no {key}= in {line:?}")) + key.len() + 2;
    line[start..].split_whitespace().next().unwrap().trim_matches('"').to_string()
}

/// The embedded server's client address from the readiness line.
fn nats_addr(server: &Server) -> String {
    log_field(&server.log(), "embedded NATS server ready", "clients")
}

/// Connects to a NATS port without credentials and returns the server's first answer to
/// CONNECT+PING (`PONG`, or `-ERR ...`).
fn anonymous_connect(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    assert!(info.starts_with("INFO "), "{info}");
    stream.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n").unwrap();
    let mut answer = String::new();
    reader.read_line(&mut answer).unwrap();
    answer.trim().to_string()
}

/// Local addresses of the TCP sockets process `pid` listens on (from /proc).
fn listening_addresses(pid: u32) -> Vec<String> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
        .collect();
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" && inodes.contains(cols[9]) {
                out.push(decode_proc_addr(cols[1]));
            }
        }
    }
    out
}

/// `0100007F:1F90` → `127.0.0.1:8080`; IPv6 as its hex words.
fn decode_proc_addr(hex: &str) -> String {
    let (ip, port) = hex.split_once(':').unwrap();
    let port = u16::from_str_radix(port, 16).unwrap();
    if ip.len() == 8 {
        let n = u32::from_str_radix(ip, 16).unwrap().to_le_bytes();
        format!("{}.{}.{}.{}:{port}", n[0], n[1], n[2], n[3])
    } else {
        let mut bytes = [0u8; 16];
        for (i, chunk) in ip.as_bytes().chunks(8).enumerate() {
            let word = u32::from_str_radix(std::str::from_utf8(chunk).unwrap(), 16).unwrap().to_le_bytes();
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word);
        }
        format!("[{}]:{port}", std::net::Ipv6Addr::from(bytes))
    }
}

fn is_loopback(addr: &str) -> bool {
    addr.starts_with("127.") || addr.starts_with("[::1]") || addr.starts_with("[::ffff:127.")
}

#[tokio::test]
async fn bare_nats_url_runs_an_embedded_server() {
    let dir = TempDir::new("embedded");
    // Bare `nats://`: defaults everywhere, JetStream under ./db/nats of the working directory.
    let mut server = Server::start_in(Some(dir.path()), &["--endpoint", "nats://"]);
    let log = server.log();
    assert!(log.contains("auth=\"per-process token\""), "{log}");
    // nats-server's own fsync default, and room for etcd's largest request.
    assert_eq!(log_field(&log, "embedded NATS server ready", "fsync"), "120s");
    assert_eq!(log_field(&log, "embedded NATS server ready", "max_payload"), (1536 * 1024 + 65536).to_string());
    let addr = nats_addr(&server);
    assert!(addr.starts_with("127.0.0.1:"), "default listen address must be loopback: {addr}");
    assert!(dir.path().join("db/nats/jetstream").is_dir(), "JetStream store not under ./db/nats");
    // The client port requires the per-process token.
    assert!(anonymous_connect(&addr).contains("Authorization Violation"));

    let mut client = server.client().await;
    assert_eq!(client.get("a", None).await.unwrap().header().unwrap().revision(), 1);
    let mut events = client.watch("a", None).await.unwrap();
    // The watch exists once its "created" response arrives.
    assert!(events.message().await.unwrap().unwrap().created());
    let put = client.put("a", "1", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), 2);
    let got = client.get("a", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");
    let ev = loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), events.message()).await.unwrap().unwrap().unwrap();
        if !msg.events().is_empty() {
            break msg;
        }
    };
    assert_eq!(ev.events()[0].kv().unwrap().mod_revision(), 2);
    drop(client);

    let status = server.stop("SIGTERM").await;
    assert!(status.success(), "{status:?}\n{}", server.log());
    let log = server.log();
    assert!(log.contains("embedded NATS server stopped"), "{log}");
    assert!(!log.contains("connection lost"), "shutdown must not look like an outage:\n{log}");

    // The data survives a restart.
    let server = Server::start_in(Some(dir.path()), &["--endpoint", "nats://"]);
    let mut client = server.client().await;
    let got = client.get("a", None).await.unwrap();
    assert_eq!((got.header().unwrap().revision(), got.kvs()[0].value()), (2, &b"1"[..]));
}

/// The process's memory mappings of the embedded server's library (`ffi.rs` loads it from an
/// anonymous memory file of that name).
fn go_library_mappings(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read /proc/PID/maps");
    maps.lines().filter(|l| l.contains("memfd:kine-rs-nats-server")).count()
}

/// The Go runtime and nats-server are loaded only by a process that runs the embedded server:
/// on any other datastore the default build carries them but never starts them.
#[tokio::test]
async fn the_go_runtime_is_loaded_only_for_the_embedded_server() {
    let (sqlite, _dir) = common::sqlite_server(&[]);
    sqlite.client().await.put("a", "1", None).await.unwrap();
    assert_eq!(go_library_mappings(sqlite.child.id()), 0, "SQLite loaded the nats-server library");

    let dir = TempDir::new("embedded-load");
    let store = format!("nats://?dataDir={}", dir.path().join("nats").display());
    let embedded = Server::start(&["--endpoint", &store]);
    embedded.client().await.put("a", "1", None).await.unwrap();
    assert!(go_library_mappings(embedded.child.id()) > 0, "the embedded server runs without its library?");
}

/// `syncAlways` makes the embedded JetStream fsync every write before it acknowledges it.
/// Values as large as etcd takes are stored (1.4 MB: the embedded server's max_payload is
/// raised for them); a larger request gets etcd's own answer, and nothing is written.
#[tokio::test]
async fn sync_always_and_large_values() {
    let dir = TempDir::new("embedded-sync");
    let endpoint = format!("nats://?syncAlways&dataDir={}", dir.path().join("js").display());
    let server = Server::start(&["--endpoint", &endpoint]);
    assert_eq!(log_field(&server.log(), "embedded NATS server ready", "fsync"), "always");
    let mut client = server.client().await;
    let big = vec![b'x'; 1_400_000];
    let rev = client.put("big", big.clone(), None).await.unwrap().header().unwrap().revision();
    let got = client.get("big", None).await.unwrap();
    assert_eq!((got.kvs()[0].mod_revision(), got.kvs()[0].value()), (rev, &big[..]));
    let e = client.put("bigger", vec![b'y'; 2_000_000], None).await.unwrap_err();
    assert!(e.to_string().contains("etcdserver: request is too large"), "{e}");
    let after = client.get("bigger", None).await.unwrap();
    assert_eq!((after.header().unwrap().revision(), after.kvs().len()), (rev, 0));
    // The setting reaches the server: a restart keeps every acknowledged write.
    drop(server);
    let server = Server::start(&["--endpoint", &endpoint]);
    let mut client = server.client().await;
    assert_eq!(client.get("big", None).await.unwrap().kvs()[0].value(), &big[..]);
}

#[tokio::test]
async fn dont_listen_exposes_nothing_beyond_loopback() {
    let dir = TempDir::new("dontlisten");
    let data = dir.path().join("nats");
    // Even with a wildcard address in the URL, dontListen keeps the port on loopback.
    let endpoint = format!("nats://0.0.0.0:{}?dontListen&dataDir={}", free_port(), data.display());
    let server = Server::start(&["--endpoint", &endpoint]);
    let addr = nats_addr(&server);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let listening = listening_addresses(server.child.id());
    assert!(listening.len() >= 2, "expected the etcd and NATS listeners: {listening:?}");
    assert!(listening.iter().all(|a| is_loopback(a)), "a listener beyond loopback: {listening:?}");
    assert!(anonymous_connect(&addr).contains("Authorization Violation"));
    let mut client = server.client().await;
    client.put("k", "v", None).await.unwrap();
    assert_eq!(client.get("k", None).await.unwrap().kvs()[0].value(), b"v");
}

#[tokio::test]
async fn url_credentials_protect_the_embedded_port() {
    let dir = TempDir::new("creds");
    let port = free_port();
    let endpoint = format!("nats://kine:s3cret@127.0.0.1:{port}?dataDir={}", dir.path().display());
    let server = Server::start(&["--endpoint", &endpoint]);
    assert_eq!(nats_addr(&server), format!("127.0.0.1:{port}"));
    assert!(server.log().contains("auth=\"from the URL\""));
    assert!(anonymous_connect(&format!("127.0.0.1:{port}")).contains("Authorization Violation"));
    // Another process can use the port with the URL's credentials (e.g. the nats CLI).
    let external = format!("nats://kine:s3cret@127.0.0.1:{port}?noEmbed&bucket=kine");
    let other = Server::start(&["--endpoint", &external]);
    assert!(!other.log().contains("embedded NATS server"));
    let mut a = server.client().await;
    let mut b = other.client().await;
    a.put("shared", "1", None).await.unwrap();
    assert_eq!(b.get("shared", None).await.unwrap().kvs()[0].value(), b"1");
}

/// One JetStream API request on a NATS port (raw protocol) and its answer.
fn js_api_request(addr: &str, user: &str, password: &str, subject: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let connect = format!("CONNECT {{\"verbose\":false,\"user\":\"{user}\",\"pass\":\"{password}\"}}\r\n");
    stream.write_all(format!("{connect}SUB _INBOX.api 1\r\nPUB {subject} _INBOX.api 0\r\n\r\n").as_bytes()).unwrap();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.starts_with("MSG ") {
            let size: usize = line.split_whitespace().last().unwrap().parse().unwrap();
            let mut payload = vec![0; size + 2];
            reader.read_exact(&mut payload).unwrap();
            return String::from_utf8_lossy(&payload[..size]).into_owned();
        }
        assert!(!line.starts_with("-ERR"), "{line}");
    }
}

/// Reads on the embedded server's node ask that server for the stream's last sequence
/// in-process (no JetStream API request per read), and still see at once what another node
/// wrote through the same server; so do the other node's, with direct gets.
#[tokio::test]
async fn read_barriers_on_the_embedded_server_are_in_process_and_linearizable() {
    let dir = TempDir::new("local-barrier");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = Server::start(&["--endpoint", &format!("nats://kine:s3cret@{addr}?dataDir={}", dir.path().display())]);
    let other = Server::start(&["--endpoint", &format!("nats://kine:s3cret@{addr}?noEmbed&bucket=kine")]);
    let mut a = server.client().await;
    let mut b = other.client().await;
    for i in 0..300 {
        let rev = b.put(format!("k{}", i % 7), format!("{i}"), None).await.unwrap().header().unwrap().revision();
        let got = a.get(format!("k{}", i % 7), None).await.unwrap();
        assert_eq!((got.kvs()[0].mod_revision(), got.kvs()[0].value()), (rev, format!("{i}").as_bytes()));
        assert!(got.header().unwrap().revision() >= rev);
    }
    let api_total = || json_number(&js_api_request(&addr, "kine", "s3cret", "$JS.API.INFO"), "total").unwrap();
    let before = api_total();
    for i in 0..500 {
        a.get(format!("k{}", i % 7), None).await.unwrap();
    }
    let requests = api_total() - before - 1;
    assert!(requests < 50, "500 reads made {requests} JetStream API requests");
    // The node on the external connection asks over NATS for every read: the stream holds its
    // only replica on the server the node is connected to, so a direct get of its last message
    // (backend/direct.rs), not a JetStream API request; STREAM.INFO once a second.
    for i in 0..300 {
        let rev = a.put(format!("k{}", i % 7), format!("{i}"), None).await.unwrap().header().unwrap().revision();
        let got = b.get(format!("k{}", i % 7), None).await.unwrap();
        assert_eq!((got.kvs()[0].mod_revision(), got.kvs()[0].value()), (rev, format!("{i}").as_bytes()));
    }
    let before = api_total();
    let started = std::time::Instant::now();
    for i in 0..500 {
        b.get(format!("k{}", i % 7), None).await.unwrap();
    }
    let requests = api_total() - before - 1;
    let seconds = started.elapsed().as_secs() as i64;
    assert!(requests <= seconds + 2, "500 reads in {seconds} s made {requests} JetStream API requests");
}

#[tokio::test]
async fn no_embed_uses_an_external_server() {
    let nats = NatsServer::start();
    let endpoint = format!("{}?noEmbed&bucket=ext", nats.url());
    let server = Server::start(&["--endpoint", &endpoint]);
    assert!(!server.log().contains("embedded NATS server"), "{}", server.log());
    let mut client = server.client().await;
    client.put("x", "y", None).await.unwrap();
    // The data is in the external server's store.
    drop(server);
    let again = Server::start(&["--endpoint", &endpoint]);
    assert_eq!(again.client().await.get("x", None).await.unwrap().kvs()[0].value(), b"y");
}

#[tokio::test]
async fn startup_errors_name_the_problem() {
    let dir = TempDir::new("errors");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let cases = [
        (format!("nats://127.0.0.1:{port}?dataDir={}", dir.path().display()), "embedded NATS server failed to start"),
        ("nats://?serverConfig=/nonexistent/nats.conf".to_string(), "serverConfig /nonexistent/nats.conf"),
        ("nats://h1:4222,nats://h2:4222".to_string(), "binds one address"),
    ];
    let bad_config = dir.path().join("bad.conf");
    std::fs::write(&bad_config, "jetstream { max_mem: banana }\n").unwrap();
    let bad = format!("nats://?serverConfig={}", bad_config.display());
    for (endpoint, expected) in cases.iter().map(|(e, m)| (e.as_str(), *m)).chain([(bad.as_str(), "serverConfig")]) {
        let out = std::process::Command::new(common::BIN)
            .env("KINE_METRICS_BIND_ADDRESS", "0")
            .args(["--listen-address", "127.0.0.1:0", "--endpoint", endpoint])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{endpoint}: should fail");
        assert!(stderr.contains(expected), "{endpoint}: expected {expected:?} in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[tokio::test]
async fn stdout_logging_prints_the_server_log() {
    let dir = TempDir::new("stdout");
    let endpoint = format!("nats://?stdoutLogging&dataDir={}", dir.path().display());
    let mut child = std::process::Command::new(common::BIN)
        .env("KINE_METRICS_BIND_ADDRESS", "0")
        .args(["--listen-address", "127.0.0.1:0", "--endpoint", &endpoint])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let stderr = || std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = String::new();
    while !seen.contains("Server is ready") {
        assert!(Instant::now() < deadline, "no server log on stdout:\n{seen}\nstderr:\n{}", stderr());
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("Starting nats-server"), "stdout:\n{seen}\nstderr:\n{}", stderr());
    assert!(seen.contains("Listening for client connections on 127.0.0.1:"), "{seen}");
}

/// SIGINT/SIGTERM under load: the Go runtime shares the process, so handlers need SA_ONSTACK
/// and nats-server must leave signals alone (with its own handler a second shutdown panics).
#[tokio::test]
async fn signals_under_load_shut_down_cleanly() {
    for (signals, expect_success) in [(vec!["SIGTERM"], true), (vec!["SIGINT", "SIGINT", "SIGINT"], false)] {
        let dir = TempDir::new("signals");
        let endpoint = format!("nats://?dataDir={}", dir.path().display());
        let mut server = Server::start(&["--endpoint", &endpoint]);
        let client = server.client().await;
        let load = tokio::spawn(async move {
            let mut kv = client.kv_client();
            for i in 0.. {
                if kv.put(format!("load/{}", i % 50), "x", None).await.is_err() {
                    break;
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        for s in &signals[..signals.len() - 1] {
            server.signal(s);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let status = server.stop(signals.last().unwrap()).await;
        load.abort();
        let log = server.log();
        assert!(status.code().is_some(), "killed by a signal: {status:?}\n{log}");
        assert_eq!(status.success(), expect_success, "{signals:?}: {status:?}\n{log}");
        assert!(!log.contains("panic"), "{log}");
        assert!(!log.contains("fatal error"), "{log}");
    }
}

/// Two nodes never open one store (nats-server would let them): the second is refused at
/// start, naming the store and its lock, and the first serves on.
#[tokio::test]
async fn a_second_node_on_the_same_store_is_refused() {
    let dir = TempDir::new("nats-lock");
    let endpoint = format!("nats://?dataDir={}", dir.path().display());
    let first = Server::start(&["--endpoint", &endpoint]);
    let mut c = first.client().await;
    c.put("/a", "1", None).await.unwrap();
    // Bounded: a second node that started would serve until killed.
    let (ok, _, log) = common::run(std::process::Command::new("timeout").args([
        "30",
        &common::server_bin(),
        "--endpoint",
        &endpoint,
        "--listen-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
    ]));
    let lock = dir.path().join("kine-rs.lock");
    assert!(
        !ok && log.contains(&format!("the NATS store {} is in use by another process", dir.path().display()))
            && log.contains(&lock.display().to_string()),
        "{log}"
    );
    let put = c.put("/a", "2", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), 3);
}
