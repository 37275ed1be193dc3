//! The in-process stream head in a cluster: the embedded server joined by routes with two
//! nats-server processes. Its leader answers only once it has applied what it had committed
//! when asked (`Applying` until then), a stream without other replicas answers at once, and a
//! follower never answers. (One test: a process holds one server for its lifetime.)

use kine_nats_embed::{Credentials, Options, Readiness, StreamHead};
use kine_testkit::TempDir;
use kine_testkit::nats::{free_port, nats_server_bin};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A nats-server process, killed on drop.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(name: &str, cluster: &[u16], i: usize, store: &std::path::Path) -> String {
    let routes: Vec<String> = cluster.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect();
    format!(
        "server_name: {name}\nserver_tags: [\"{name}\"]\njetstream {{ store_dir: \"{}\" }}\n\
         cluster {{ name: c, listen: 127.0.0.1:{}, routes: [{}] }}\n",
        store.display(),
        cluster[i],
        routes.join(", ")
    )
}

/// A raw client of the embedded server: request and answer.
struct Raw {
    stream: std::net::TcpStream,
    reader: BufReader<std::net::TcpStream>,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut info = String::new();
        reader.read_line(&mut info).unwrap();
        let mut raw = Raw { stream, reader };
        raw.stream
            .write_all(b"CONNECT {\"verbose\":false,\"user\":\"u\",\"pass\":\"p\"}\r\nSUB _INBOX.r 1\r\n")
            .unwrap();
        raw
    }

    fn request(&mut self, subject: &str, payload: &str) -> String {
        let cmd = format!("PUB {subject} _INBOX.r {}\r\n{payload}\r\n", payload.len());
        self.stream.write_all(cmd.as_bytes()).unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            assert!(!line.starts_with("-ERR"), "{line}");
            if line.starts_with("PING") {
                self.stream.write_all(b"PONG\r\n").unwrap();
            }
            if line.starts_with("MSG ") {
                let size: usize = line.split_whitespace().last().unwrap().parse().unwrap();
                let mut body = vec![0; size + 2];
                std::io::Read::read_exact(&mut self.reader, &mut body).unwrap();
                return String::from_utf8_lossy(&body[..size]).into_owned();
            }
        }
    }

    /// Asks until the answer has no error (a forming cluster refuses requests for a while).
    fn until_ok(&mut self, subject: &str, payload: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = self.request(subject, payload);
            if !answer.contains("\"error\"") {
                return answer;
            }
            assert!(Instant::now() < deadline, "{subject}: {answer}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The head of `stream` as a read barrier asks for it: again while the leader applies.
fn head(server: &kine_nats_embed::EmbeddedServer, stream: &std::ffi::CStr) -> (StreamHead, usize) {
    let mut commit = 0;
    for waited in 0..10_000 {
        match server.stream_last_seq(c"$G", stream, &mut commit) {
            StreamHead::Applying => std::thread::yield_now(),
            other => return (other, waited),
        }
    }
    panic!("the leader did not apply its commit index {commit}");
}

#[test]
fn a_clustered_leader_answers_once_it_applied_what_it_committed() {
    let dir = TempDir::new("embed-cluster");
    let cluster: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut peers = Vec::new();
    for i in 1..3 {
        let name = format!("n{i}");
        let conf = dir.path().join(format!("{name}.conf"));
        std::fs::write(&conf, config(&name, &cluster, i, &dir.path().join(&name))).unwrap();
        let child = Command::new(nats_server_bin())
            .args(["-c", conf.to_str().unwrap(), "-a", "127.0.0.1", "-p", &free_port().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        peers.push(Peer(child));
    }
    let conf = dir.path().join("n0.conf");
    std::fs::write(&conf, config("n0", &cluster, 0, &dir.path().join("n0"))).unwrap();
    let options = Options {
        host: None,
        port: None,
        loopback_only: true,
        config_file: Some(conf),
        store_dir: None,
        default_store_dir: dir.path().join("unused"),
        credentials: Credentials::UserPassword("u".into(), "p".into()),
        stdout_logging: false,
        sync_always: false,
        sync_interval: None,
        max_payload: None,
    };
    let server = kine_nats_embed::start(&options).expect("start");
    assert_eq!(server.wait_ready(Duration::from_secs(60)), Readiness::Ready);
    let mut c = Raw::connect(server.info().unwrap().listen_port);

    // R3, led by the embedded server.
    c.until_ok("$JS.API.STREAM.CREATE.T", r#"{"name":"T","subjects":["t.>"],"num_replicas":3}"#);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.request("$JS.API.STREAM.INFO.T", "").contains("\"leader\":\"n0\"") {
        assert!(Instant::now() < deadline, "n0 does not lead T");
        c.request("$JS.API.STREAM.LEADER.STEPDOWN.T", r#"{"placement":{"preferred":"n0"}}"#);
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut waits = 0;
    for i in 1..=200u64 {
        let ack = c.request("t.x", "v");
        assert!(ack.contains(&format!("\"seq\":{i}")), "{ack}");
        let (answer, waited) = head(&server, c"T");
        waits += waited;
        match answer {
            StreamHead::Leader { last, contact } => {
                assert!(last >= i, "answered {last} after {i} was acknowledged");
                assert!(contact.is_some(), "a replicated stream's leader names its quorum contact");
            }
            other => panic!("the leader answered {other:?}"),
        }
    }
    eprintln!("200 questions waited {waits} times for the leader's apply");

    // R1 on the embedded server, in the cluster: no followers, answered at once.
    c.until_ok("$JS.API.STREAM.CREATE.U", r#"{"name":"U","subjects":["u.>"],"placement":{"tags":["n0"]}}"#);
    c.request("u.x", "v");
    assert_eq!(head(&server, c"U").0, StreamHead::Leader { last: 1, contact: None });

    // Another server leads T: the embedded one never answers for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.request("$JS.API.STREAM.INFO.T", "").contains("\"leader\":\"n0\"") {
        assert!(Instant::now() < deadline, "n0 still leads T");
        c.request("$JS.API.STREAM.LEADER.STEPDOWN.T", "");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(head(&server, c"T").0, StreamHead::Elsewhere);
    server.shutdown();
    drop(peers);
}
