//! Read barriers answered in-process: when the NATS server the bucket lives on runs in this
//! process (the embedded one) and leads the bucket's stream, its last sequence is read from it
//! directly instead of asking over NATS (STREAM.INFO), which is the same answer without a
//! round trip. Anything else (another server leads, the stream is elsewhere, the server is
//! going away) falls back to asking the leader. A replicated stream's leader answers only while
//! it heard from a quorum of its replicas recently (`leader::LEASE`).

use kine_core::Revision;
use std::ffi::{CStr, CString};
use std::sync::Arc;
use std::time::Duration;

/// A NATS server running in this process.
pub trait LocalServer: Send + Sync + std::fmt::Debug {
    /// The account of this server's client connection `client_id`, if `server_id` is this
    /// server's id (the INFO a connection got names both).
    fn account_of(&self, server_id: &str, client_id: u64) -> Option<String>;
    /// The last sequence of `stream` in `account` if this server answers for the stream's
    /// leader (alone outside a cluster; in a cluster, while it leads the stream), and for a
    /// stream with other replicas how long ago it last heard from a quorum of them
    /// (`leader::LEASE`).
    fn stream_last_seq(&self, account: &CStr, stream: &CStr) -> Option<(u64, Option<Duration>)>;
}

/// The bucket's stream as the local server sees it.
pub(super) struct LocalStream {
    server: Arc<dyn LocalServer>,
    account: CString,
    stream: CString,
}

impl LocalStream {
    /// Binds `stream` of the account `client` connected with, if `client` is connected to
    /// `server`.
    pub(super) fn bind(server: Arc<dyn LocalServer>, client: &async_nats::Client, stream: &str) -> Option<LocalStream> {
        let info = client.try_server_info()?;
        let account = server.account_of(&info.server_id, info.client_id)?;
        tracing::debug!(%account, stream, "read barriers are answered by the NATS server in this process while it leads the stream");
        Some(LocalStream { server, account: CString::new(account).ok()?, stream: CString::new(stream).ok()? })
    }

    /// The stream's last sequence, if the local server answers for its leader now, and for a
    /// replicated stream how long ago that leader last heard from a quorum of the replicas.
    pub(super) fn head(&self) -> Option<(Revision, Option<Duration>)> {
        self.server.stream_last_seq(&self.account, &self.stream).map(|(s, c)| (s as Revision, c))
    }
}
