//! One client request's time budget: the server runs each request inside [`request`], and the
//! datastore operations it makes (`metered.rs`, a snapshot's pages) read how much of it is spent.

use std::cell::Cell;
use tokio::time::Instant;

tokio::task_local! {
    /// When the client request being served began (set by [`request`]), or when its last
    /// operation without a bound ended ([`restart`]).
    static REQUEST_STARTED: Cell<Instant>;
}

/// Runs one client request: its short datastore operations share one request timeout.
pub fn request<F: Future>(f: F) -> tokio::task::futures::TaskLocalFuture<Cell<Instant>, F> {
    REQUEST_STARTED.scope(Cell::new(Instant::now()), f)
}

/// How long the request being served has run; `None` outside one.
pub(crate) fn spent() -> Option<std::time::Duration> {
    REQUEST_STARTED.try_with(|started| started.get().elapsed()).ok()
}

/// A fresh budget for what the request does next: after an operation with no bound of its
/// own (a compaction, a defragmentation), which may outlast the request timeout by design, the
/// short operations that complete the answer (its header's revision) must not fail for it.
pub(crate) fn restart() {
    let _ = REQUEST_STARTED.try_with(|started| started.set(Instant::now()));
}
