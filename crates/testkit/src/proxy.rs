//! A TCP forwarder on a loopback port, for tests that cut a link and restore it: `cut` closes
//! every connection through it and refuses new ones (the peers see a dead link, as with a
//! network fault), `restore` accepts again. In front of an HTTP server (S3) it can also answer
//! every request itself with an error status (`answer_with`), as a struggling server does.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Proxy {
    /// Where clients connect.
    pub port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    bind: IpAddr,
    target: u16,
    cut: AtomicBool,
    /// An HTTP status to answer every request with instead of forwarding (0: forward).
    answer: AtomicU16,
    stopped: AtomicBool,
    /// Both ends of every forwarded connection, to close them on `cut`.
    open: Mutex<Vec<TcpStream>>,
}

impl Proxy {
    /// Forwards `127.0.0.1:<port>` (a free port) to `127.0.0.1:<target>`.
    pub fn start(target: u16) -> Proxy {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), target)
    }

    /// Forwards `<bind>:<port>` (a free port) to `127.0.0.1:<target>`: a datastore on loopback
    /// made reachable from another network namespace through an address of the host's.
    pub fn start_on(bind: IpAddr, target: u16) -> Proxy {
        let port = crate::nats::free_port();
        let shared = Arc::new(Shared {
            bind,
            target,
            cut: AtomicBool::new(false),
            answer: AtomicU16::new(0),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        std::thread::spawn(move || accept_loop(port, s));
        // Ready once it accepts.
        for _ in 0..200 {
            if TcpStream::connect((bind, port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Proxy { port, shared }
    }

    /// Closes every connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Answers every HTTP request with `status` (500: S3's InternalError, 503: SlowDown) from
    /// now on, on new connections; open ones are closed. `forward` ends it.
    pub fn answer_with(&self, status: u16) {
        self.shared.answer.store(status, Ordering::SeqCst);
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Forwards requests again after [`Proxy::answer_with`] (the connections it answered on are
    /// closed).
    pub fn forward(&self) {
        self.shared.answer.store(0, Ordering::SeqCst);
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.cut();
    }
}

fn accept_loop(port: u16, shared: Arc<Shared>) {
    let mut listener: Option<TcpListener> = None;
    while !shared.stopped.load(Ordering::SeqCst) {
        if shared.cut.load(Ordering::SeqCst) {
            // Refuse connections while cut: no listener at all.
            listener = None;
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let l = match &listener {
            Some(l) => l,
            None => match TcpListener::bind((shared.bind, port)) {
                Ok(l) => {
                    l.set_nonblocking(true).expect("nonblocking listener");
                    listener.insert(l)
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            },
        };
        match l.accept() {
            Ok((client, _)) if shared.answer.load(Ordering::SeqCst) != 0 => {
                let status = shared.answer.load(Ordering::SeqCst);
                let _ = client.set_nonblocking(false);
                if let Ok(c) = client.try_clone() {
                    shared.open.lock().unwrap().push(c);
                }
                std::thread::spawn(move || answer(client, status));
            }
            Ok((client, _)) => {
                let Ok(server) = TcpStream::connect(("127.0.0.1", shared.target)) else { continue };
                let _ = client.set_nonblocking(false);
                let mut open = shared.open.lock().unwrap();
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        open.push(c);
                    }
                }
                drop(open);
                pipe(&client, &server);
                pipe(&server, &client);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// Answers each HTTP/1.1 request on `client` with `status` and an S3 error body, reading (and
/// dropping) each request's body, until the client closes.
fn answer(client: TcpStream, status: u16) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(mut writer) = client.try_clone() else { return };
    let mut reader = std::io::BufReader::new(client);
    let (reason, code) = match status {
        503 => ("Service Unavailable", "SlowDown"),
        500 => ("Internal Server Error", "InternalError"),
        _ => ("Error", "InternalError"),
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>test proxy</Message></Error>"
    );
    loop {
        // The request head, then its body (Content-Length bytes).
        let mut length = 0usize;
        let mut line = String::new();
        let mut started = false;
        loop {
            line.clear();
            match std::io::BufRead::read_line(&mut reader, &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" && started {
                break;
            }
            started = true;
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        if std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink()).is_err() {
            return;
        }
        let response = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
