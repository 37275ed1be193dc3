//! Writes whose answer may be wrong about them.
//!
//! A JetStream answer that refuses a message (an expectation that failed) is not always the
//! truth about it: for a few seconds after a partition heals, a stream leader that was cut off
//! and deposed meanwhile still believes it leads and answers publishes too, from its stale
//! state, while the real leader stores the same message; the refusal may arrive first. So a
//! write refused this way is looked for in the replica before it is evaluated again: every
//! message's last (or only) part carries a `Nats-Msg-Id`, registered here while its write is in
//! flight, and the replica notes the sequence at which it applies a registered id. Found there
//! after a read barrier, the write is committed; else the refusal was true.

use kine_core::Revision;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Default)]
pub(super) struct Sent {
    /// Registered ids; the sequence they were applied at, 0 until then.
    ids: Mutex<HashMap<String, Revision>>,
    /// How many ids are registered (the replica looks at headers only when some are).
    count: AtomicUsize,
}

impl Sent {
    /// Registers a write's message id until the guard is dropped.
    pub fn register<'a>(&'a self, id: &str) -> Registered<'a> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), 0);
        self.count.fetch_add(1, Ordering::Relaxed);
        Registered { sent: self, id: id.to_string() }
    }

    /// The replica applied a message carrying `id` at `seq`.
    pub fn applied(&self, id: Option<&str>, seq: Revision) {
        let Some(id) = id else { return };
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(at) = self.ids.lock().unwrap_or_else(|p| p.into_inner()).get_mut(id) {
            *at = seq;
        }
    }

    /// The sequence at which the replica applied registered `id`'s message, if it did.
    pub fn applied_at(&self, id: &str) -> Option<Revision> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).get(id).copied().filter(|s| *s > 0)
    }
}

pub(super) struct Registered<'a> {
    sent: &'a Sent,
    pub id: String,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.sent.ids.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
        self.sent.count.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Sent;

    #[test]
    fn only_registered_ids_are_noted_while_registered() {
        let sent = Sent::default();
        sent.applied(Some("a"), 5);
        let a = sent.register("a");
        assert_eq!(sent.applied_at("a"), None, "registered, not applied yet");
        sent.applied(Some("b"), 6);
        sent.applied(None, 7);
        assert_eq!(sent.applied_at("b"), None);
        sent.applied(Some("a"), 8);
        assert_eq!(sent.applied_at("a"), Some(8));
        drop(a);
        assert_eq!(sent.applied_at("a"), None, "forgotten once the write is answered");
        assert_eq!(sent.count.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
