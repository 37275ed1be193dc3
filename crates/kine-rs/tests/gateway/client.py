#!/usr/bin/env python3
"""A non-Go client of etcd's JSON gateway, as APISIX (lua-resty-etcd) uses it: cjson-style
bodies (every field, numbers for 64-bit integers and enums, escaped slashes), base64 keys,
`Authorization: <token>`, range by prefix, a long-poll watch read line by line from a start
revision, leases with keepalive, a txn with camelCase oneof names; plus the rest of the
gateway (errors, auth, lock, election, maintenance).

Usage: client.py URL. Prints one normalised line per answer (status, then the JSON with ids,
tokens and member data replaced), so that two servers' transcripts can be compared line by
line; exits non-zero if an APISIX expectation fails. Standard library only.
"""

import base64
import http.client
import json
import sys
import urllib.parse

URL = urllib.parse.urlparse(sys.argv[1])
LEASES = {}


def b64(s):
    return base64.b64encode(s.encode()).decode()


def unb64(s):
    return base64.b64decode(s).decode()


def conn():
    return http.client.HTTPConnection(URL.hostname, URL.port, timeout=20)


def norm(value):
    """Ids, tokens and member data replaced by what does not differ between servers."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("cluster_id", "member_id", "memberID"):
                out[k] = "*"
            elif k == "raft_term":
                continue  # kine-rs has no raft: its term is 0, left out
            elif k == "ID" and isinstance(v, str):
                out[k] = LEASES.setdefault(v, "L%d" % (len(LEASES) + 1))
            elif k == "lease" and isinstance(v, str) and v != "0":
                out[k] = LEASES.setdefault(v, "L%d" % (len(LEASES) + 1))
            elif k == "token":
                out[k] = "TOKEN"
            elif k == "key" and isinstance(v, str):
                # Lock and election keys end with the lease id in hex.
                text = unb64(v)
                name, _, tail = text.rpartition("/")
                try:
                    if len(tail) < 8:
                        raise ValueError
                    dec = str(int(tail, 16))
                    out[k] = "%s/%s" % (name, LEASES.setdefault(dec, "L%d" % (len(LEASES) + 1)))
                except ValueError:
                    out[k] = text
            elif k in ("value", "range_end") and isinstance(v, str):
                out[k] = unb64(v)
            elif k == "members":
                out[k] = len(v)
            else:
                out[k] = norm(v)
        return out
    if isinstance(value, list):
        return [norm(v) for v in value]
    return value


def say(label, status, body):
    print("%s: %s %s" % (label, status, json.dumps(norm(body), sort_keys=True)))


def post(label, path, body, token=None, headers=None, raw=None, show=True):
    c = conn()
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = token
    h.update(headers or {})
    data = raw if raw is not None else json.dumps(body).replace("/", "\\/")
    c.request("POST", path, data, h)
    r = c.getresponse()
    text = r.read().decode()
    assert r.getheader("Access-Control-Allow-Origin") == "*", label
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    if show:
        if isinstance(parsed, dict) and "code" in parsed and "message" in parsed and raw is not None:
            parsed = {"code": parsed["code"]}  # the text of a JSON syntax error is the parser's own
        say(label, r.status, parsed)
    if r.status == 401:
        assert r.getheader("WWW-Authenticate") == parsed["message"], label
    return r.status, parsed


def stream(label, path, body, lines, token=None, show=True):
    """POSTs a streaming request and reads JSON lines, each ending with a newline, as
    lua-resty-etcd reads a watch, until `lines` (a count, or a test of the lines read so far)
    is satisfied; then closes the connection (how APISIX cancels)."""
    if isinstance(lines, int):
        count = lines
        lines = lambda got: len(got) >= count
    c = conn()
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = token
    c.request("POST", path, json.dumps(body).replace("/", "\\/"), h)
    r = c.getresponse()
    got = []
    while not lines(got):
        line = r.readline()
        if not line:
            break
        assert line.endswith(b"\n"), (label, line)
        got.append(json.loads(line))
    c.close()
    for i, item in enumerate(got if show else []):
        say("%s[%d]" % (label, i), r.status, item)
    return got


def cjson_range(key, end):
    return {"key": b64(key), "range_end": b64(end), "limit": 0, "revision": 0, "sort_order": 0, "sort_target": 0,
            "serializable": False, "keys_only": False, "count_only": False, "min_mod_revision": 0,
            "max_mod_revision": 0, "min_create_revision": 0, "max_create_revision": 0}


def main():
    # APISIX's `apisix init` reads /version and needs `etcdcluster` (semver >= 3.4.0).
    c = conn()
    c.request("GET", "/version")
    r = c.getresponse()
    version = json.loads(r.read())
    assert version["etcdcluster"].count(".") == 2 and version["etcdcluster"] >= "3.4.0", version
    print("version: %s %s" % (r.status, sorted(version.keys())))

    # Writes and reads as APISIX does them.
    _, put = post("init dir", "/v3/kv/put", {"key": b64("/apisix/routes/"), "value": b64("init_dir")})
    assert "revision" in put["header"], "APISIX needs header.revision"
    post("put route 1", "/v3/kv/put", {"key": b64("/apisix/routes/1"), "value": b64('{"uri":"/a"}')})
    post("put route 2 prev_kv", "/v3/kv/put", {"key": b64("/apisix/routes/2"), "value": b64('{"uri":"/b"}'), "prev_kv": True})
    post("put route 1 prev_kv", "/v3/kv/put", {"key": b64("/apisix/routes/1"), "value": b64('{"uri":"/c"}'), "prev_kv": True})
    _, rng = post("readdir", "/v3/kv/range", cjson_range("/apisix/routes/", "/apisix/routes0"))
    assert [unb64(kv["key"]) for kv in rng["kvs"]] == ["/apisix/routes/", "/apisix/routes/1", "/apisix/routes/2"]
    post("get missing", "/v3/kv/range", {"key": b64("/apisix/none")})
    post("count only", "/v3/kv/range", {"key": b64("/apisix/"), "range_end": b64("/apisix0"), "count_only": True})
    post("keys only, limit 1", "/v3/kv/range", {"key": b64("/apisix/"), "range_end": b64("/apisix0"), "keys_only": True, "limit": "1"})
    post("sorted descending", "/v3/kv/range", {"key": b64("/apisix/"), "range_end": b64("/apisix0"), "sort_order": "DESCEND", "sort_target": "MOD"})
    # atomic_set: a txn with a MOD compare and a camelCase put.
    mod = rng["kvs"][1]["mod_revision"]
    txn = {"compare": [{"key": b64("/apisix/routes/1"), "target": "MOD", "result": "EQUAL", "mod_revision": int(mod)}],
           "success": [{"requestPut": {"key": b64("/apisix/routes/1"), "value": b64('{"uri":"/d"}')}}]}
    _, t = post("atomic set", "/v3/kv/txn", txn)
    assert t.get("succeeded") is True
    _, t = post("atomic set, stale", "/v3/kv/txn", txn)
    assert "succeeded" not in t, "a failed compare leaves succeeded out"
    post("txn with a range", "/v3/kv/txn", {"success": [{"request_range": {"key": b64("/apisix/routes/2")}},
                                                        {"requestDeleteRange": {"key": b64("/apisix/routes/2"), "prev_kv": True}}]})
    post("delete prefix", "/v3/kv/deleterange", {"key": b64("/apisix/routes/"), "range_end": b64("/apisix/routes0"), "prev_kv": True})
    post("v3beta put", "/v3beta/kv/put", {"key": b64("/beta"), "value": b64("1")})

    # Leases.
    _, grant = post("lease grant", "/v3/lease/grant", {"TTL": 60, "ID": 0})
    lease = grant["ID"]
    post("put with lease", "/v3/kv/put", {"key": b64("/apisix/upstreams/1"), "value": b64("u"), "lease": lease})
    post("time to live", "/v3/kv/lease/timetolive", {"ID": lease, "keys": True})
    post("leases", "/v3/lease/leases", {})
    stream("keepalive", "/v3/lease/keepalive", {"ID": lease}, 1)
    post("revoke", "/v3/kv/lease/revoke", {"ID": lease})
    post("revoke again", "/v3/lease/revoke", {"ID": lease})
    post("grant a too large TTL", "/v3/lease/grant", {"TTL": "9000000001"})

    # Watches: from a start revision, read line by line, then the connection closed.
    _, now = post("revision now", "/v3/kv/range", {"key": b64("/apisix/none")}, show=False)
    start = int(now["header"]["revision"])
    post("change 1", "/v3/kv/put", {"key": b64("/apisix/ssl/1"), "value": b64("s1")})
    post("change 2", "/v3/kv/deleterange", {"key": b64("/apisix/ssl/1")})
    def events_of(got):
        return [e for line in got[1:] for e in line["result"].get("events", [])]
    lines = stream("watch", "/v3/watch", {"create_request": {"key": b64("/apisix/"), "range_end": b64("/apisix0"),
                                                             "start_revision": start + 1, "prev_kv": True}},
                   lambda got: len(events_of(got)) >= 2, show=False)
    assert lines[0]["result"]["created"] is True
    say("watch created", 200, lines[0])
    events = events_of(lines)
    say("watch events", 200, events)
    assert [e.get("type", "PUT") for e in events] == ["PUT", "DELETE"], events
    post("compact", "/v3/kv/compaction", {"revision": start + 1})
    stream("watch compacted", "/v3/watch", {"create_request": {"key": b64("/apisix/"), "start_revision": 2}}, 2)
    stream("watch, negative start", "/v3/watch", {"create_request": {"key": b64("/a"), "start_revision": -1}}, 1)

    # Errors, as etcd's gateway answers them.
    post("empty key", "/v3/kv/range", {"key": ""})
    post("future revision", "/v3/kv/range", {"key": b64("/a"), "revision": 1000000})
    post("compacted revision", "/v3/kv/range", {"key": b64("/a"), "revision": 2})
    post("malformed json", "/v3/kv/range", None, raw="{not json")
    post("wrong type", "/v3/kv/put", None, raw='{"key":"L2E=","lease":"abc"}')
    post("unknown path", "/v3/kv/nothing", {})
    post("duplicate txn keys", "/v3/kv/txn", {"success": [{"request_put": {"key": b64("k")}}, {"request_put": {"key": b64("k")}}]})
    c = conn()
    c.request("GET", "/v3/kv/range")
    r = c.getresponse()
    say("GET on a POST route", r.status, json.loads(r.read()))
    c = conn()
    c.request("GET", "/somewhere")
    r = c.getresponse()
    print("not the gateway: %s %r" % (r.status, r.read().decode()))
    c = conn()
    c.request("OPTIONS", "/v3/kv/range")
    r = c.getresponse()
    print("options: %s %r" % (r.status, r.read().decode()))

    # Maintenance and cluster.
    _, status = post("status", "/v3/maintenance/status", {}, show=False)
    print("status keys: %s" % sorted(k for k in status if k in ("header", "version", "leader", "raftIndex", "dbSize")))
    post("alarms", "/v3/maintenance/alarm", {"action": "GET"})
    _, members = post("members", "/v3/cluster/member/list", {}, show=False)
    print("members: %d" % len(members["members"]))
    _, hkv = post("hashkv", "/v3/maintenance/hashkv", {"revision": 0}, show=False)
    print("hashkv keys: %s" % sorted(hkv.keys()))

    # Lock and election.
    _, g = post("session lease", "/v3/lease/grant", {"TTL": 60})
    held = post("lock", "/v3/lock/lock", {"name": b64("/apisix/lock"), "lease": g["ID"]})[1]
    post("unlock", "/v3/lock/unlock", {"key": held["key"]})
    _, won = post("campaign", "/v3/election/campaign", {"name": b64("/apisix/leader"), "lease": g["ID"], "value": b64("node-1")})
    post("proclaim", "/v3/election/proclaim", {"leader": won["leader"], "value": b64("node-1b")})
    post("leader", "/v3/election/leader", {"name": b64("/apisix/leader")})
    stream("observe", "/v3/election/observe", {"name": b64("/apisix/leader")}, 1)
    post("resign", "/v3/election/resign", {"leader": won["leader"]})
    post("leader after resigning", "/v3/election/leader", {"name": b64("/apisix/leader")})

    # Auth, with the token as APISIX sends it.
    for label, path, body in [
        ("add root", "/v3/auth/user/add", {"name": "root", "password": "rootpw"}),
        ("grant root", "/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("add role", "/v3/auth/role/add", {"name": "apisix"}),
        ("grant prefix", "/v3/auth/role/grant", {"name": "apisix", "perm": {"permType": "READWRITE", "key": b64("/apisix/"), "range_end": b64("/apisix0")}}),
        ("add apisix user", "/v3/auth/user/add", {"name": "apisix", "password": "pw"}),
        ("grant apisix", "/v3/auth/user/grant", {"user": "apisix", "role": "apisix"}),
        ("authenticate while disabled", "/v3/auth/authenticate", {"name": "root", "password": "rootpw"}),
        ("enable", "/v3/auth/enable", {}),
    ]:
        post(label, path, body)
    _, auth = post("authenticate", "/v3/auth/authenticate", {"name": "apisix", "password": "pw"})
    token = auth["token"]
    post("wrong password", "/v3/auth/authenticate", {"name": "apisix", "password": "nope"})
    post("range with the token", "/v3/kv/range", cjson_range("/apisix/", "/apisix0"), token=token)
    post("range without a token", "/v3/kv/range", cjson_range("/apisix/", "/apisix0"))
    post("range with a bad token", "/v3/kv/range", {"key": b64("/apisix/a")}, token="garbled.1")
    post("bearer token", "/v3/kv/put", {"key": b64("/apisix/x"), "value": b64("1")}, token="Bearer " + token)
    post("token as grpc metadata", "/v3/kv/range", {"key": b64("/apisix/x")}, headers={"Grpc-Metadata-Token": token})
    post("put outside the prefix", "/v3/kv/put", {"key": b64("/other"), "value": b64("1")}, token=token)
    stream("watch outside the prefix", "/v3/watch", {"create_request": {"key": b64("/other")}}, 1, token=token)
    post("role get", "/v3/auth/role/get", {"role": "apisix"}, token=token)
    post("user list by a non-admin", "/v3/auth/user/list", {}, token=token)
    _, root = post("authenticate root", "/v3/auth/authenticate", {"name": "root", "password": "rootpw"})
    post("status", "/v3/auth/status", {}, token=root["token"])
    post("user list", "/v3/auth/user/list", {}, token=root["token"])
    post("disable", "/v3/auth/disable", {}, token=root["token"])
    post("open again", "/v3/kv/range", {"key": b64("/apisix/x")})


if __name__ == "__main__":
    main()
