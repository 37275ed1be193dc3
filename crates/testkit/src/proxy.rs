//! A TCP forwarder on a loopback port, for tests that cut a link and restore it: `cut` closes
//! every connection through it and refuses new ones (the peers see a dead link, as with a
//! network fault), `restore` accepts again.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
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
