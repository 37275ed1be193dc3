//! Differential test of the Lock and Election services against real etcd 3.7 and 3.6: one scripted
//! session (locks taken, waited for, released, expired; campaigns, proclamations, observers,
//! resignations; every error etcd answers) runs against a fresh etcd and a fresh kine-rs, and
//! the two transcripts must be equal line by line. Lease ids differ between the servers, so
//! they are written as L1, L2, … in the order they appear.

mod common;
#[path = "differential/etcd.rs"]
mod etcd;

use common::{Server, TempDir};
use etcd_client::*;
use std::collections::HashMap;
use std::time::Duration;

/// Lines of what the server answered, lease ids replaced by their order of appearance.
#[derive(Default)]
struct Transcript {
    lines: Vec<String>,
    leases: HashMap<String, String>,
}

impl Transcript {
    fn lease(&mut self, id: i64) -> String {
        let n = self.leases.len() + 1;
        self.leases.entry(format!("{id:x}")).or_insert_with(|| format!("L{n}")).clone()
    }

    /// A key `NAME/LEASE_HEX` with its lease written as its name.
    fn key(&mut self, key: &[u8]) -> String {
        let text = String::from_utf8_lossy(key).to_string();
        match text.rsplit_once('/') {
            Some((name, hex)) if i64::from_str_radix(hex, 16).is_ok() => {
                let id = i64::from_str_radix(hex, 16).unwrap();
                format!("{name}/{}", self.lease(id))
            }
            _ => text,
        }
    }

    fn say(&mut self, line: String) {
        self.lines.push(line);
    }

    fn error(&mut self, what: &str, e: Error) {
        match e {
            Error::GRpcStatus(s) => self.say(format!("{what}: {:?} {}", s.code(), s.message())),
            other => self.say(format!("{what}: {other}")),
        }
    }
}

fn rev(h: Option<&ResponseHeader>) -> i64 {
    h.map_or(-1, |h| h.revision())
}

async fn script(url: &str) -> Vec<String> {
    let connect = || async { Client::connect([url], None).await.unwrap() };
    let mut c = connect().await;
    let mut t = Transcript::default();
    let pause = || tokio::time::sleep(Duration::from_millis(300));

    // Lock.
    let e = c.lock("l", Some(LockOptions::new().with_lease(4242))).await.unwrap_err();
    t.error("lock with a missing lease", e);
    let a = c.lease_grant(60, None).await.unwrap().id();
    let b = c.lease_grant(60, None).await.unwrap().id();
    t.lease(a);
    t.lease(b);
    let held = c.lock("l", Some(LockOptions::new().with_lease(a))).await.unwrap();
    let line = format!("lock: {} at {}", t.key(held.key()), rev(held.header()));
    t.say(line);
    let again = c.lock("l", Some(LockOptions::new().with_lease(a))).await.unwrap();
    let line = format!("lock again: {} at {}", t.key(again.key()), rev(again.header()));
    t.say(line);
    let mut other = connect().await;
    let waiter = tokio::spawn(async move { other.lock("l", Some(LockOptions::new().with_lease(b))).await.unwrap() });
    pause().await;
    t.say(format!("second lease waits: {}", !waiter.is_finished()));
    t.say(format!("unlock: {}", rev(c.unlock(held.key()).await.unwrap().header())));
    let second = waiter.await.unwrap();
    let line = format!("second lease holds: {} at {}", t.key(second.key()), rev(second.header()));
    t.say(line);
    t.say(format!("unlock of nothing: {}", rev(c.unlock("l/0").await.unwrap().header())));
    let fresh = c.lock("fresh", None).await.unwrap();
    let kv = c.get(fresh.key(), None).await.unwrap().kvs()[0].clone();
    let ttl = c.lease_time_to_live(kv.lease(), None).await.unwrap().granted_ttl();
    let line = format!("lock without a lease: {} value {:?} granted ttl {ttl}", t.key(fresh.key()), kv.value_str());
    t.say(line);
    let empty = c.lock("", Some(LockOptions::new().with_lease(a))).await.unwrap();
    let line = format!("empty name: {}", t.key(empty.key()));
    t.say(line);
    let short = c.lease_grant(1, None).await.unwrap().id();
    t.lease(short);
    let mut other = connect().await;
    let doomed = tokio::spawn(async move { other.lock("l", Some(LockOptions::new().with_lease(short))).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.unlock(second.key()).await.unwrap();
    t.error("a waiter whose lease expired", doomed.await.unwrap().unwrap_err());

    // Election.
    t.error("leader of nobody", c.leader("e").await.unwrap_err());
    let won = c.campaign("e", "v1", a).await.unwrap();
    let leader = won.leader().unwrap().clone();
    let line = format!("campaign: {} rev {} at {}", t.key(leader.key()), leader.rev(), rev(won.header()));
    t.say(line);
    let p = c.proclaim("v2", Some(ProclaimOptions::new().with_leader(leader.clone()))).await.unwrap();
    t.say(format!("proclaim: {}", rev(p.header())));
    let mut watcher = connect().await;
    let mut o = watcher.observe("e").await.unwrap();
    let seen = o.message().await.unwrap().unwrap();
    t.say(format!("observe: {:?} at {}", seen.kv().unwrap().value_str(), rev(seen.header())));
    let again = c.campaign("e", "v3", a).await.unwrap();
    t.say(format!("campaign again: rev {} at {}", again.leader().unwrap().rev(), rev(again.header())));
    let seen = o.message().await.unwrap().unwrap();
    t.say(format!("observe: {:?} at {}", seen.kv().unwrap().value_str(), rev(seen.header())));
    let mut other = connect().await;
    let candidate = tokio::spawn(async move { other.campaign("e", "b1", b).await.unwrap() });
    pause().await;
    t.say(format!("second candidate waits: {}", !candidate.is_finished()));
    let r = c.resign(Some(ResignOptions::new().with_leader(leader.clone()))).await.unwrap();
    t.say(format!("resign: {}", rev(r.header())));
    let elected = candidate.await.unwrap();
    let l = elected.leader().unwrap().clone();
    let line = format!("second candidate leads: {} rev {} at {}", t.key(l.key()), l.rev(), rev(elected.header()));
    t.say(line);
    let seen = o.message().await.unwrap().unwrap();
    t.say(format!("observe: {:?} at {}", seen.kv().unwrap().value_str(), rev(seen.header())));
    let lr = c.leader("e").await.unwrap();
    let kv = lr.kv().unwrap();
    let line = format!("leader: {} {:?} at {}", t.key(kv.key()), kv.value_str(), rev(lr.header()));
    t.say(line);
    let r = c.resign(Some(ResignOptions::new().with_leader(leader.clone()))).await.unwrap();
    t.say(format!("resign again: {}", rev(r.header())));
    let e = c.proclaim("late", Some(ProclaimOptions::new().with_leader(leader))).await.unwrap_err();
    t.error("proclaim after resigning", e);
    t.error("proclaim without a leader", c.proclaim("x", None).await.unwrap_err());
    t.error("resign without a leader", c.resign(None).await.unwrap_err());
    t.error("campaign with a missing lease", c.campaign("e", "x", 4242).await.unwrap_err());
    t.lines
}

async fn compare(version: etcd::Version) {
    let etcd = etcd::Etcd::start(version);
    let expected = script(&etcd.url).await;
    let dir = TempDir::new("recipes");
    let endpoint = format!("sqlite://{}", dir.path().join("state.db").display());
    let kine = Server::start(&["--endpoint", &endpoint, "--emulated-etcd-version", version.emulated()]);
    let got = script(&kine.url).await;
    common::assert_same_transcript(&expected, &got, 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_answer_as_etcd_3_7_does() {
    compare(etcd::Version::V3_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_answer_as_etcd_3_6_does() {
    compare(etcd::Version::V3_6).await;
}
