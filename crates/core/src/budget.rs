//! One client request's time budget: the server runs each request inside [`request`], and the
//! datastore operations it makes (`metered.rs`, a snapshot's pages) read how much of it is spent.

tokio::task_local! {
    /// When the client request being served began (set by [`request`]).
    static REQUEST_STARTED: tokio::time::Instant;
}

/// Runs one client request: its short datastore operations share one request timeout.
pub fn request<F: Future>(f: F) -> tokio::task::futures::TaskLocalFuture<tokio::time::Instant, F> {
    REQUEST_STARTED.scope(tokio::time::Instant::now(), f)
}

/// How long the request being served has run; `None` outside one.
pub(crate) fn spent() -> Option<std::time::Duration> {
    REQUEST_STARTED.try_with(tokio::time::Instant::elapsed).ok()
}
