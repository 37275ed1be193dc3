//! The process: flag errors, the default endpoint, unix sockets, graceful shutdown,
//! and maintenance RPCs.

mod common;
use common::*;
use etcd_client::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn fails_with(args: &[&str], expected: &str) {
    let (ok, _, stderr) = run(Command::new(BIN).args(args).env_remove("RUST_LOG"));
    assert!(!ok, "kine-rs {args:?} should fail");
    assert!(stderr.contains(expected), "kine-rs {args:?}: expected {expected:?} in:\n{stderr}");
    assert!(!stderr.contains("panicked"), "kine-rs {args:?} panicked:\n{stderr}");
}

#[test]
fn bad_flags_fail_at_start_naming_the_problem() {
    let l = ["--listen-address", "127.0.0.1:0"];
    fails_with(
        &[&l[..], &["--endpoint", "redis://x"]].concat(),
        "--endpoint redis://…: unknown datastore scheme \"redis\"",
    );
    fails_with(&[&l[..], &["--endpoint", "nonsense"]].concat(), "invalid datastore endpoint");
    fails_with(&[&l[..], &["--endpoint", "sqlite://x.db?_journal=DELETE"]].concat(), "_journal=DELETE");
    fails_with(
        &[&l[..], &["--endpoint", "mysql://u:secret@tcp(h:x)/db"]].concat(),
        "--endpoint mysql://u:***@tcp(h:x)/db",
    );
    // A NATS endpoint's password or token is not shown either.
    let nats = "nats://admin:s3cret@h:4222?noEmbed&bogus=1";
    fails_with(&[&l[..], &["--endpoint", nats]].concat(), "--endpoint \"nats://admin:***@h:4222?noEmbed&bogus=1\"");
    let (_, _, stderr) = run(Command::new(BIN).args([&l[..], &["--endpoint", nats]].concat()).env_remove("RUST_LOG"));
    assert!(stderr.contains("unknown nats parameter \"bogus\"") && !stderr.contains("s3cret"), "{stderr}");
    fails_with(&[&l[..], &["--endpoint", "nats://t0ken@h:4222?noEmbed&replicas=9"]].concat(), "nats://***@h:4222");
    fails_with(&["--watch-progress-notify-interval", "0"], "--watch-progress-notify-interval");
    fails_with(&["--compact-interval", "5"], "missing unit");
    fails_with(&["--log-format", "xml"], "--log-format");
    fails_with(&["--emulated-etcd-version", "3.7"], "3.7 is not an etcd version such as 3.7.3");
    fails_with(&["--emulated-etcd-version", "3.4.31"], "3.4.31 is older than etcd 3.5");
    fails_with(&["--listen-address", "nowhere"], "--listen-address \"nowhere\"");
    fails_with(&["--auth-token", "jwt,sign-method=RS256"], "--auth-token");
    fails_with(&["--auth-token", "jwt,sign-method=RS256,pub-key=/nonexistent"], "pub-key /nonexistent");
    fails_with(&["--auth-token", "jwt,sign-method=HS256"], "an HMAC sign-method needs priv-key");
    fails_with(&["--auth-token", "magic"], "unknown token type \"magic\"");
    fails_with(&["--auth-token", "simple,ttl=5m"], "simple tokens take no options");
    fails_with(&["--bcrypt-cost", "3"], "--bcrypt-cost");
    fails_with(&["--auth-token-ttl", "0"], "--auth-token-ttl");
    fails_with(&[&l[..], &["--endpoint", "memory://", "--trusted-ca-file", "/x"]].concat(), "--trusted-ca-file needs");
    fails_with(
        &[&l[..], &["--endpoint", "memory://", "--server-cert-file", "/x"]].concat(),
        "--server-key-file is not",
    );
    fails_with(
        &[&l[..], &["--endpoint", "memory://", "--ca-file", "/x"]].concat(),
        "--ca-file configure TLS to a network datastore",
    );
    let dir = TempDir::new("badpath");
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let endpoint = format!("sqlite://{}/sub/state.db", file.display());
    fails_with(&[&l[..], &["--endpoint", &endpoint]].concat(), "--endpoint: cannot open SQLite database");
}

/// A stop signal while start-up waits for a database that does not answer (it would wait 30 s)
/// ends the wait at once.
#[tokio::test]
async fn sigterm_while_waiting_for_a_database_exits_promptly() {
    use std::io::{BufRead, BufReader};
    use std::time::Duration;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for endpoint in
        [format!("postgres://kine:pw@127.0.0.1:{port}/kine"), format!("mysql://kine:pw@tcp(127.0.0.1:{port})/kine")]
    {
        let mut child = spawn_starting(&endpoint);
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut log = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("not reachable yet") {
                    let _ = tx.send(());
                }
                log.push_str(&line);
                log.push('\n');
            }
            log
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            panic!("{endpoint}: no \"not reachable yet\" warning:\n{}", reader.join().unwrap());
        }
        let Some(status) = terminate_within(&mut child, Duration::from_secs(10)).await else {
            panic!("{endpoint}: kine-rs still running 10 s after SIGTERM:\n{}", reader.join().unwrap());
        };
        let log = reader.join().unwrap();
        assert!(status.success(), "{endpoint}: {status:?}\n{log}");
        assert!(log.contains("stopped during start-up") && !log.contains("pw@"), "{endpoint}:\n{log}");
    }
}

#[test]
fn env_vars_configure_like_flags() {
    let (ok, _, stderr) =
        run(Command::new(BIN).env("KINE_ENDPOINT", "bogus://").env("KINE_LISTEN_ADDRESS", "127.0.0.1:0"));
    assert!(!ok);
    assert!(stderr.contains("unknown datastore scheme \"bogus\""), "{stderr}");
}

#[tokio::test]
async fn default_endpoint_is_sqlite_under_db_with_private_dir() {
    let dir = TempDir::new("default");
    let mut server = Server::start_in(Some(dir.path()), &[]);
    assert!(server.log().contains("backend=\"sqlite\""), "{}", server.log());
    let mut c = server.client().await;
    c.put("x", "1", None).await.unwrap();
    let db_dir = dir.path().join("db");
    assert!(db_dir.join("state.db").exists());
    assert_eq!(std::fs::metadata(&db_dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert!(server.stop("INT").await.success());
}

#[tokio::test]
async fn graceful_shutdown_under_load_keeps_every_acknowledged_write() {
    let dir = TempDir::new("shutdown");
    let endpoint = db_endpoint(dir.path());
    let mut server = Server::start(&["--endpoint", &endpoint]);
    let c = server.client().await;
    let mut watcher = c.clone();
    let mut w = watcher.watch("/s/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    w.message().await.unwrap();
    let mut writers = Vec::new();
    for t in 0..8 {
        let mut c = c.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0.. {
                match c.put(format!("/s/{t}/{i}"), "v", None).await {
                    Ok(_) => acked.push(format!("/s/{t}/{i}")),
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let status = server.stop("TERM").await;
    assert!(status.success(), "exit status {status:?}; log:\n{}", server.log());
    let log = server.log();
    assert!(log.contains("received SIGTERM") && log.contains("kine-rs stopped"), "{log}");
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(!acked.is_empty());
    let server = Server::start(&["--endpoint", &endpoint]);
    let mut c = server.client().await;
    let r = c.get("/s/", Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    let stored: std::collections::HashSet<String> =
        r.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).collect();
    for key in &acked {
        assert!(stored.contains(key), "acknowledged write {key} lost");
    }
}

#[tokio::test]
async fn second_signal_exits_at_once() {
    let (mut server, _dir) = sqlite_server(&[]);
    server.signal("INT");
    server.signal("INT");
    let status = server.stop("INT").await;
    assert!(status.code() == Some(0) || status.code() == Some(1), "{status:?}");
}

#[tokio::test]
async fn unix_socket_with_mode_0600_and_etcdctl() {
    let dir = TempDir::new("unix");
    let endpoint = db_endpoint(dir.path());
    let mut server =
        Server::start_in(Some(dir.path()), &["--listen-address", "unix://kine.sock", "--endpoint", &endpoint]);
    assert!(server.log().contains("clients connect to unix://kine.sock"), "{}", server.log());
    let sock = dir.path().join("kine.sock");
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
    let etcdctl = |args: &[&str]| {
        run(Command::new("etcdctl")
            .current_dir(dir.path())
            .env("ETCDCTL_API", "3")
            .arg("--endpoints=unix://kine.sock")
            .args(args))
    };
    let (ok, out, err) = etcdctl(&["put", "sock", "works"]);
    assert!(ok, "etcdctl put over the unix socket failed (is etcdctl installed?): {out} {err}");
    let (ok, out, _) = etcdctl(&["get", "sock", "--print-value-only"]);
    assert!(ok);
    assert_eq!(out.trim(), "works");
    assert!(server.stop("TERM").await.success());
    assert!(!sock.exists(), "socket removed at shutdown");
}

#[tokio::test]
async fn maintenance_status_defragment_alarm_members() {
    let (server, _dir) = sqlite_server(&["--emulated-etcd-version", "3.6.99"]);
    let mut c = server.client().await;
    for i in 0..200 {
        c.put(format!("big/{i}"), vec![b'x'; 4096], None).await.unwrap();
    }
    let s = c.status().await.unwrap();
    assert_eq!(s.version(), "3.6.99");
    assert_eq!(s.leader(), s.header().unwrap().member_id());
    assert_eq!(s.raft_index(), 201);
    assert!(s.db_size() > 800_000, "db size {}", s.db_size());
    c.delete("big/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    c.compact(202, None).await.unwrap();
    let before = c.status().await.unwrap();
    c.defragment().await.unwrap();
    let after = c.status().await.unwrap();
    assert!(
        after.db_size() < before.db_size() / 4,
        "defragment reclaimed space: {} -> {}",
        before.db_size(),
        after.db_size()
    );
    let alarms = c.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap();
    assert!(alarms.alarms().is_empty());
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1);
    assert_eq!(members.members()[0].client_urls(), std::slice::from_ref(&server.url));
}

/// etcdctl 3.4 sends the dialled endpoint as the HTTP/2 `:authority` (an absolute socket path,
/// or `http://host:port` for `endpoint status` and `defrag`); stock h2 reset those streams.
#[tokio::test]
async fn etcdctl_authority_forms_are_accepted() {
    let dir = TempDir::new("authority");
    let sock = dir.path().join("abs.sock");
    let listen = format!("unix://{}", sock.display());
    let mut server = Server::start(&["--listen-address", &listen, "--endpoint", "memory://"]);
    let etcdctl = |endpoint: String, args: &[&str]| {
        run(Command::new("etcdctl").env("ETCDCTL_API", "3").arg(format!("--endpoints={endpoint}")).args(args))
    };
    let (ok, out, err) = etcdctl(listen.clone(), &["put", "abs", "path"]);
    assert!(ok, "put over an absolute unix socket path: {out}{err}");
    let (ok, out, err) = etcdctl(listen.clone(), &["endpoint", "status"]);
    assert!(ok && out.contains("3.7.3"), "endpoint status over unix: {out}{err}");
    assert!(server.stop("TERM").await.success());

    let (mut server, _d) = sqlite_server(&[]);
    let (ok, out, err) = etcdctl(server.url.clone(), &["endpoint", "status"]);
    assert!(ok && out.contains("3.7.3"), "endpoint status with an http:// endpoint: {out}{err}");
    let (ok, out, err) = etcdctl(server.url.clone(), &["defrag"]);
    assert!(ok && out.contains("Finished defragmenting"), "defrag with an http:// endpoint: {out}{err}");
    assert!(server.stop("TERM").await.success());
}

/// A database whose directory takes no new file (a container's read-only or foreign-owned
/// volume) is refused naming the directory and the fix, not only SQLite's "unable to open".
#[test]
fn a_database_directory_that_takes_no_file_is_refused_naming_the_fix() {
    let dir = TempDir::new("read-only-dir");
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    // Root writes through permission bits: a read-only mount then; anyone else: mode 0500.
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap();
    if root {
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", "ro", "tmpfs"]).arg(&ro).status().unwrap();
        assert!(status.success(), "mount a read-only tmpfs");
    } else {
        std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o500)).unwrap();
    }
    let endpoint = format!("sqlite://{}/state.db", ro.display());
    let (ok, _, err) =
        run(Command::new(server_bin()).args(["--endpoint", &endpoint, "--listen-address", "127.0.0.1:0"]));
    if root {
        let _ = Command::new("umount").arg(&ro).status();
    }
    assert!(!ok, "kine-rs started on a directory that takes no file");
    assert!(err.contains(&format!("the directory {} takes no new file", ro.display())), "{err}");
    assert!(err.contains("make it writable for this process"), "{err}");
}

/// One SQLite database, one serving kine-rs: a second process on the same file is refused at
/// start naming the first one's pid (both would hand out the same revisions); once the first
/// stopped, it starts. Reading the file meanwhile (`inspect`) is not refused.
#[tokio::test]
async fn a_second_kine_rs_on_one_sqlite_file_is_refused_naming_the_first() {
    let dir = TempDir::new("sqlite-twice");
    let endpoint = db_endpoint(dir.path());
    let mut first = Server::start(&["--endpoint", &endpoint]);
    first.client().await.put("k", "v", None).await.unwrap();
    let (ok, _, err) = run(Command::new(BIN).args(["--endpoint", &endpoint, "--listen-address", "127.0.0.1:0"]));
    assert!(!ok, "a second kine-rs served the same SQLite file");
    assert!(err.contains(&format!("is open for writing in process {}", first.child.id())), "{err}");
    assert!(err.contains("one SQLite database is served by one kine-rs at a time"), "{err}");
    let (ok, out, err) = run(Command::new(BIN).args(["--endpoint", &endpoint, "inspect", "get", "k"]));
    assert!(ok && out.contains('v'), "inspect while served: {err}");
    assert!(first.stop("TERM").await.success());
    let second = Server::start(&["--endpoint", &endpoint]);
    let got = second.client().await.get("k", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"v");
}
