//! One watch stream's state: its watches, its position on the live feed, catch-up from
//! history and progress notifications (the rules are in the module above).

use super::index::Followers;
use super::{BROADCAST_WATCH_ID, WatchCreate, WatchRequest, WatchResponse};
use crate::backend::Backend;
use crate::error::Error;
use crate::types::{Event, EventKind, KeyRange, Revision, RevisionEvents};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc};

/// Revisions read from history per catch-up step.
const CATCH_UP_WINDOW: Revision = 1000;
/// Event payload bytes gathered into one catch-up response before it is sent.
const RESPONSE_BYTES: usize = 1 << 20;

struct Watch {
    range: KeyRange,
    /// The start revision asked for (0: from now).
    start: Revision,
    /// The first revision not delivered yet; while `following`, `pos + 1` instead.
    next: Revision,
    following: bool,
    prev_kv: bool,
    progress_notify: bool,
    no_put: bool,
    no_delete: bool,
    fragment: bool,
    /// No events sent since the last periodic progress tick.
    idle: bool,
}

impl Watch {
    fn select(&self, events: &[Event]) -> Vec<Event> {
        events
            .iter()
            .filter(|e| self.range.contains(&e.kv.key))
            .filter(|e| !(self.no_put && e.kind == EventKind::Put || self.no_delete && e.kind == EventKind::Delete))
            .map(|e| Event {
                kind: e.kind,
                kv: e.kv.clone(),
                // Not cloned at all unless asked for.
                prev_kv: if self.prev_kv { e.prev_kv.clone() } else { None },
            })
            .collect()
    }
}

/// The client stopped listening.
pub(super) struct Gone;

pub(super) struct Session {
    backend: Arc<dyn Backend>,
    pub(super) feed: broadcast::Receiver<Arc<RevisionEvents>>,
    pos: Revision,
    watches: BTreeMap<i64, Watch>,
    /// The watches following the feed, by what they watch.
    followers: Followers,
    /// The other watches (their own `next`).
    explicit: BTreeSet<i64>,
    next_id: i64,
    /// Header revisions on a stream never go backwards.
    last_header: Revision,
    /// A progress request waiting for `pos` to reach this revision with every watch synced.
    progress_target: Option<Revision>,
    /// A periodic tick waiting the same way.
    tick_target: Option<Revision>,
    out: mpsc::Sender<WatchResponse>,
}

/// Open streams and watchers leave the gauges with the session.
impl Drop for Session {
    fn drop(&mut self) {
        let m = crate::metrics::metrics();
        m.watch_streams.dec();
        m.watchers.sub(self.watches.len() as i64);
    }
}

impl Session {
    pub(super) fn new(
        backend: Arc<dyn Backend>,
        feed: broadcast::Receiver<Arc<RevisionEvents>>,
        pos: Revision,
        out: mpsc::Sender<WatchResponse>,
    ) -> Session {
        Session {
            backend,
            feed,
            pos,
            watches: BTreeMap::new(),
            followers: Followers::default(),
            explicit: BTreeSet::new(),
            next_id: 0,
            last_header: 0,
            progress_target: None,
            tick_target: None,
            out,
        }
    }

    fn remove_watch(&mut self, id: i64) -> Option<Watch> {
        let removed = self.watches.remove(&id);
        if let Some(w) = &removed {
            crate::metrics::metrics().watchers.dec();
            if w.following {
                self.followers.remove(id, &w.range);
            } else {
                self.explicit.remove(&id);
            }
        }
        removed
    }

    /// An explicit watch that has delivered everything up to `pos` follows the feed from now.
    fn follow_if_synced(&mut self, id: i64) {
        if let Some(w) = self.watches.get_mut(&id)
            && !w.following
            && w.next == self.pos + 1
        {
            w.following = true;
            self.explicit.remove(&id);
            self.followers.insert(id, &w.range);
        }
    }

    /// Before `pos` jumps ahead of the feed: every follower keeps `pos + 1` as its own `next`
    /// (and reads what it missed from history).
    fn unfollow_all(&mut self) {
        let next = self.pos + 1;
        for id in self.followers.take_all() {
            if let Some(w) = self.watches.get_mut(&id) {
                w.following = false;
                w.next = next;
                self.explicit.insert(id);
            }
        }
    }

    async fn send(&mut self, mut resp: WatchResponse) -> Result<(), Gone> {
        match &resp {
            WatchResponse::Events { events, .. } => crate::metrics::metrics().events_sent.inc_by(events.len() as u64),
            WatchResponse::Progress { .. } => crate::metrics::metrics().progress_sent.inc(),
            _ => {}
        }
        // etcd's cancellation for compaction carries no revision (0) and no reason.
        if let WatchResponse::Canceled { compact_revision, .. } = &resp
            && *compact_revision != 0
        {
            return self.out.send(resp).await.map_err(|_| Gone);
        }
        let rev = match &mut resp {
            WatchResponse::Created { revision, .. }
            | WatchResponse::Rejected { revision, .. }
            | WatchResponse::Events { revision, .. }
            | WatchResponse::Progress { revision, .. }
            | WatchResponse::Canceled { revision, .. } => revision,
        };
        *rev = (*rev).max(self.last_header);
        self.last_header = *rev;
        self.out.send(resp).await.map_err(|_| Gone)
    }

    pub(super) fn first_unsynced(&self) -> Option<i64> {
        self.explicit.iter().copied().find(|id| self.watches.get(id).is_some_and(|w| w.next <= self.pos))
    }

    /// Every watch has delivered every event up to `pos`.
    fn all_synced(&self) -> bool {
        self.explicit.iter().all(|id| self.watches.get(id).is_none_or(|w| w.next > self.pos))
    }

    async fn current_revision(&self) -> Option<Revision> {
        match self.backend.revisions().await {
            Ok(r) => Some(r.current),
            Err(e) => {
                tracing::debug!(error = %e, "watch: cannot read current revision");
                None
            }
        }
    }

    pub(super) async fn handle(&mut self, req: WatchRequest) -> Result<(), Gone> {
        match req {
            WatchRequest::Create(c) => self.create(c).await,
            WatchRequest::Cancel(id) => {
                if self.remove_watch(id).is_some() {
                    let revision = self.pos;
                    self.send(WatchResponse::Canceled {
                        watch_id: id,
                        revision,
                        compact_revision: 0,
                        reason: String::new(),
                    })
                    .await?;
                }
                Ok(())
            }
            WatchRequest::Progress => {
                // As etcd: answered only when the stream has watches, all of them synced, none
                // waiting for a start revision still ahead; otherwise the request is dropped
                // (clients such as kube-apiserver ask again).
                if let Some(rev) = self.current_revision().await
                    && !self.watches.is_empty()
                    && self.all_synced()
                    && self.watches.values().all(|w| w.start <= rev)
                {
                    self.progress_target = Some(rev);
                }
                Ok(())
            }
        }
    }

    async fn create(&mut self, c: WatchCreate) -> Result<(), Gone> {
        let Ok(revs) = self.backend.revisions().await else {
            let reason = "etcdserver: unhealthy cluster".to_string();
            return self.send(WatchResponse::Rejected { watch_id: -1, revision: self.pos, reason }).await;
        };
        let current = revs.current;
        if c.watch_id != 0 && self.watches.contains_key(&c.watch_id) {
            let reason = "mvcc: duplicate watch ID provided on the WatchStream".to_string();
            return self.send(WatchResponse::Rejected { watch_id: -1, revision: current, reason }).await;
        }
        if c.range.is_empty() {
            let reason = "mvcc: watcher range is empty".to_string();
            return self.send(WatchResponse::Rejected { watch_id: -1, revision: current, reason }).await;
        }
        if c.start_revision < 0 {
            // etcd 3.6 and 3.7: refused at creation, as a compacted revision.
            let reason = "etcdserver: mvcc: required revision has been compacted".to_string();
            return self.send(WatchResponse::Rejected { watch_id: -1, revision: current, reason }).await;
        }
        let id = if c.watch_id != 0 {
            c.watch_id
        } else {
            while self.watches.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        };
        self.send(WatchResponse::Created { watch_id: id, revision: current }).await?;
        let next = if c.start_revision == 0 { current + 1 } else { c.start_revision };
        crate::metrics::metrics().watchers.inc();
        self.watches.insert(
            id,
            Watch {
                range: c.range,
                start: c.start_revision,
                next,
                following: false,
                prev_kv: c.prev_kv,
                progress_notify: c.progress_notify,
                no_put: c.no_put,
                no_delete: c.no_delete,
                fragment: c.fragment,
                idle: true,
            },
        );
        self.explicit.insert(id);
        Ok(())
    }

    /// As etcd: `compact_revision` set, no reason, header revision 0.
    async fn cancel_compacted(&mut self, id: i64, compacted: Revision) -> Result<(), Gone> {
        self.remove_watch(id);
        let canceled =
            WatchResponse::Canceled { watch_id: id, revision: 0, compact_revision: compacted, reason: String::new() };
        self.send(canceled).await
    }

    pub(super) async fn on_feed(
        &mut self,
        item: Result<Arc<RevisionEvents>, broadcast::error::RecvError>,
    ) -> Result<(), Gone> {
        match item {
            Ok(batch) => {
                let r = batch.revision;
                if r > self.pos + 1 {
                    // A gap in the feed: the followers read it from history.
                    self.unfollow_all();
                }
                // Only a watch that has delivered everything before `r` takes it from the feed;
                // one behind reads it from history, one ahead (future start) skips it. The
                // followers take it when it is the next revision (`r == pos + 1`).
                let mut takers = BTreeSet::new();
                if r == self.pos + 1 {
                    self.followers.candidates(&batch.events, &mut takers);
                }
                let mut advanced = Vec::new();
                for &id in &self.explicit {
                    if self.watches.get(&id).is_some_and(|w| w.next == r) {
                        takers.insert(id);
                        advanced.push(id);
                    }
                }
                let mut sends = Vec::new();
                for id in takers {
                    let Some(w) = self.watches.get_mut(&id) else { continue };
                    if !w.following {
                        w.next = r + 1;
                    }
                    let events = w.select(&batch.events);
                    if !events.is_empty() {
                        w.idle = false;
                        sends.push(WatchResponse::Events { watch_id: id, revision: r, events, fragment: w.fragment });
                    }
                }
                self.pos = self.pos.max(r);
                for id in advanced {
                    self.follow_if_synced(id);
                }
                for resp in sends {
                    self.send(resp).await?;
                }
                Ok(())
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                // Missed revisions are re-read from history by the catch-up path.
                crate::metrics::metrics().slow_watcher_resyncs.inc();
                tracing::debug!(missed = n, "watch feed lagged; catching up from history");
                self.unfollow_all();
                if let Some(rev) = self.current_revision().await {
                    self.pos = self.pos.max(rev);
                }
                Ok(())
            }
            Err(broadcast::error::RecvError::Closed) => {
                // The backend is shutting down.
                for id in self.watches.keys().copied().collect::<Vec<_>>() {
                    let revision = self.pos;
                    self.send(WatchResponse::Canceled {
                        watch_id: id,
                        revision,
                        compact_revision: 0,
                        reason: "etcdserver: server stopped".into(),
                    })
                    .await?;
                }
                self.watches.clear();
                self.followers.take_all();
                self.explicit.clear();
                Err(Gone)
            }
        }
    }

    /// Reads one window of history for a watch that is behind.
    pub(super) async fn catch_up(&mut self, id: i64) -> Result<(), Gone> {
        let Some(w) = self.watches.get(&id) else { return Ok(()) };
        let after = w.next - 1;
        let until = (after + CATCH_UP_WINDOW).min(self.pos);
        let range = w.range.clone();
        match self.backend.events(&range, after, until).await {
            Ok(batches) => {
                let Some(w) = self.watches.get_mut(&id) else { return Ok(()) };
                w.next = until + 1;
                let (fragment, mut pending, mut bytes) = (w.fragment, Vec::new(), 0usize);
                let mut responses = Vec::new();
                for batch in batches {
                    let events = w.select(&batch.events);
                    bytes += events.iter().map(|e| e.kv.key.len() + e.kv.value.len()).sum::<usize>();
                    pending.extend(events);
                    if bytes >= RESPONSE_BYTES {
                        responses.push(std::mem::take(&mut pending));
                        bytes = 0;
                    }
                }
                if !pending.is_empty() {
                    responses.push(pending);
                }
                if !responses.is_empty() {
                    w.idle = false;
                }
                for events in responses {
                    let revision = self.pos;
                    self.send(WatchResponse::Events { watch_id: id, revision, events, fragment }).await?;
                }
                self.follow_if_synced(id);
                Ok(())
            }
            Err(Error::Compacted { compact_revision }) => self.cancel_compacted(id, compact_revision).await,
            Err(e) => {
                tracing::warn!(watch = id, error = %e, "watch cannot read history; cancelling it");
                self.remove_watch(id);
                let revision = self.pos;
                self.send(WatchResponse::Canceled {
                    watch_id: id,
                    revision,
                    compact_revision: 0,
                    reason: e.to_string(),
                })
                .await
            }
        }
    }

    pub(super) async fn on_tick(&mut self) -> Result<(), Gone> {
        if self.watches.values().any(|w| w.progress_notify)
            && let Some(rev) = self.current_revision().await
        {
            self.tick_target = Some(rev);
        }
        Ok(())
    }

    fn synced_at(&self, target: Revision) -> bool {
        self.pos >= target && self.all_synced()
    }

    /// Sends progress notifications whose conditions are now met.
    pub(super) async fn flush_progress(&mut self) -> Result<(), Gone> {
        if let Some(target) = self.progress_target
            && self.synced_at(target)
        {
            self.progress_target = None;
            let revision = self.pos;
            self.send(WatchResponse::Progress { watch_id: BROADCAST_WATCH_ID, revision }).await?;
        }
        if let Some(target) = self.tick_target
            && self.pos >= target
        {
            self.tick_target = None;
            let pos = self.pos;
            let mut due = Vec::new();
            for (id, w) in self.watches.iter_mut() {
                if w.progress_notify && w.idle && (w.following || w.next > pos) {
                    due.push(*id);
                }
                w.idle = true;
            }
            for id in due {
                self.send(WatchResponse::Progress { watch_id: id, revision: pos }).await?;
            }
        }
        Ok(())
    }
}
