//! Writes the fuzzers' seed inputs under the directory given (crates/fuzz/seeds): real gRPC
//! requests of every kind, endpoint URLs and DSNs from the docs, NATS messages as kine-rs writes
//! them, and snapshot files. `cargo run -p kine-fuzz --bin fuzz-seeds -- crates/fuzz/seeds`.

use kine_core::types::KeyValue;
use kine_proto::etcdserverpb as pb;
use prost::Message;
use std::path::Path;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).expect("create the seed directory");
    std::fs::write(d.join(name), bytes).expect("write a seed");
}

fn rpc(dir: &Path, name: &str, which: u8, msg: impl Message) {
    let mut bytes = vec![which];
    msg.encode(&mut bytes).expect("encode");
    write(dir, "grpc", name, &bytes);
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: fuzz-seeds DIR");
    let dir = Path::new(&dir);
    let key = b"/registry/pods/default/a".to_vec();
    let prefix_end = b"/registry/pods/default0".to_vec();
    let put = pb::PutRequest { key: key.clone(), value: b"{\"kind\":\"Pod\"}".to_vec(), ..Default::default() };
    rpc(
        dir,
        "range",
        0,
        pb::RangeRequest {
            key: b"/registry/".to_vec(),
            range_end: b"/registry0".to_vec(),
            limit: 500,
            ..Default::default()
        },
    );
    rpc(dir, "put", 1, put.clone());
    rpc(dir, "delete", 2, pb::DeleteRangeRequest { key: key.clone(), prev_kv: true, ..Default::default() });
    let create = pb::TxnRequest {
        compare: vec![pb::Compare {
            key: key.clone(),
            target: pb::compare::CompareTarget::Mod as i32,
            result: pb::compare::CompareResult::Equal as i32,
            target_union: Some(pb::compare::TargetUnion::ModRevision(0)),
            ..Default::default()
        }],
        success: vec![pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(put.clone())) }],
        failure: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                key: key.clone(),
                ..Default::default()
            })),
        }],
    };
    rpc(dir, "txn-create", 3, create);
    rpc(dir, "compact", 4, pb::CompactionRequest { revision: 2, physical: false });
    rpc(
        dir,
        "range-stream",
        5,
        pb::RangeRequest { key: b"/registry/".to_vec(), range_end: prefix_end.clone(), ..Default::default() },
    );
    rpc(dir, "lease-grant", 6, pb::LeaseGrantRequest { ttl: 10, id: 0 });
    rpc(dir, "lease-revoke", 7, pb::LeaseRevokeRequest { id: 7 });
    rpc(dir, "lease-ttl", 8, pb::LeaseTimeToLiveRequest { id: 7, keys: true });
    rpc(dir, "leases", 9, pb::LeaseLeasesRequest {});
    rpc(dir, "keepalive", 10, pb::LeaseKeepAliveRequest { id: 7 });
    let watch = pb::WatchCreateRequest {
        key: b"/registry/".to_vec(),
        range_end: b"/registry0".to_vec(),
        start_revision: 1,
        prev_kv: true,
        progress_notify: true,
        ..Default::default()
    };
    rpc(
        dir,
        "watch",
        11,
        pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(watch)) },
    );
    rpc(dir, "status", 12, pb::StatusRequest {});
    rpc(dir, "hash", 13, pb::HashRequest {});
    rpc(dir, "hashkv", 14, pb::HashKvRequest { revision: 0 });
    rpc(
        dir,
        "alarm",
        15,
        pb::AlarmRequest { action: pb::alarm_request::AlarmAction::Get as i32, member_id: 0, alarm: 0 },
    );
    rpc(dir, "defrag", 16, pb::DefragmentRequest {});
    rpc(dir, "members", 17, pb::MemberListRequest { linearizable: true });
    rpc(dir, "promote", 18, pb::MemberPromoteRequest { id: 1 });
    rpc(dir, "move-leader", 19, pb::MoveLeaderRequest { target_id: 1 });
    // Auth: a root user and role, a role with permissions, enabling, logging in.
    let user = |name: &str, password: &str| pb::AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        options: None,
        hashed_password: String::new(),
    };
    rpc(dir, "user-add-root", 24, user("root", "pw"));
    rpc(dir, "user-grant-root", 29, pb::AuthUserGrantRoleRequest { user: "root".into(), role: "root".into() });
    rpc(dir, "role-add", 31, pb::AuthRoleAddRequest { name: "r".into() });
    let perm = kine_proto::authpb::Permission { perm_type: 2, key: b"/a/".to_vec(), range_end: b"/a0".to_vec() };
    rpc(dir, "role-grant", 35, pb::AuthRoleGrantPermissionRequest { name: "r".into(), perm: Some(perm) });
    rpc(
        dir,
        "role-revoke",
        36,
        pb::AuthRoleRevokePermissionRequest { role: "r".into(), key: b"/a/".to_vec(), range_end: vec![0] },
    );
    rpc(dir, "role-get", 32, pb::AuthRoleGetRequest { role: "root".into() });
    rpc(dir, "user-get", 25, pb::AuthUserGetRequest { name: "root".into() });
    rpc(
        dir,
        "change-password",
        28,
        pb::AuthUserChangePasswordRequest {
            name: "root".into(),
            password: String::new(),
            hashed_password: "JDJhJDA0JHh4".into(),
        },
    );
    rpc(dir, "auth-enable", 20, pb::AuthEnableRequest {});
    rpc(dir, "authenticate", 23, pb::AuthenticateRequest { name: "root".into(), password: "pw".into() });
    rpc(dir, "auth-status", 22, pb::AuthStatusRequest {});

    for (i, url) in [
        "nats://",
        "nats://127.0.0.1:4222?noEmbed&bucket=kine&replicas=3",
        "nats://user:pw@a:4222,nats://b:4222?noEmbed&requestTimeout=5s&syncAlways",
        "nats://?serverConfig=/etc/nats.conf&dataDir=/var/lib/kine&bucket=k&mirror=kine&mirrorDomain=hub",
        "mysql://root:secret@tcp(127.0.0.1:3306)/kubernetes?tls=true",
        "mysql://user:p%40ss@host:3306/db",
        "root:pw@unix(/run/mysqld/mysqld.sock)/kine",
    ]
    .iter()
    .enumerate()
    {
        write(dir, "endpoints", &format!("url{i}"), url.as_bytes());
    }

    // Requests to the metrics listener, as Prometheus, a load balancer and curl send them.
    for (i, request) in [
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: text/plain;version=0.0.4\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: k\r\n\r\nGET /health?serializable=true HTTP/1.1\r\nHost: k\r\n\r\n",
        "GET /health?exclude=NOSPACE&exclude=CORRUPT&lag=1m30s&lag_revisions=1000 HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n",
        "GET /health?lag=5&lag_revisions=-1 HTTP/1.0\r\n\r\n",
        "POST /health HTTP/1.1\r\nHost: k\r\nContent-Length: 5\r\n\r\nhello",
        "PUT /metrics HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "GET /debug/pprof HTTP/1.1\r\nHost: k\r\n\r\n",
    ]
    .iter()
    .enumerate()
    {
        write(dir, "http", &format!("request{i}"), request.as_bytes());
    }

    let messages: [&str; 4] = [
        "$KV.kine.L3JlZ2lzdHJ5L2E\nKine-Create: 2\nKine-Version: 1\n\nvalue",
        "$KV.kine.L3JlZ2lzdHJ5L2E\nKine-Create: 2\nKine-Version: 3\nKine-Lease: 7\nKine-Batch: 1/2\n\nv",
        "$KV.kine.L3JlZ2lzdHJ5L2E\nKV-Operation: DEL\n\n",
        "$KV.kine.~init\n\n",
    ];
    for (i, m) in messages.iter().enumerate() {
        write(dir, "nats_message", &format!("msg{i}"), m.as_bytes());
    }

    let kv = KeyValue { key, create_revision: 2, mod_revision: 3, version: 2, value: b"v".to_vec(), lease: 7 };
    let mut body = kine_core::snapshot::encode_head(3, 1, 42, &[(7, 60)]);
    kine_core::snapshot::encode_kv(&mut body, &kv);
    let written = body.len() as u64;
    body.extend(kine_core::snapshot::encode_tail(1, written));
    // Mode 1: the target appends the sha256 itself.
    let mut with_mode = vec![1u8];
    with_mode.extend_from_slice(&body);
    write(dir, "snapshot", "one-key", &with_mode);
    let mut empty = vec![1u8];
    let mut e = kine_core::snapshot::encode_head(1, 0, 1, &[]);
    let n = e.len() as u64;
    e.extend(kine_core::snapshot::encode_tail(0, n));
    empty.extend_from_slice(&e);
    write(dir, "snapshot", "empty", &empty);
}
