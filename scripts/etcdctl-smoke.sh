#!/usr/bin/env bash
# etcdctl smoke test for kine-rs.
#
# Starts kine-rs on a free loopback port, once on a fresh temporary SQLite
# database and once on memory://, drives it with the stock `etcdctl` (v3 API)
# and asserts the exact results etcd 3.6 gives: revisions, versions, txn
# branches, watch event streams, leases, compaction errors and the maintenance
# calls. Prints one `ok - ...` / `not ok - ...` line per check and finally
# `N passed, M failed`; exits non-zero if any check failed.
#
# Environment:
#   KINE_RS_BIN  path of the kine-rs binary (default: <repo>/target/debug/kine-rs)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$SCRIPT_DIR")
KINE_RS_BIN=${KINE_RS_BIN:-$REPO_ROOT/target/debug/kine-rs}

die() {
    echo "etcdctl-smoke: error: $*" >&2
    exit 2
}

[[ -f $KINE_RS_BIN ]] || die "kine-rs binary not found at '$KINE_RS_BIN' (build it with 'cargo build -p kine-rs' or set KINE_RS_BIN)"
[[ -x $KINE_RS_BIN ]] || die "kine-rs binary at '$KINE_RS_BIN' is not executable"
command -v etcdctl >/dev/null 2>&1 || die "etcdctl is not installed (e.g. 'apt-get install etcd-client')"
command -v python3 >/dev/null 2>&1 || die "python3 is required to parse etcdctl's JSON output"
# Resolve the interpreter once: version-manager shims (pyenv) cost ~0.2 s a call.
PYTHON=$(python3 -c 'import sys; print(sys.executable)') || die "python3 does not run"

# etcdctl reads ETCDCTL_* variables as flags; make sure none leaks in.
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^ETCDCTL_' || true)
export ETCDCTL_API=3

PASS=0
FAIL=0
BACKEND=-
EP=""            # http://127.0.0.1:PORT, as printed by the ready line
EP_HOSTPORT=""   # 127.0.0.1:PORT
SERVER_PID=""
BG_PIDS=()
TMP_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/kine-rs-etcdctl-smoke.XXXXXX")

cleanup() {
    local pid
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do
        kill "$pid" 2>/dev/null || true
    done
    # Gone before their files are removed (a client still writing would leave some behind).
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP_ROOT" || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- reporting

show() { # one-line rendering of a possibly multi-line value
    if [[ $1 == *$'\n'* || -z $1 ]]; then printf '%q' "$1"; else printf '%s' "$1"; fi
}

pass() {
    PASS=$((PASS + 1))
    echo "ok - [$BACKEND] $1"
}

fail() {
    FAIL=$((FAIL + 1))
    echo "not ok - [$BACKEND] $1"
}

check_eq() { # description expected actual
    if [[ $3 == "$2" ]]; then
        pass "$1"
    else
        fail "$1 (expected: $(show "$2"), actual: $(show "$3"))"
    fi
}

check_contains() { # description needle haystack
    if [[ $3 == *"$2"* ]]; then
        pass "$1"
    else
        fail "$1 (expected to contain: $(show "$2"), actual: $(show "$3"))"
    fi
}

last_line() { printf '%s\n' "$1" | tail -n 1; }

# Checks that the last etcdctl call succeeded; on failure reports its error.
check_rc0() { # description
    if [[ $RC -eq 0 ]]; then
        pass "$1"
        return 0
    fi
    fail "$1 (expected: exit 0, actual: exit $RC: $(show "$(last_line "$ERR")"))"
    return 1
}

# Checks that the last etcdctl call failed with an error containing $2.
check_error() { # description substring
    if [[ $RC -ne 0 && $ERR == *"$2"* ]]; then
        pass "$1"
    elif [[ $RC -eq 0 ]]; then
        fail "$1 (expected: failure with \"$2\", actual: exit 0, stdout $(show "$OUT"))"
    else
        fail "$1 (expected: failure with \"$2\", actual: exit $RC: $(show "$(last_line "$ERR")"))"
    fi
}

# ---------------------------------------------------------------- helpers

# Runs etcdctl against $CTL_EP (default $EP); sets OUT (stdout), ERR (stderr), RC.
# (`timeout` guards against a call that never returns, e.g. a watch.)
ctl() {
    local errf="$TMP_ROOT/etcdctl.stderr"
    set +e
    OUT=$(timeout 30 etcdctl --endpoints="${CTL_EP:-$EP}" --dial-timeout=3s --command-timeout=10s "$@" 2>"$errf")
    RC=$?
    set -e
    ERR=$(<"$errf")
}

# Evaluates a Python expression over the JSON document $2 (bound to `d`;
# `b64(s)` decodes a base64 key/value). Strings print raw, the rest as JSON.
jget() { # expression json
    "$PYTHON" - "$1" "$2" <<'PY'
import base64, json, sys
try:
    d = json.loads(sys.argv[2])
    v = eval(sys.argv[1], {"d": d, "b64": lambda s: base64.b64decode(s).decode()})
except Exception as e:  # report instead of aborting: the check shows it
    v = "<cannot evaluate %s: %s: %s>" % (sys.argv[1], type(e).__name__, e)
print(v if isinstance(v, str) else json.dumps(v))
PY
}

# Current store revision (header revision of a read).
cur_rev() {
    ctl get /__smoke/rev-probe -w json
    if [[ $RC -ne 0 ]]; then
        echo "<get failed: $(last_line "$ERR")>"
        return 0
    fi
    jget 'd["header"]["revision"]' "$OUT"
}

# Waits until file $1 has at least $2 lines (at most ~10 s).
wait_lines() {
    local i
    for i in $(seq 100); do
        [[ $(wc -l <"$1") -ge $2 ]] && return 0
        sleep 0.1
    done
    return 0
}

start_server() { # datastore-endpoint run-dir
    local log="$2/kine-rs.log" url="" deadline
    "$KINE_RS_BIN" --listen-address 127.0.0.1:0 --metrics-bind-address 0 --endpoint "$1" >"$log" 2>&1 &
    SERVER_PID=$!
    deadline=$((SECONDS + 20))
    while :; do
        url=$(grep -o 'kine-rs ready: etcd clients connect to http://[0-9.]*:[0-9]*' "$log" 2>/dev/null |
            head -n 1 | sed 's/.* //') || true
        [[ -n $url ]] && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            local rc=0
            wait "$SERVER_PID" || rc=$?
            SERVER_PID=""
            fail "kine-rs starts (exited with status $rc before becoming ready); its log:"
            sed 's/^/    | /' "$log"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            fail "kine-rs starts (no ready line within 20 s); its log:"
            sed 's/^/    | /' "$log"
            kill -KILL "$SERVER_PID" 2>/dev/null || true
            wait "$SERVER_PID" 2>/dev/null || true
            SERVER_PID=""
            return 1
        fi
        sleep 0.1
    done
    EP=$url
    EP_HOSTPORT=${url#http://}
    pass "kine-rs ready at $EP"
}

stop_server() { # run-dir
    local rc=0 watchdog
    kill -TERM "$SERVER_PID"
    (sleep 15 && kill -KILL "$SERVER_PID" 2>/dev/null) &
    watchdog=$!
    wait "$SERVER_PID" || rc=$?
    kill "$watchdog" 2>/dev/null || true
    wait "$watchdog" 2>/dev/null || true
    SERVER_PID=""
    if [[ $rc -eq 0 ]]; then
        pass "SIGTERM: kine-rs exits 0"
    else
        fail "SIGTERM: kine-rs exits 0 (expected: exit 0, actual: exit $rc$([[ $rc -eq 137 ]] && echo ', killed after 15 s'))"
        echo "    last lines of the kine-rs log:"
        tail -n 20 "$1/kine-rs.log" | sed 's/^/    | /'
    fi
}

# ---------------------------------------------------------------- checks

test_put_get() {
    local r
    ctl get /k -w json
    check_eq "fresh store: get header revision is 1" 1 "$(jget 'd["header"]["revision"]' "$OUT")"
    check_eq "fresh store: get of a missing key has count 0" 0 "$(jget 'd.get("count", 0)' "$OUT")"

    ctl put /k v1 -w json
    check_eq "first put: header revision 2" 2 "$(jget 'd["header"]["revision"]' "$OUT")"
    ctl get /k -w json
    check_eq "first put: value" v1 "$(jget 'b64(d["kvs"][0]["value"])' "$OUT")"
    check_eq "first put: create_revision 2" 2 "$(jget 'd["kvs"][0]["create_revision"]' "$OUT")"
    check_eq "first put: mod_revision 2" 2 "$(jget 'd["kvs"][0]["mod_revision"]' "$OUT")"
    check_eq "first put: version 1" 1 "$(jget 'd["kvs"][0]["version"]' "$OUT")"

    ctl put /k v2 -w json
    check_eq "second put: header revision 3" 3 "$(jget 'd["header"]["revision"]' "$OUT")"
    ctl get /k -w json
    check_eq "second put: create_revision still 2" 2 "$(jget 'd["kvs"][0]["create_revision"]' "$OUT")"
    check_eq "second put: mod_revision 3" 3 "$(jget 'd["kvs"][0]["mod_revision"]' "$OUT")"
    check_eq "second put: version 2" 2 "$(jget 'd["kvs"][0]["version"]' "$OUT")"

    ctl get /k
    check_eq "get prints key and value" $'/k\nv2' "$OUT"
    ctl get /k --rev 2 --print-value-only
    check_eq "get --rev 2 returns the older value" v1 "$OUT"
    ctl get /k --rev 3 --print-value-only
    check_eq "get --rev 3 returns the newer value" v2 "$OUT"
    ctl get /k --rev 99999
    check_error "get --rev in the future fails" "required revision is a future revision"

    ctl put /p/a 1 && ctl put /p/b 2 && ctl put /p/c 3 && ctl put /q x && ctl put /p 0
    ctl get /p/ --prefix
    check_eq "get --prefix returns the keys under the prefix, in order" $'/p/a\n1\n/p/b\n2\n/p/c\n3' "$OUT"
    ctl get /p/ --prefix --keys-only
    check_eq "get --prefix --keys-only" $'/p/a\n\n/p/b\n\n/p/c' "$OUT"
    ctl get /p/ --prefix --limit 2 -w json
    check_eq "get --limit 2: count is the total (3)" 3 "$(jget 'd.get("count", 0)' "$OUT")"
    check_eq "get --limit 2: more is true" true "$(jget 'd.get("more", False)' "$OUT")"
    check_eq "get --limit 2: returns the first 2 keys" '["/p/a", "/p/b"]' "$(jget '[b64(kv["key"]) for kv in d["kvs"]]' "$OUT")"
    ctl get /p/ --prefix --limit 3 -w json
    check_eq "get --limit 3 of 3: more is false" false "$(jget 'd.get("more", False)' "$OUT")"

    r=$(cur_rev)
    ctl del /p/a
    check_eq "del of an existing key prints 1" 1 "$OUT"
    check_eq "del advances the revision by exactly 1" $((r + 1)) "$(cur_rev)"
    ctl get /p/a -w json
    check_eq "deleted key is gone" 0 "$(jget 'd.get("count", 0)' "$OUT")"
    r=$(cur_rev)
    ctl del /p/missing
    check_eq "del of a missing key prints 0" 0 "$OUT"
    check_eq "del of a missing key does not advance the revision" "$r" "$(cur_rev)"
    ctl del /p/ --prefix
    check_eq "del --prefix of 2 keys prints 2" 2 "$OUT"
    check_eq "del --prefix of 2 keys advances the revision by exactly 1" $((r + 1)) "$(cur_rev)"
}

test_txn() {
    local r
    ctl put /t/k v1
    r=$(cur_rev)
    ctl txn -i <<<$'value("/t/k") = "v1"\n\nput /t/res success\n\nput /t/res failure\n\n'
    check_rc0 "txn (compare succeeds) runs" || true
    check_eq "txn (compare succeeds) reports SUCCESS" SUCCESS "$(grep -x -m1 -E 'SUCCESS|FAILURE' <<<"$OUT" || true)"
    ctl get /t/res --print-value-only
    check_eq "txn (compare succeeds) ran the success branch" success "$OUT"
    check_eq "txn with one put advances the revision by 1" $((r + 1)) "$(cur_rev)"

    ctl txn -i <<<$'value("/t/k") = "nope"\n\nput /t/res success2\n\nput /t/res failure2\nget /t/res\n\n'
    check_rc0 "txn (compare fails) runs" || true
    check_eq "txn (compare fails) reports FAILURE" FAILURE "$(grep -x -m1 -E 'SUCCESS|FAILURE' <<<"$OUT" || true)"
    check_eq "txn (compare fails): get in the branch sees the branch's put" failure2 "$(last_line "$OUT")"
    ctl get /t/res --print-value-only
    check_eq "txn (compare fails) ran the failure branch" failure2 "$OUT"

    r=$(cur_rev)
    ctl txn -i <<<$'mod("/t/k") > "0"\nversion("/t/k") = "1"\n\nput /t/x 1\nput /t/y 2\ndel /t/res\n\n\n'
    check_eq "txn with two compares that hold reports SUCCESS" SUCCESS "$(grep -x -m1 -E 'SUCCESS|FAILURE' <<<"$OUT" || true)"
    check_eq "txn with several writes advances the revision by exactly 1" $((r + 1)) "$(cur_rev)"
    ctl get /t/ --prefix -w json
    check_eq "txn writes share the txn's revision" "[$((r + 1)), $((r + 1))]" \
        "$(jget '[kv["mod_revision"] for kv in d["kvs"] if b64(kv["key"]) in ("/t/x", "/t/y")]' "$OUT")"
}

test_watch() {
    local start w1="$RUN_DIR/watch.out" w2="$RUN_DIR/watch-prevkv.out" p1 p2
    start=$(($(cur_rev) + 1))
    etcdctl --endpoints="$EP" --dial-timeout=3s watch --prefix /w/ --rev "$start" >"$w1" 2>"$w1.err" &
    p1=$!
    BG_PIDS+=("$p1")
    etcdctl --endpoints="$EP" --dial-timeout=3s watch --prefix /w/ --rev "$start" --prev-kv >"$w2" 2>"$w2.err" &
    p2=$!
    BG_PIDS+=("$p2")

    ctl put /w/a 1
    ctl put /w/a 2
    ctl del /w/a
    ctl put /other z
    ctl put /w/b 3

    wait_lines "$w1" 12
    wait_lines "$w2" 16
    kill "$p1" "$p2" 2>/dev/null || true
    wait "$p1" 2>/dev/null || true
    wait "$p2" 2>/dev/null || true

    check_eq "watch --prefix --rev: PUT/PUT/DELETE/PUT events in order" \
        $'PUT\n/w/a\n1\nPUT\n/w/a\n2\nDELETE\n/w/a\n\nPUT\n/w/b\n3' "$(<"$w1")"
    check_eq "watch --prefix --rev --prev-kv: events carry the previous key-values" \
        $'PUT\n/w/a\n1\nPUT\n/w/a\n1\n/w/a\n2\nDELETE\n/w/a\n2\n/w/a\n\nPUT\n/w/b\n3' "$(<"$w2")"
    if [[ -s $w1.err || -s $w2.err ]]; then
        fail "watchers reported no errors (stderr: $(show "$(cat "$w1.err" "$w2.err")"))"
    else
        pass "watchers reported no errors"
    fi
}

test_leases() {
    local id r
    ctl lease grant 100
    id=$(awk '{print $2}' <<<"$OUT")
    check_eq "lease grant 100 prints the granted TTL" "lease $id granted with TTL(100s)" "$OUT"
    ctl put /l/a 1 --lease="$id"
    check_eq "put --lease" OK "$OUT"
    ctl put /l/b 2 --lease="$id"
    ctl get /l/a -w json
    check_eq "key carries the lease id" "$id" "$(jget '"%016x" % d["kvs"][0]["lease"]' "$OUT")"

    ctl lease timetolive "$id" --keys -w json
    check_eq "lease timetolive: id" "$id" "$(jget '"%016x" % d["id"]' "$OUT")"
    check_eq "lease timetolive: granted-ttl 100" 100 "$(jget 'd["granted-ttl"]' "$OUT")"
    check_eq "lease timetolive: remaining ttl within [95, 100]" true "$(jget '95 <= d["ttl"] <= 100' "$OUT")"
    check_eq "lease timetolive --keys: attached keys" '["/l/a", "/l/b"]' "$(jget 'sorted(b64(k) for k in d["keys"])' "$OUT")"
    ctl lease timetolive "$id" --keys
    check_contains "lease timetolive --keys (text) lists the keys" "attached keys([/l/a /l/b])" "$OUT"

    ctl lease keep-alive --once "$id"
    check_rc0 "lease keep-alive --once" || true
    check_eq "lease keep-alive --once renews to the granted TTL" "lease $id keepalived with TTL(100)" "$OUT"

    ctl lease list
    check_contains "lease list includes the lease" "$id" "$OUT"

    r=$(cur_rev)
    ctl lease revoke "$id"
    check_eq "lease revoke" "lease $id revoked" "$OUT"
    ctl get /l/ --prefix -w json
    check_eq "lease revoke deletes the attached keys" 0 "$(jget 'd.get("count", 0)' "$OUT")"
    check_eq "lease revoke of 2 keys advances the revision by exactly 1" $((r + 1)) "$(cur_rev)"
    ctl lease timetolive "$id"
    check_eq "lease timetolive after revoke reports expired" "lease $id already expired" "$OUT"
    ctl lease revoke "$id"
    check_error "lease revoke of a revoked lease fails" "requested lease not found"
    ctl lease keep-alive --once "$id"
    check_error "lease keep-alive --once of a revoked lease fails" "requested lease not found"

    # Expiry: etcd's minimum TTL is 2 s (with the default election timeout).
    ctl lease grant 2
    id=$(awk '{print $2}' <<<"$OUT")
    check_eq "lease grant 2" "lease $id granted with TTL(2s)" "$OUT"
    ctl put /l/ttl v --lease="$id"
    ctl get /l/ttl --print-value-only
    check_eq "key with a 2 s lease exists right away" v "$OUT"
    r=$(cur_rev)
    sleep 4
    ctl get /l/ttl -w json
    check_eq "key with a 2 s lease is gone after 4 s" 0 "$(jget 'd.get("count", 0)' "$OUT")"
    check_eq "lease expiry advances the revision by exactly 1" $((r + 1)) "$(cur_rev)"
    ctl lease timetolive "$id"
    check_eq "lease timetolive after expiry reports expired" "lease $id already expired" "$OUT"
}

test_compaction() {
    local r1 r2 r3 r
    ctl put /c/k v1
    r1=$(cur_rev)
    ctl put /c/k v2
    r2=$(cur_rev)
    ctl put /c/k v3
    r3=$(cur_rev)

    ctl compaction "$r2"
    check_rc0 "compaction $r2" || true
    check_eq "compaction prints the compacted revision" "compacted revision $r2" "$OUT"
    check_eq "compaction does not advance the revision" "$r3" "$(cur_rev)"
    ctl get /c/k --rev "$r1"
    check_error "get --rev below the compacted revision fails" "required revision has been compacted"
    ctl get /c/k --rev "$r2" --print-value-only
    check_eq "get --rev at the compacted revision still works" v2 "$OUT"
    ctl get /c/k --print-value-only
    check_eq "get after compaction returns the latest value" v3 "$OUT"
    ctl compaction $((r3 + 1000))
    check_error "compaction of a future revision fails" "required revision is a future revision"
    ctl compaction "$r1"
    check_error "compaction below the compacted revision fails" "required revision has been compacted"
    ctl watch /c/k --rev "$r1"
    check_error "watch from a compacted revision is canceled" "required revision has been compacted"
}

test_maintenance() {
    local r label
    r=$(cur_rev)
    # etcdctl 3.4 dials the maintenance calls (status, defrag) with the
    # endpoint string as :authority, so both endpoint spellings are exercised.
    for label in url hostport; do
        if [[ $label == url ]]; then CTL_EP=$EP; else CTL_EP=$EP_HOSTPORT; fi
        ctl endpoint status -w json
        if check_rc0 "endpoint status (--endpoints=$CTL_EP)"; then
            check_eq "endpoint status (--endpoints=$CTL_EP): version" 3.7.3 "$(jget 'd[0]["Status"]["version"]' "$OUT")"
            check_eq "endpoint status (--endpoints=$CTL_EP): revision matches" "$r" "$(jget 'd[0]["Status"]["header"]["revision"]' "$OUT")"
        fi
        ctl defrag
        if check_rc0 "defrag (--endpoints=$CTL_EP)"; then
            check_eq "defrag (--endpoints=$CTL_EP) output" "Finished defragmenting etcd member[$CTL_EP]" "$OUT"
        fi
    done
    CTL_EP=""

    ctl endpoint health -w json
    check_rc0 "endpoint health" || true
    check_eq "endpoint health: healthy" true "$(jget 'd[0]["health"]' "$OUT")"

    ctl member list -w json
    check_rc0 "member list" || true
    check_eq "member list: exactly one member" 1 "$(jget 'len(d["members"])' "$OUT")"
    check_eq "member list: the member advertises the client URL" true "$(jget 'd["members"][0]["clientURLs"] == ["'"$EP"'"]' "$OUT")"
    check_eq "member list: the member id is the header's member_id" true \
        "$(jget 'd["members"][0]["ID"] == d["header"]["member_id"]' "$OUT")"
    check_eq "maintenance calls do not advance the revision" "$r" "$(cur_rev)"
}

run_backend() { # label datastore-endpoint-template
    BACKEND=$1
    RUN_DIR="$TMP_ROOT/$1"
    mkdir -p "$RUN_DIR"
    local datastore=${2//@DIR@/$RUN_DIR}
    echo "# backend $BACKEND: --endpoint $datastore"
    start_server "$datastore" "$RUN_DIR" || return 0
    test_put_get
    test_txn
    test_watch
    test_leases
    test_compaction
    test_maintenance
    stop_server "$RUN_DIR"
}

START=$SECONDS
run_backend sqlite "sqlite://@DIR@/state.db"
run_backend memory "memory://"
BACKEND=-

echo "# runtime $((SECONDS - START)) s"
echo "$PASS passed, $FAIL failed"
[[ $FAIL -eq 0 ]]
