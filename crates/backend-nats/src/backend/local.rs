//! Read barriers answered in-process: when the NATS server the bucket lives on runs in this
//! process (the embedded one) and leads the bucket's stream, its last sequence is read from it
//! directly instead of asking over NATS (STREAM.INFO), which is the same answer without a
//! round trip. Anything else (another server leads, the stream is elsewhere, the server is
//! going away) falls back to asking the leader. A replicated stream's leader answers only once
//! it has applied every entry committed when the question began (a follower may store, and its
//! node serve, a committed entry before the leader's apply does), and only while it heard from
//! a quorum of its replicas recently (`leader::LEASE`).

use kine_core::Revision;
use std::ffi::{CStr, CString};
use std::sync::Arc;
use std::time::Duration;

/// What the NATS server in this process says of a stream's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalHead {
    /// It does not answer for the stream's leader: ask over NATS.
    Elsewhere,
    /// It leads but has not yet applied every entry committed when the question began: ask
    /// again in a moment, with the same commit index.
    Applying,
    /// The stream's last sequence, and for a stream with other replicas how long ago this
    /// leader last heard from a quorum of them.
    Leader { last: u64, contact: Option<Duration> },
}

/// A NATS server running in this process.
pub trait LocalServer: Send + Sync + std::fmt::Debug {
    /// The account of this server's client connection `client_id`, if `server_id` is this
    /// server's id (the INFO a connection got names both).
    fn account_of(&self, server_id: &str, client_id: u64) -> Option<String>;
    /// The head of `stream` in `account` if this server answers for the stream's leader (alone
    /// outside a cluster; in a cluster, while it leads the stream). `commit` is 0 on the first
    /// call of a question, which notes there the leader's commit index that later calls wait
    /// for (`Applying` until it is applied).
    fn stream_head(&self, account: &CStr, stream: &CStr, commit: &mut u64) -> LocalHead;
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
    /// Waits (a few milliseconds at most, usually none) while the leader applies what was
    /// committed when the call began.
    pub(super) async fn head(&self) -> Option<(Revision, Option<Duration>)> {
        let mut commit = 0;
        for attempt in 0..APPLY_WAIT_STEPS {
            match self.server.stream_head(&self.account, &self.stream, &mut commit) {
                LocalHead::Elsewhere => return None,
                LocalHead::Leader { last, contact } => return Some((last as Revision, contact)),
                // A few yields first (the apply goroutine usually needs microseconds), then
                // the timer's millisecond.
                LocalHead::Applying if attempt == 0 => {
                    kine_core::metrics::metrics().barrier_waits.with_label_values(&["leader_applying"]).inc();
                    tokio::task::yield_now().await
                }
                LocalHead::Applying if attempt < 8 => tokio::task::yield_now().await,
                LocalHead::Applying => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
        tracing::debug!(commit, "the stream leader in this process is slow to apply; asking over NATS");
        None
    }
}

/// How many times a question waits for the local leader's apply (8 yields, then about 1 ms
/// each: some 50 ms) before it goes over NATS instead.
const APPLY_WAIT_STEPS: usize = 58;
