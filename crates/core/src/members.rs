//! The members of a datastore, as MemberList shows them: every kine-rs node serving it. Each
//! node stores a record of itself (name, client URLs, the time) in the datastore every
//! [`HEARTBEAT`] and removes it when it stops; a record not refreshed for [`STALE`] (a node
//! killed, or cut off) is no longer listed, and one not refreshed for [`FORGET`] is deleted by
//! whichever node sees it. On a datastore that serves one node (SQLite, memory) the list is this
//! node. Like etcd's member ids, ids are random per node process.

use crate::backend::Backend;
use crate::error::Result;
use crate::shutdown::Shutdown;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const HEARTBEAT: Duration = Duration::from_secs(5);
pub const STALE: Duration = Duration::from_secs(20);
pub const FORGET: Duration = Duration::from_secs(3600);

/// What a node says about itself (etcd's `--name` and its client URLs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub client_urls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub client_urls: Vec<String>,
    /// A read-only copy (etcd's learner).
    pub learner: bool,
}

#[derive(Serialize, Deserialize)]
struct Record {
    name: String,
    client_urls: Vec<String>,
    learner: bool,
    /// Unix milliseconds of the node's last heartbeat.
    seen: u64,
}

fn now_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
}

pub struct Members {
    backend: Arc<dyn Backend>,
    me: Identity,
}

impl Members {
    pub fn new(backend: Arc<dyn Backend>, me: Identity) -> Members {
        Members { backend, me }
    }

    fn me(&self) -> Member {
        Member {
            id: self.backend.member_id(),
            name: self.me.name.clone(),
            client_urls: self.me.client_urls.clone(),
            learner: self.backend.role().is_learner(),
        }
    }

    /// Stores this node's record.
    pub async fn announce(&self) -> Result<()> {
        let me = self.me();
        let record = Record { name: me.name, client_urls: me.client_urls, learner: me.learner, seen: now_millis() };
        self.backend.member_put(me.id, serde_json::to_vec(&record).unwrap_or_default()).await
    }

    /// Every live member, this node included, by id.
    pub async fn list(&self) -> Result<Vec<Member>> {
        let me = self.me();
        let Some(records) = self.backend.member_records().await? else { return Ok(vec![me]) };
        let now = now_millis();
        let mut members: Vec<Member> = records
            .into_iter()
            .filter(|(id, _)| *id != me.id)
            .filter_map(|(id, data)| {
                let r: Record = serde_json::from_slice(&data).ok()?;
                let fresh = now.saturating_sub(r.seen) < STALE.as_millis() as u64;
                fresh.then_some(Member { id, name: r.name, client_urls: r.client_urls, learner: r.learner })
            })
            .collect();
        members.push(me);
        members.sort_by_key(|m| m.id);
        Ok(members)
    }

    /// Deletes records nobody refreshed for [`FORGET`].
    async fn forget_dead(&self) -> Result<()> {
        let Some(records) = self.backend.member_records().await? else { return Ok(()) };
        let now = now_millis();
        for (id, data) in records {
            let seen = serde_json::from_slice::<Record>(&data).map(|r| r.seen).unwrap_or(0);
            if now.saturating_sub(seen) > FORGET.as_millis() as u64 {
                self.backend.member_delete(id).await?;
            }
        }
        Ok(())
    }

    /// Announces this node every [`HEARTBEAT`] until `shutdown`, then withdraws it.
    pub fn spawn(self: Arc<Self>, shutdown: Shutdown) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut stop = shutdown;
            let mut failing = false;
            let mut beats = 0u64;
            loop {
                let result = match self.announce().await {
                    Ok(()) if beats.is_multiple_of(120) => self.forget_dead().await,
                    other => other,
                };
                match result {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("member record stored again");
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "cannot store this node's member record; other nodes will stop listing it");
                    }
                    _ => {}
                }
                beats += 1;
                tokio::select! {
                    _ = stop.wait() => break,
                    _ = tokio::time::sleep(HEARTBEAT) => {}
                }
            }
            let id = self.backend.member_id();
            let _ = tokio::time::timeout(Duration::from_secs(2), self.backend.member_delete(id)).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;

    #[tokio::test]
    async fn a_single_node_datastore_lists_this_node() {
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        let me = Identity { name: "n1".into(), client_urls: vec!["http://127.0.0.1:2379".into()] };
        let members = Members::new(backend.clone(), me);
        members.announce().await.unwrap();
        let list = members.list().await.unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].id, list[0].name.as_str(), list[0].learner), (backend.member_id(), "n1", false));
    }
}
