//! systemd's readiness protocol (`sd_notify`): under a unit of `Type=notify`, systemd sets
//! `NOTIFY_SOCKET` and counts the service as started only once it is told `READY=1`, so units
//! ordered after kine-rs (kube-apiserver, k3s) start when it serves, not when its process
//! exists. `STOPPING=1` when shutdown begins (the first SIGTERM or SIGINT). Outside systemd
//! (no `NOTIFY_SOCKET`) nothing is sent; a message that cannot be sent is logged at warn and
//! changes nothing else.

use std::os::unix::net::UnixDatagram;

/// Tells systemd `state` (`READY=1`, `STOPPING=1`, `STATUS=…`), if it listens.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(socket = ?socket, error = %e, "cannot tell systemd {state:?} (NOTIFY_SOCKET)");
    }
}

fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let sender = UnixDatagram::unbound()?;
    let bytes = socket.as_encoded_bytes();
    // `@name`: a socket in the abstract namespace.
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sender.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sender.send_to(state.as_bytes(), socket)?;
    }
    Ok(())
}
