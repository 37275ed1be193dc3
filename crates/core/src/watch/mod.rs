//! Watch fan-out: one session per client watch stream, fed by the backend's live feed.
//!
//! Each watch remembers `next`, the first revision it has not delivered yet, and the session
//! remembers `pos`, the newest revision it knows to be committed. A watch is *synced* when
//! `next > pos`: it has delivered every event up to `pos`. Synced watches are served from the
//! live feed; the others (a start revision in the past, or a feed that lagged) read the gap from
//! backend history in windows until they are synced. So a slow client is never dropped: it just
//! catches up from history. Progress notifications report `pos` only while every watch is
//! synced, so they never claim a revision whose events were not delivered.
//!
//! A synced watch whose `next` is `pos + 1` *follows* the feed: its `next` is then implied
//! (`pos + 1`, kept as the feed advances) and it sits in an index of the keys watched
//! ([`Followers`]), so a revision costs a lookup per event, not a check per watch. The other
//! watches (behind, or waiting for a future start revision) are `explicit`, each with its own
//! `next`. A gap in the feed or a lagging feed turns every follower explicit again.

mod index;
mod session;

use crate::backend::Backend;
use crate::shutdown::Shutdown;
use crate::types::{Event, KeyRange, Revision};
use session::Session;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCreate {
    /// 0 lets the server choose.
    pub watch_id: i64,
    pub range: KeyRange,
    /// 0 means "from now".
    pub start_revision: Revision,
    pub prev_kv: bool,
    pub progress_notify: bool,
    pub no_put: bool,
    pub no_delete: bool,
    pub fragment: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchRequest {
    Create(WatchCreate),
    Cancel(i64),
    Progress,
}

/// Watch id of a progress notification that answers a progress request for the whole stream.
pub const BROADCAST_WATCH_ID: i64 = -1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchResponse {
    Created {
        watch_id: i64,
        revision: Revision,
    },
    /// The create was refused: etcd answers with a created-and-canceled response.
    Rejected {
        watch_id: i64,
        revision: Revision,
        reason: String,
    },
    Events {
        watch_id: i64,
        revision: Revision,
        events: Vec<Event>,
        fragment: bool,
    },
    Progress {
        watch_id: i64,
        revision: Revision,
    },
    Canceled {
        watch_id: i64,
        revision: Revision,
        compact_revision: Revision,
        reason: String,
    },
}

#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Period of progress notifications for watches created with `progress_notify`.
    pub progress_interval: Duration,
}

/// Runs one watch stream until the client goes away or shutdown. `requests` closing ends it.
pub async fn run_session(
    backend: Arc<dyn Backend>,
    options: WatchOptions,
    mut requests: mpsc::Receiver<WatchRequest>,
    out: mpsc::Sender<WatchResponse>,
    mut shutdown: Shutdown,
) {
    // Subscribe before reading the revision: nothing committed after `pos` can be missed.
    let feed = backend.subscribe();
    let pos = match backend.revisions().await {
        Ok(r) => r.current,
        Err(e) => {
            tracing::debug!(error = %e, "watch session cannot start");
            return;
        }
    };
    crate::metrics::metrics().watch_streams.inc();
    let mut session = Session::new(backend, feed, pos, out);
    let mut ticker = tokio::time::interval(options.progress_interval);
    ticker.tick().await;
    loop {
        let unsynced = session.first_unsynced();
        let result = tokio::select! {
            biased;
            _ = shutdown.wait() => return,
            req = requests.recv() => match req {
                Some(req) => session.handle(req).await,
                None => return,
            },
            item = session.feed.recv() => session.on_feed(item).await,
            _ = ticker.tick() => session.on_tick().await,
            _ = std::future::ready(()), if unsynced.is_some() => {
                session.catch_up(unsynced.unwrap_or_default()).await
            }
        };
        if result.is_err() {
            return; // the client is gone
        }
        if session.flush_progress().await.is_err() {
            return;
        }
    }
}
