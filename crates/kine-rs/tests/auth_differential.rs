//! Differential test of Auth against real etcd 3.7 and 3.6: one scripted session (users, roles,
//! permissions on keys, ranges, prefixes and "from key"; enabling auth; tokens good, garbled,
//! voided by a new password or by disabling auth; what each user may do with KV, Txn, Watch,
//! Lease, Maintenance and Cluster; every error etcd answers) runs against a fresh etcd and a
//! fresh kine-rs over raw gRPC, and the two transcripts must be equal line by line. Tokens
//! differ between servers, so only whether one was issued is written.

mod common;
#[path = "differential/etcd.rs"]
mod etcd;

use common::{Server, TempDir};
use kine_proto::authpb::{Permission, UserAddOptions};
use kine_proto::etcdserverpb as pb;
use pb::auth_client::AuthClient;
use pb::cluster_client::ClusterClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::watch_client::WatchClient;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

struct Clients {
    auth: AuthClient<Channel>,
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
    lease: LeaseClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
    cluster: ClusterClient<Channel>,
}

/// A request with `token` in the metadata key `key` ("token", as etcd's Go client sends it).
fn with<'a>(token: Option<&'a str>, key: &'static str) -> impl Fn() -> tonic::metadata::MetadataMap + 'a {
    move || {
        let mut m = tonic::metadata::MetadataMap::new();
        if let Some(t) = token {
            m.insert(key, t.parse().expect("token is ASCII"));
        }
        m
    }
}

fn req<T>(meta: &impl Fn() -> tonic::metadata::MetadataMap, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    *r.metadata_mut() = meta();
    r
}

#[derive(Default)]
struct Transcript(Vec<String>);

impl Transcript {
    fn say<T>(&mut self, what: &str, r: Result<Response<T>, Status>, ok: impl FnOnce(T) -> String) {
        let line = match r {
            Ok(resp) => format!("{what}: {}", ok(resp.into_inner())),
            Err(s) => format!("{what}: {:?} {}", s.code(), s.message()),
        };
        self.0.push(line);
    }
}

fn rev(h: Option<pb::ResponseHeader>) -> String {
    h.map_or("no header".into(), |h| format!("rev {}", h.revision))
}

fn perm(kind: i32, key: &str, end: &str) -> Option<Permission> {
    Some(Permission { perm_type: kind, key: key.into(), range_end: end.into() })
}

const READ: i32 = 0;
const WRITE: i32 = 1;
const READWRITE: i32 = 2;

fn range(key: &str, end: &str) -> pb::RangeRequest {
    pb::RangeRequest { key: key.into(), range_end: end.into(), ..Default::default() }
}

fn put(key: &str) -> pb::PutRequest {
    pb::PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() }
}

async fn token(c: &mut Clients, name: &str, password: &str) -> Option<String> {
    let r = c.auth.authenticate(pb::AuthenticateRequest { name: name.into(), password: password.into() }).await;
    r.ok().map(|r| r.into_inner().token)
}

/// What a user may do with the keys: the same requests, by one caller.
async fn key_requests(
    t: &mut Transcript,
    c: &mut Clients,
    who: &str,
    meta: &impl Fn() -> tonic::metadata::MetadataMap,
) {
    t.say(&format!("{who} put foo/a"), c.kv.put(req(meta, put("foo/a"))).await, |r| rev(r.header));
    t.say(&format!("{who} put bar"), c.kv.put(req(meta, put("bar"))).await, |r| rev(r.header));
    t.say(&format!("{who} get foo/ prefix"), c.kv.range(req(meta, range("foo/", "foo0"))).await, |r| {
        format!("{} keys", r.count)
    });
    t.say(&format!("{who} get foo/ and beyond"), c.kv.range(req(meta, range("foo/", "foo1"))).await, |r| {
        r.count.to_string()
    });
    t.say(&format!("{who} get k"), c.kv.range(req(meta, range("k", ""))).await, |r| r.count.to_string());
    t.say(&format!("{who} put k"), c.kv.put(req(meta, put("k"))).await, |r| rev(r.header));
    t.say(
        &format!("{who} put k prev_kv"),
        c.kv.put(req(meta, pb::PutRequest { prev_kv: true, ..put("k") })).await,
        |r| rev(r.header),
    );
    t.say(&format!("{who} put w/x"), c.kv.put(req(meta, put("w/x"))).await, |r| rev(r.header));
    t.say(&format!("{who} get w/x"), c.kv.range(req(meta, range("w/x", ""))).await, |r| r.count.to_string());
    t.say(&format!("{who} get everything"), c.kv.range(req(meta, range("\0", "\0"))).await, |r| r.count.to_string());
    let del = pb::DeleteRangeRequest { key: b"foo/a".to_vec(), prev_kv: true, ..Default::default() };
    t.say(&format!("{who} delete foo/a prev_kv"), c.kv.delete_range(req(meta, del)).await, |r| {
        format!("{} deleted, {}", r.deleted, rev(r.header))
    });
    let del = pb::DeleteRangeRequest { key: b"w/".to_vec(), range_end: b"w0".to_vec(), prev_kv: true };
    t.say(&format!("{who} delete w/ prefix prev_kv"), c.kv.delete_range(req(meta, del)).await, |r| {
        r.deleted.to_string()
    });
    t.say(&format!("{who} empty key"), c.kv.put(req(meta, put(""))).await, |r| rev(r.header));
    let op = |r: pb::request_op::Request| pb::RequestOp { request: Some(r) };
    let cmp =
        pb::Compare { key: b"foo/a".to_vec(), target: pb::compare::CompareTarget::Mod as i32, ..Default::default() };
    let txn = |failure: Vec<pb::RequestOp>| pb::TxnRequest {
        compare: vec![cmp.clone()],
        success: vec![op(pb::request_op::Request::RequestPut(put("foo/t")))],
        failure,
    };
    t.say(&format!("{who} txn in foo/"), c.kv.txn(req(meta, txn(vec![]))).await, |r| {
        format!("{} {}", r.succeeded, rev(r.header))
    });
    let bar = op(pb::request_op::Request::RequestRange(range("bar", "")));
    t.say(&format!("{who} txn whose other branch reads bar"), c.kv.txn(req(meta, txn(vec![bar]))).await, |r| {
        r.succeeded.to_string()
    });
    let nested = op(pb::request_op::Request::RequestTxn(pb::TxnRequest {
        success: vec![op(pb::request_op::Request::RequestPut(put("bar")))],
        ..Default::default()
    }));
    t.say(&format!("{who} txn with a nested put on bar"), c.kv.txn(req(meta, txn(vec![nested]))).await, |r| {
        r.succeeded.to_string()
    });
    t.say(
        &format!("{who} compact"),
        c.kv.compact(req(meta, pb::CompactionRequest { revision: 2, physical: false })).await,
        |r| rev(r.header),
    );
}

/// Watches, leases, maintenance, cluster and the Auth service, by one caller.
async fn other_requests(
    t: &mut Transcript,
    c: &mut Clients,
    who: &str,
    meta: &impl Fn() -> tonic::metadata::MetadataMap,
) {
    for (what, key, end) in [("foo/ prefix", "foo/", "foo0"), ("bar", "bar", ""), ("everything", "", "\0")] {
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(pb::WatchCreateRequest {
                key: key.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(create).await.unwrap();
        let stream = c.watch.watch(req(meta, tokio_stream::wrappers::ReceiverStream::new(rx))).await;
        let line = match stream {
            Ok(s) => {
                let first = s.into_inner().message().await;
                match first {
                    Ok(Some(r)) => format!(
                        "id {} created {} canceled {} reason {:?} {}",
                        r.watch_id,
                        r.created,
                        r.canceled,
                        r.cancel_reason,
                        rev(r.header)
                    ),
                    Ok(None) => "stream ended".into(),
                    Err(s) => format!("{:?} {}", s.code(), s.message()),
                }
            }
            Err(s) => format!("{:?} {}", s.code(), s.message()),
        };
        drop(tx);
        t.0.push(format!("{who} watch {what}: {line}"));
    }
    let grant = c.lease.lease_grant(req(meta, pb::LeaseGrantRequest { ttl: 60, id: 0 })).await;
    let id = grant.as_ref().map(|r| r.get_ref().id).unwrap_or(4242);
    t.say(&format!("{who} lease grant"), grant, |r| format!("ttl {}", r.ttl));
    let ttl = pb::LeaseTimeToLiveRequest { id, keys: true };
    t.say(&format!("{who} lease ttl with keys"), c.lease.lease_time_to_live(req(meta, ttl)).await, |r| {
        r.granted_ttl.to_string()
    });
    t.say(&format!("{who} lease list"), c.lease.lease_leases(req(meta, pb::LeaseLeasesRequest {})).await, |r| {
        format!("{} leases", r.leases.len())
    });
    t.say(&format!("{who} lease revoke"), c.lease.lease_revoke(req(meta, pb::LeaseRevokeRequest { id })).await, |r| {
        rev(r.header)
    });
    t.say(&format!("{who} status"), c.maintenance.status(req(meta, pb::StatusRequest {})).await, |_| "ok".into());
    t.say(&format!("{who} hash kv"), c.maintenance.hash_kv(req(meta, pb::HashKvRequest { revision: 0 })).await, |_| {
        "ok".into()
    });
    let alarms = pb::AlarmRequest { action: 0, member_id: 0, alarm: 0 };
    t.say(&format!("{who} alarm get"), c.maintenance.alarm(req(meta, alarms)).await, |r| r.alarms.len().to_string());
    t.say(&format!("{who} defragment"), c.maintenance.defragment(req(meta, pb::DefragmentRequest {})).await, |_| {
        "ok".into()
    });
    t.say(
        &format!("{who} member list"),
        c.cluster.member_list(req(meta, pb::MemberListRequest { linearizable: false })).await,
        |r| r.members.len().to_string(),
    );
    t.say(&format!("{who} auth status"), c.auth.auth_status(req(meta, pb::AuthStatusRequest {})).await, |r| {
        format!("enabled {} auth revision {}", r.enabled, r.auth_revision)
    });
    t.say(
        &format!("{who} user get alice"),
        c.auth.user_get(req(meta, pb::AuthUserGetRequest { name: "alice".into() })).await,
        |r| r.roles.join(","),
    );
    t.say(
        &format!("{who} user get root"),
        c.auth.user_get(req(meta, pb::AuthUserGetRequest { name: "root".into() })).await,
        |r| r.roles.join(","),
    );
    t.say(
        &format!("{who} role get r"),
        c.auth.role_get(req(meta, pb::AuthRoleGetRequest { role: "r".into() })).await,
        |r| format!("{:?}", r.perm),
    );
    t.say(&format!("{who} user list"), c.auth.user_list(req(meta, pb::AuthUserListRequest {})).await, |r| {
        r.users.join(",")
    });
    t.say(
        &format!("{who} role add x"),
        c.auth.role_add(req(meta, pb::AuthRoleAddRequest { name: "x".into() })).await,
        |r| rev(r.header),
    );
}

async fn script(url: &str) -> Vec<String> {
    let channel = Channel::from_shared(url.to_string()).unwrap().connect().await.expect("connect");
    let mut c = Clients {
        auth: AuthClient::new(channel.clone()),
        kv: KvClient::new(channel.clone()),
        watch: WatchClient::new(channel.clone()),
        lease: LeaseClient::new(channel.clone()),
        maintenance: MaintenanceClient::new(channel.clone()),
        cluster: ClusterClient::new(channel),
    };
    let mut t = Transcript::default();
    let none = with(None, "token");
    let a = &mut c.auth;
    let status = |r: pb::AuthStatusResponse| {
        format!("enabled {} auth revision {} {}", r.enabled, r.auth_revision, rev(r.header))
    };
    t.say("fresh status", a.auth_status(pb::AuthStatusRequest {}).await, status);
    t.say(
        "authenticate while disabled",
        a.authenticate(pb::AuthenticateRequest { name: "root".into(), password: "x".into() }).await,
        |_| "token".into(),
    );
    t.say("enable without root", a.auth_enable(pb::AuthEnableRequest {}).await, |r| rev(r.header));
    let user = |name: &str, password: &str, no_password: bool| pb::AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        options: Some(UserAddOptions { no_password }),
        hashed_password: String::new(),
    };
    t.say("add unnamed user", a.user_add(user("", "x", false)).await, |r| rev(r.header));
    t.say("add root", a.user_add(user("root", "rootpw", false)).await, |r| rev(r.header));
    t.say("enable without root role", a.auth_enable(pb::AuthEnableRequest {}).await, |r| rev(r.header));
    let grant = |user: &str, role: &str| pb::AuthUserGrantRoleRequest { user: user.into(), role: role.into() };
    t.say("grant root root", a.user_grant_role(grant("root", "root")).await, |r| rev(r.header));
    t.say("add alice", a.user_add(user("alice", "alicepw", false)).await, |r| rev(r.header));
    t.say("add alice again", a.user_add(user("alice", "x", false)).await, |r| rev(r.header));
    t.say("add bob without password", a.user_add(user("bob", "", true)).await, |r| rev(r.header));
    t.say("add carol with an empty password", a.user_add(user("carol", "", false)).await, |r| rev(r.header));
    let role = |name: &str| pb::AuthRoleAddRequest { name: name.into() };
    t.say("add unnamed role", a.role_add(role("")).await, |r| rev(r.header));
    t.say("add role r", a.role_add(role("r")).await, |r| rev(r.header));
    t.say("add role r again", a.role_add(role("r")).await, |r| rev(r.header));
    let gp = |name: &str, perm: Option<Permission>| pb::AuthRoleGrantPermissionRequest { name: name.into(), perm };
    t.say("grant no permission", a.role_grant_permission(gp("r", None)).await, |r| rev(r.header));
    t.say("grant on an empty key", a.role_grant_permission(gp("r", perm(READ, "", ""))).await, |r| rev(r.header));
    t.say("grant an inverted range", a.role_grant_permission(gp("r", perm(READ, "b", "a"))).await, |r| rev(r.header));
    t.say("grant to a missing role", a.role_grant_permission(gp("nope", perm(READ, "a", ""))).await, |r| rev(r.header));
    t.say("grant rw foo/ prefix", a.role_grant_permission(gp("r", perm(READWRITE, "foo/", "foo0"))).await, |r| {
        rev(r.header)
    });
    t.say("grant read k", a.role_grant_permission(gp("r", perm(READ, "k", ""))).await, |r| rev(r.header));
    t.say("grant write from w", a.role_grant_permission(gp("r", perm(WRITE, "w", "\0"))).await, |r| rev(r.header));
    t.say("grant rw k (a new type)", a.role_grant_permission(gp("r", perm(READWRITE, "k", ""))).await, |r| {
        rev(r.header)
    });
    t.say("role get r", a.role_get(pb::AuthRoleGetRequest { role: "r".into() }).await, |r| format!("{:?}", r.perm));
    t.say("role get root (no role object)", a.role_get(pb::AuthRoleGetRequest { role: "root".into() }).await, |r| {
        format!("{:?}", r.perm)
    });
    t.say("add role root", a.role_add(role("root")).await, |r| rev(r.header));
    t.say("role get root", a.role_get(pb::AuthRoleGetRequest { role: "root".into() }).await, |r| {
        format!("{:?}", r.perm)
    });
    t.say("grant alice r", a.user_grant_role(grant("alice", "r")).await, |r| rev(r.header));
    t.say("grant alice r again", a.user_grant_role(grant("alice", "r")).await, |r| rev(r.header));
    t.say("grant alice a missing role", a.user_grant_role(grant("alice", "nope")).await, |r| rev(r.header));
    t.say("grant a missing user", a.user_grant_role(grant("nobody", "r")).await, |r| rev(r.header));
    let revoke = |name: &str, role: &str| pb::AuthUserRevokeRoleRequest { name: name.into(), role: role.into() };
    t.say("revoke a role alice lacks", a.user_revoke_role(revoke("alice", "zz")).await, |r| rev(r.header));
    t.say("user list", a.user_list(pb::AuthUserListRequest {}).await, |r| r.users.join(","));
    t.say("role list", a.role_list(pb::AuthRoleListRequest {}).await, |r| r.roles.join(","));
    t.say("user get alice", a.user_get(pb::AuthUserGetRequest { name: "alice".into() }).await, |r| r.roles.join(","));
    t.say("user get nobody", a.user_get(pb::AuthUserGetRequest { name: "nobody".into() }).await, |r| r.roles.join(","));
    t.say("status before enabling", a.auth_status(pb::AuthStatusRequest {}).await, status);
    t.say("enable", a.auth_enable(pb::AuthEnableRequest {}).await, |r| rev(r.header));
    t.say("enable again, anonymously", a.auth_enable(pb::AuthEnableRequest {}).await, |r| rev(r.header));
    t.say("status, anonymously", a.auth_status(pb::AuthStatusRequest {}).await, status);
    let login = |name: &str, password: &str| pb::AuthenticateRequest { name: name.into(), password: password.into() };
    t.say("root, wrong password", a.authenticate(login("root", "wrong")).await, |_| "token".into());
    t.say("nobody", a.authenticate(login("nobody", "x")).await, |_| "token".into());
    t.say("bob, who has no password", a.authenticate(login("bob", "")).await, |_| "token".into());
    t.say("carol, empty password", a.authenticate(login("carol", "")).await, |_| "token".into());
    let root = token(&mut c, "root", "rootpw").await.expect("root logs in");
    let alice = token(&mut c, "alice", "alicepw").await.expect("alice logs in");
    let carol = token(&mut c, "carol", "").await.expect("carol logs in");
    let (root_meta, alice_meta, carol_meta) =
        (with(Some(&root), "token"), with(Some(&alice), "token"), with(Some(&carol), "token"));

    key_requests(&mut t, &mut c, "anonymous", &none).await;
    key_requests(&mut t, &mut c, "alice", &alice_meta).await;
    key_requests(&mut t, &mut c, "root", &root_meta).await;
    key_requests(&mut t, &mut c, "carol (no roles)", &carol_meta).await;
    other_requests(&mut t, &mut c, "anonymous", &none).await;
    other_requests(&mut t, &mut c, "alice", &alice_meta).await;
    other_requests(&mut t, &mut c, "root", &root_meta).await;
    // Tokens in other forms.
    let garbled = with(Some("garbled.1"), "token");
    t.say("garbled token get", c.kv.range(req(&garbled, range("foo/a", ""))).await, |r| r.count.to_string());
    let bearer = format!("Bearer {alice}");
    t.say("bearer token get", c.kv.range(req(&with(Some(&bearer), "token"), range("foo/a", ""))).await, |r| {
        r.count.to_string()
    });
    t.say(
        "authorization header get",
        c.kv.range(req(&with(Some(&alice), "authorization"), range("foo/a", ""))).await,
        |r| r.count.to_string(),
    );
    t.say("garbled token authenticate", c.auth.authenticate(req(&garbled, login("alice", "alicepw"))).await, |_| {
        "token".into()
    });
    // Root is protected while auth is on.
    let a = &mut c.auth;
    t.say(
        "delete root",
        a.user_delete(req(&root_meta, pb::AuthUserDeleteRequest { name: "root".into() })).await,
        |r| rev(r.header),
    );
    t.say(
        "revoke root from root",
        a.user_revoke_role(req(&root_meta, revoke("root", "root"))).await,
        |r| rev(r.header),
    );
    t.say(
        "delete role root",
        a.role_delete(req(&root_meta, pb::AuthRoleDeleteRequest { role: "root".into() })).await,
        |r| rev(r.header),
    );
    // A new password voids the old tokens.
    let change = pb::AuthUserChangePasswordRequest {
        name: "alice".into(),
        password: "new".into(),
        hashed_password: String::new(),
    };
    t.say("alice changes her own password", a.user_change_password(req(&alice_meta, change.clone())).await, |r| {
        rev(r.header)
    });
    t.say("root changes alice's password", a.user_change_password(req(&root_meta, change)).await, |r| rev(r.header));
    t.say("alice's old token", c.kv.range(req(&alice_meta, range("foo/a", ""))).await, |r| r.count.to_string());
    t.say("alice, old password", c.auth.authenticate(login("alice", "alicepw")).await, |_| "token".into());
    let alice = token(&mut c, "alice", "new").await.expect("alice logs in again");
    let alice_meta = with(Some(&alice), "token");
    t.say("alice's new token", c.kv.range(req(&alice_meta, range("foo/a", ""))).await, |r| r.count.to_string());
    // Permissions taken away.
    let a = &mut c.auth;
    let rp = |role: &str, key: &str, end: &str| pb::AuthRoleRevokePermissionRequest {
        role: role.into(),
        key: key.into(),
        range_end: end.into(),
    };
    t.say("revoke a sub-range", a.role_revoke_permission(req(&root_meta, rp("r", "foo/a", "foo/b"))).await, |r| {
        rev(r.header)
    });
    t.say("revoke k", a.role_revoke_permission(req(&root_meta, rp("r", "k", ""))).await, |r| rev(r.header));
    t.say("revoke from a missing role", a.role_revoke_permission(req(&root_meta, rp("nope", "k", ""))).await, |r| {
        rev(r.header)
    });
    t.say("alice get k", c.kv.range(req(&alice_meta, range("k", ""))).await, |r| r.count.to_string());
    let a = &mut c.auth;
    t.say("delete role r", a.role_delete(req(&root_meta, pb::AuthRoleDeleteRequest { role: "r".into() })).await, |r| {
        rev(r.header)
    });
    t.say(
        "user get alice after",
        a.user_get(req(&root_meta, pb::AuthUserGetRequest { name: "alice".into() })).await,
        |r| r.roles.join(","),
    );
    t.say("alice get foo/a", c.kv.range(req(&alice_meta, range("foo/a", ""))).await, |r| r.count.to_string());
    let a = &mut c.auth;
    t.say(
        "delete carol",
        a.user_delete(req(&root_meta, pb::AuthUserDeleteRequest { name: "carol".into() })).await,
        |r| rev(r.header),
    );
    t.say("carol's token", c.kv.range(req(&carol_meta, range("foo/a", ""))).await, |r| r.count.to_string());
    // Disabling voids every token; tokens are ignored while auth is off.
    let a = &mut c.auth;
    t.say("disable, by alice", a.auth_disable(req(&alice_meta, pb::AuthDisableRequest {})).await, |r| rev(r.header));
    t.say("disable", a.auth_disable(req(&root_meta, pb::AuthDisableRequest {})).await, |r| rev(r.header));
    t.say("status after disabling", a.auth_status(pb::AuthStatusRequest {}).await, status);
    t.say("garbled token while disabled", c.kv.range(req(&garbled, range("foo/a", ""))).await, |r| r.count.to_string());
    t.say("disable again", c.auth.auth_disable(pb::AuthDisableRequest {}).await, |r| rev(r.header));
    t.say("enable once more", c.auth.auth_enable(pb::AuthEnableRequest {}).await, |r| rev(r.header));
    t.say("root's old token", c.kv.range(req(&root_meta, range("foo/a", ""))).await, |r| r.count.to_string());
    let root = token(&mut c, "root", "rootpw").await.expect("root logs in again");
    let root_meta = with(Some(&root), "token");
    t.say("final status", c.auth.auth_status(req(&root_meta, pb::AuthStatusRequest {})).await, status);
    t.0
}

async fn compare(version: etcd::Version) {
    let etcd = etcd::Etcd::start(version);
    let expected = script(&etcd.url).await;
    let dir = TempDir::new("auth-diff");
    let endpoint = format!("sqlite://{}", dir.path().join("state.db").display());
    let kine =
        Server::start(&["--endpoint", &endpoint, "--emulated-etcd-version", version.emulated(), "--bcrypt-cost", "4"]);
    let got = script(&kine.url).await;
    common::assert_same_transcript(&expected, &got, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_answers_as_etcd_3_7_does() {
    compare(etcd::Version::V3_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_answers_as_etcd_3_6_does() {
    compare(etcd::Version::V3_6).await;
}
