//! TLS on the etcd port, terminated here rather than inside tonic, so that a refused handshake
//! is explained in the log (tonic drops it at debug level): `incoming` turns a listener into
//! a stream of handshaken connections; `explain` says why one was refused and what fixes it.

mod explain;

pub use explain::{Explainer, Refusal};

use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// How long a client has to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more connections wait in the listen backlog.
const MAX_HANDSHAKES: usize = 256;

/// A listener whose connections are handshaken here.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, String)>> + Send;
    /// The first byte the client sent, without taking it (where the socket can peek).
    fn first_byte(io: &Self::Io) -> impl Future<Output = Option<u8>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<(Self::Io, String)> {
        let (stream, peer) = tokio::net::TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, peer.to_string()))
    }
    async fn first_byte(io: &Self::Io) -> Option<u8> {
        let mut byte = [0u8; 1];
        match io.peek(&mut byte).await {
            Ok(1) => Some(byte[0]),
            _ => None,
        }
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<(Self::Io, String)> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        Ok((stream, "a unix socket client".to_string()))
    }
    async fn first_byte(_: &Self::Io) -> Option<u8> {
        None
    }
}

/// The connections of `listener` once their TLS handshake succeeded. Each handshake runs on
/// its own task (a slow client delays no other); a refused one is explained by `explainer`.
/// Accepting stops when the stream is dropped.
pub fn incoming<L: Accept>(
    listener: L,
    config: Arc<rustls::ServerConfig>,
    explainer: Arc<Explainer>,
) -> ReceiverStream<io::Result<TlsStream<L::Io>>> {
    let (tx, rx) = mpsc::channel(16);
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (io, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection on the etcd port");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, tx, explainer) = (acceptor.clone(), tx.clone(), explainer.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, L::first_byte(&io)).await.ok().flatten();
                // A TLS connection opens with a handshake record (content type 22).
                if first.is_some_and(|b| b != 0x16) {
                    explainer.refused(&peer, &Refusal::PlainText);
                    return;
                }
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => explainer.refused(&peer, &Refusal::from_io(&e)),
                    Err(_) => tracing::debug!(%peer, "TLS handshake not completed within 10 s; connection closed"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
