//! The safe API around the linked-in nats-server: start, ready, info, idempotent shutdown,
//! and one server per process. (One test: a process holds one server for its lifetime.)

use kine_nats_embed::{Credentials, Options, Readiness, StreamHead};
use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

#[test]
fn start_ready_shutdown_once() {
    let dir = std::env::temp_dir().join(format!("kine-nats-embed-{}", std::process::id()));
    let options = Options {
        host: None,
        port: None,
        loopback_only: false,
        config_file: None,
        store_dir: None,
        default_store_dir: dir.clone(),
        credentials: Credentials::UserPassword("u".into(), "p".into()),
        stdout_logging: false,
        sync_always: true,
        sync_interval: None,
        max_payload: Some(3 << 20),
    };
    let server = kine_nats_embed::start(&options).expect("start");
    assert_eq!(server.wait_ready(Duration::from_secs(20)), Readiness::Ready);
    let info = server.info().expect("info");
    assert_eq!(info.listen_host, "127.0.0.1");
    assert!(info.listen_port > 0);
    assert_eq!(info.client_url, format!("nats://127.0.0.1:{}", info.listen_port));
    assert!(info.uses_given_credentials());
    assert!(info.store_dir.starts_with(dir.to_str().unwrap()), "{}", info.store_dir);
    assert!(info.sync_always);
    assert_eq!(info.max_payload, 3 << 20);

    // The given user and password are required.
    let connect = |creds: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", info.listen_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        s.write_all(format!("CONNECT {{\"verbose\":false{creds}}}\r\nPING\r\n").as_bytes()).unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        line
    };
    assert!(connect("").contains("Authorization Violation"));
    assert!(connect(",\"user\":\"u\",\"pass\":\"p\"").starts_with("PONG"));

    // The stream state read in-process is what the server's JetStream API answers.
    stream_state_in_process(&server, info.listen_port);

    // A second server in the same process is refused.
    let err = kine_nats_embed::start(&options).err().expect("second start must fail");
    assert!(err.contains("already started"), "{err}");

    server.shutdown();
    server.shutdown();
    assert_eq!(server.stream_last_seq(c"$G", c"T", &mut 0), StreamHead::Elsewhere, "the server is gone");
    assert!(std::net::TcpStream::connect(("127.0.0.1", info.listen_port)).is_err());
    assert!(server.info().is_err());
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// A raw NATS connection: the INFO it got, and request/answer.
struct Raw {
    stream: std::net::TcpStream,
    reader: BufReader<std::net::TcpStream>,
    info: String,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut info = String::new();
        reader.read_line(&mut info).unwrap();
        let mut raw = Raw { stream, reader, info };
        raw.send("CONNECT {\"verbose\":false,\"user\":\"u\",\"pass\":\"p\"}\r\nSUB _INBOX.r 1\r\nPING\r\n");
        let mut pong = String::new();
        raw.reader.read_line(&mut pong).unwrap();
        assert!(pong.starts_with("PONG"), "{pong}");
        raw
    }

    fn send(&mut self, text: &str) {
        self.stream.write_all(text.as_bytes()).unwrap();
    }

    fn request(&mut self, subject: &str, payload: &str) -> String {
        self.send(&format!("PUB {subject} _INBOX.r {}\r\n{payload}\r\n", payload.len()));
        let mut line = String::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            assert!(!line.starts_with("-ERR"), "{line}");
            if line.starts_with("PING") {
                self.send("PONG\r\n");
            }
            if line.starts_with("MSG ") {
                let size: usize = line.split_whitespace().last().unwrap().parse().unwrap();
                let mut body = vec![0; size + 2];
                std::io::Read::read_exact(&mut self.reader, &mut body).unwrap();
                return String::from_utf8_lossy(&body[..size]).into_owned();
            }
        }
    }

    /// `"key":"text"` or `"key":number` from the INFO line.
    fn info_field(&self, key: &str) -> String {
        let at = self.info.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
        self.info[at..].trim_start_matches('"').split(['"', ',', '}']).next().unwrap().to_string()
    }
}

fn stream_state_in_process(server: &kine_nats_embed::EmbeddedServer, port: u16) {
    let mut c = Raw::connect(port);
    let (server_id, client_id) = (c.info_field("server_id"), c.info_field("client_id").parse::<u64>().unwrap());
    assert_eq!(server.account_of(&server_id, client_id).as_deref(), Some("$G"));
    assert_eq!(server.account_of("another server", client_id), None);
    assert_eq!(server.account_of(&server_id, client_id + 1000), None);
    let created = c.request("$JS.API.STREAM.CREATE.T", r#"{"name":"T","subjects":["t.>"],"storage":"memory"}"#);
    assert!(created.contains("stream_create_response") && !created.contains("\"error\""), "{created}");
    let leader = |last| StreamHead::Leader { last, contact: None };
    assert_eq!(server.stream_last_seq(c"$G", c"T", &mut 0), leader(0), "a stream without other replicas");
    for i in 1..=5 {
        let ack = c.request("t.x", "v");
        assert!(ack.contains(&format!("\"seq\":{i}")), "{ack}");
        assert_eq!(server.stream_last_seq(c"$G", c"T", &mut 0), leader(i));
    }
    let info = c.request("$JS.API.STREAM.INFO.T", "");
    assert!(info.contains("\"last_seq\":5"), "{info}");
    assert_eq!(server.stream_last_seq(c"$G", c"U", &mut 0), StreamHead::Elsewhere, "no such stream");
    assert_eq!(server.stream_last_seq(c"NOBODY", c"T", &mut 0), StreamHead::Elsewhere, "no such account");
}
