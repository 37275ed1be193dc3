//! What a store answers through a kine-rs serving it, compared before and after `kine-rs
//! migrate` (tests/migrate.rs, tests/migrate_nats.rs).

use super::history::watched;
use super::*;
use std::process::Command;

/// `kine-rs migrate --from --to [extra]`: (success, stderr).
pub fn migrate(from: &str, to: &str, extra: &[&str]) -> (bool, String) {
    let (ok, _, err) = run(Command::new(server_bin()).args(["migrate", "--from", from, "--to", to]).args(extra));
    (ok, err)
}

/// What a store answers, read through a kine-rs serving it.
#[derive(Debug, PartialEq)]
pub struct Answers {
    pub revision: i64,
    pub keys: Vec<Kv>,
    pub at_compact: Vec<Kv>,
    pub at_middle: Vec<Kv>,
    pub history: Vec<super::history::Watched>,
    pub below_compact: String,
    pub leases: Vec<(i64, Vec<Vec<u8>>)>,
    pub users: Vec<String>,
}

/// (Stopped gracefully afterwards: its member record withdrawn, a later copy into the same
/// datastore is not refused.)
pub async fn answers(endpoint: &str, compact: i64, middle: i64) -> Answers {
    let mut server = Server::start(&["--endpoint", endpoint]);
    let answers = answers_of(&mut server.client().await, compact, middle).await;
    assert!(server.stop("TERM").await.success());
    answers
}

pub async fn answers_of(c: &mut etcd_client::Client, compact: i64, middle: i64) -> Answers {
    let (revision, keys) = everything(c).await;
    let below = c.get("/registry/cm/00001", Some(etcd_client::GetOptions::new().with_revision(compact - 1))).await;
    let mut leases = Vec::new();
    for l in c.leases().await.unwrap().leases() {
        let ttl =
            c.lease_time_to_live(l.id(), Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
        leases.push((l.id(), ttl.keys().to_vec()));
    }
    Answers {
        revision,
        keys,
        at_compact: keys_at(c, compact).await,
        at_middle: keys_at(c, middle).await,
        history: watched(c, "/registry/", compact, revision).await,
        below_compact: below.map(|_| "served".to_string()).unwrap_or_else(|e| e.to_string()),
        leases,
        users: c.user_list().await.unwrap().users().to_vec(),
    }
}
