#!/usr/bin/env bash
# Soak: a real kube-apiserver on kine-rs, ConfigMaps churned through it and watched for a long
# time, a fault every few minutes, and every kine-rs node's resources sampled as it goes.
#
#   scripts/soak.sh [--minutes N] [--fault-every M] [--sample S] [--rate R] [--out DIR] BACKEND
#
# BACKEND: sqlite (one kine-rs; the fault stalls it) or nats-cluster (three kine-rs, each with
# its embedded nats-server clustered with the other two over loopback, kube-apiserver on all
# three; the fault stalls one node, in turn). A fault is SIGSTOP for 10 s, then SIGCONT.
# Defaults: 60 minutes, a fault every 5 minutes, a sample every 60 s, 20 operations/s.
#
# The client (scripts/soak-churn.py) creates, reads, updates, lists and deletes ConfigMaps and
# keeps a watch open, timing every call. Each sample appends to DIR/samples.csv, per node: RSS,
# open files, async tasks (kine_runtime_alive_tasks), revision; and the client's operations,
# errors and latency percentiles since the last sample. At the end: DIR/soak.svg (the plot,
# scripts/soak-plot.py) and one line `soak BACKEND: PASS|FAIL (...)`. It fails when a node's RSS
# at the end is more than 1.5 times (+16 MiB) its RSS after the first quarter, when the client's
# calls all failed for longer than a fault plus 30 s, or when a process died.
#
# Environment: KINE_RS_BIN (default target/release/kine-rs, else target/debug/kine-rs),
# KUBE_APISERVER_BIN (default $(go env GOPATH)/bin/kube-apiserver-1.37.2).
set -Eeuo pipefail

KUBE_VERSION=1.37.2
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MINUTES=60 FAULT_EVERY=5 SAMPLE=60 RATE=20 OUT="" BACKEND=""
FAULT_SECONDS=10
usage() { sed -n '5,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --fault-every) FAULT_EVERY=$2; shift 2 ;;
    --sample) SAMPLE=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "soak: unknown option $1" >&2; usage ;;
    *) [[ -z $BACKEND ]] || usage; BACKEND=$1; shift ;;
    esac
done
case "$BACKEND" in sqlite | nats-cluster) ;; *) usage ;; esac
[[ $MINUTES =~ ^[0-9]+(\.[0-9]+)?$ && $SAMPLE =~ ^[0-9]+$ && $SAMPLE -gt 0 && $FAULT_EVERY =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
    { echo "soak: --minutes, --fault-every and --sample take positive numbers" >&2; exit 2; }

gobin=$( (go env GOPATH 2>/dev/null || echo "$HOME/go") | head -1 | cut -d: -f1)/bin
default_bin=$REPO_ROOT/target/release/kine-rs
[[ -x $default_bin ]] || default_bin=$REPO_ROOT/target/debug/kine-rs
KINE_RS_BIN=${KINE_RS_BIN:-$default_bin}
KUBE_APISERVER_BIN=${KUBE_APISERVER_BIN:-$gobin/kube-apiserver-$KUBE_VERSION}
die() { echo "soak $BACKEND: FAIL (setup: $*)"; exit 1; }
[[ -x $KINE_RS_BIN ]] || die "kine-rs missing at $KINE_RS_BIN (cargo build --release -p kine-rs)"
[[ -x $KUBE_APISERVER_BIN ]] || die "kube-apiserver missing at $KUBE_APISERVER_BIN (tools/kubernetes/build.sh, run by scripts/install-test-deps)"
command -v openssl >/dev/null || die "openssl missing (apt-get install openssl)"

OUT=${OUT:-$REPO_ROOT/target/soak/$BACKEND-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kine-rs-soak.XXXXXX")
PIDS=()
STOPPED=""
cleanup() {
    local rc=$? i
    trap - EXIT INT TERM
    [[ -n $STOPPED ]] && kill -CONT "$STOPPED" 2>/dev/null
    touch "$WORK/stop"
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; done
    sleep 2
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -KILL "${PIDS[$i]}" 2>/dev/null || true; done
    wait 2>/dev/null || true
    cp "$WORK"/*.log "$OUT/" 2>/dev/null || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
metric() { # text name: the first sample of an unlabelled metric
    awk -v n="$2" '$1 == n { print $2; exit }' <<<"$1"
}

# ---------------------------------------------------------------- kine-rs nodes

NODES=1
[[ $BACKEND == nats-cluster ]] && NODES=3
declare -a NODE_PID NODE_URL NODE_METRICS
start_node() { # index endpoint
    local i=$1 line
    "$KINE_RS_BIN" --listen-address 127.0.0.1:0 --metrics-bind-address 127.0.0.1:0 --endpoint "$2" \
        >"$WORK/kine-rs-$i.log" 2>&1 &
    NODE_PID[i]=$!
    PIDS+=("${NODE_PID[i]}")
}
if [[ $BACKEND == sqlite ]]; then
    start_node 0 "sqlite://$WORK/state.db"
else
    routes=() client=()
    for i in 0 1 2; do routes[i]=$(free_port); client[i]=$(free_port); done
    for i in 0 1 2; do
        printf 'server_name: soak-%s\ncluster {\n  name: soak\n  listen: 127.0.0.1:%s\n  routes: [%s]\n}\n' \
            "$i" "${routes[i]}" "nats-route://127.0.0.1:${routes[0]}, nats-route://127.0.0.1:${routes[1]}, nats-route://127.0.0.1:${routes[2]}" \
            >"$WORK/nats-$i.conf"
        start_node "$i" "nats://127.0.0.1:${client[i]}?serverConfig=$WORK/nats-$i.conf&replicas=3&dataDir=$WORK/nats-$i"
    done
fi
for ((i = 0; i < NODES; i++)); do
    for _ in $(seq 600); do
        line=$(grep -m1 'kine-rs ready: etcd clients connect to ' "$WORK/kine-rs-$i.log" 2>/dev/null || true)
        [[ -n $line ]] && break
        kill -0 "${NODE_PID[i]}" 2>/dev/null || die "kine-rs node $i exited: $(tail -3 "$WORK/kine-rs-$i.log")"
        sleep 0.1
    done
    [[ -n $line ]] || die "kine-rs node $i not ready within 60 s"
    NODE_URL[i]=$(grep -o 'connect to http://[0-9.]*:[0-9]*' <<<"$line" | cut -d' ' -f3)
    NODE_METRICS[i]=$(grep -o 'metrics=http://[0-9.]*:[0-9]*' <<<"$line" | cut -d= -f2)
done
ETCD_SERVERS=$(IFS=,; echo "${NODE_URL[*]}")
echo "# soak $BACKEND: $NODES kine-rs node(s) at $ETCD_SERVERS ($("$KINE_RS_BIN" --version | head -1)); output in $OUT"

# ---------------------------------------------------------------- kube-apiserver

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=kine-rs-soak \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$WORK/serving.key" -out "$WORK/serving.crt" >/dev/null 2>&1 ||
    die "openssl: the serving certificate"
openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/sa.key" 2>/dev/null || die "openssl: the service account key"
TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
echo "$TOKEN,soak-admin,soak-admin,system:masters" >"$WORK/tokens.csv"
API_PORT=$(free_port)
"$KUBE_APISERVER_BIN" --etcd-servers="$ETCD_SERVERS" --etcd-compaction-interval=1m \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$WORK/serving.crt" --tls-private-key-file="$WORK/serving.key" --cert-dir="$WORK/apiserver-certs" \
    --token-auth-file="$WORK/tokens.csv" --authorization-mode=AlwaysAllow \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$WORK/sa.key" --service-account-signing-key-file="$WORK/sa.key" \
    --service-cluster-ip-range=10.96.0.0/24 --endpoint-reconciler-type=none --profiling=false \
    >"$WORK/kube-apiserver.log" 2>&1 &
APISERVER_PID=$!
PIDS+=("$APISERVER_PID")
ready=""
for _ in $(seq 240); do
    kill -0 "$APISERVER_PID" 2>/dev/null || break
    if python3 - "$API_PORT" "$WORK/serving.crt" "$TOKEN" <<'EOF' 2>/dev/null; then
import ssl, sys, urllib.request
req = urllib.request.Request(f"https://127.0.0.1:{sys.argv[1]}/readyz", headers={"Authorization": "Bearer " + sys.argv[3]})
sys.exit(0 if urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sys.argv[2]), timeout=5).read() == b"ok" else 1)
EOF
        ready=1
        break
    fi
    sleep 0.5
done
[[ -n $ready ]] || die "kube-apiserver not ready within 120 s: $(tail -3 "$WORK/kube-apiserver.log")"

# ---------------------------------------------------------------- churn, faults, samples

python3 "$REPO_ROOT/scripts/soak-churn.py" --server "https://127.0.0.1:$API_PORT" --ca "$WORK/serving.crt" \
    --token "$TOKEN" --namespace soak --rate "$RATE" --stats "$WORK/client.jsonl" --stop "$WORK/stop" \
    >"$WORK/client.log" 2>&1 &
PIDS+=($!)
echo "minute,node,rss_kib,fds,tasks,revision,ops,errors,p50_ms,p99_ms,fault" >"$OUT/samples.csv"
START=$SECONDS
END=$((START + ${MINUTES%.*} * 60 + $(python3 -c "print(int(round(($MINUTES % 1) * 60)))")))
FAULT_PERIOD=$(python3 -c "print(max(1, int($FAULT_EVERY * 60)))")
next_sample=$((START + SAMPLE))
next_fault=$((START + FAULT_PERIOD))
faults=0 fault_mark="" client_line=0 died=""
sample() {
    local minute i status rss fds text tasks rev client
    minute=$(python3 -c "print(round(($SECONDS - $START) / 60, 2))")
    client=$(tail -n +"$((client_line + 1))" "$WORK/client.jsonl" 2>/dev/null | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
ops = sum(r["ops"] for r in rows)
errors = sum(sum(r["errors"].values()) for r in rows)
p50 = sorted(r["p50_ms"] for r in rows if r["p50_ms"] is not None)
p99 = [r["p99_ms"] for r in rows if r["p99_ms"] is not None]
median = p50[len(p50) // 2] if p50 else ""
worst = max(p99) if p99 else ""
print(f"{ops},{errors},{median},{worst}")')
    client_line=$(wc -l <"$WORK/client.jsonl" 2>/dev/null || echo 0)
    for ((i = 0; i < NODES; i++)); do
        if ! kill -0 "${NODE_PID[i]}" 2>/dev/null; then died="kine-rs node $i"; continue; fi
        rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/${NODE_PID[i]}/status" 2>/dev/null || true)
        fds=$(find "/proc/${NODE_PID[i]}/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        text=$(http_get "${NODE_METRICS[i]}/metrics" 2>/dev/null || true)
        tasks=$(metric "$text" kine_runtime_alive_tasks)
        rev=$(metric "$text" etcd_debugging_mvcc_current_revision)
        echo "$minute,$i,$rss,$fds,${tasks:-},${rev:-},$client,$fault_mark" >>"$OUT/samples.csv"
    done
    kill -0 "$APISERVER_PID" 2>/dev/null || died="kube-apiserver"
    fault_mark=""
    echo "# minute $minute: $(tail -n "$NODES" "$OUT/samples.csv" | cut -d, -f2-6 | tr '\n' ' ')client $client"
}
while [[ $SECONDS -lt $END && -z $died ]]; do
    if [[ $SECONDS -ge $next_fault ]]; then
        victim=$((faults % NODES))
        echo "# minute $(( (SECONDS - START) / 60 )): fault $((faults + 1)): kine-rs node $victim stalled ${FAULT_SECONDS} s (SIGSTOP)"
        STOPPED=${NODE_PID[victim]}
        kill -STOP "$STOPPED"
        sleep "$FAULT_SECONDS"
        kill -CONT "$STOPPED"
        STOPPED=""
        faults=$((faults + 1))
        fault_mark=1
        next_fault=$((next_fault + FAULT_PERIOD))
    fi
    if [[ $SECONDS -ge $next_sample ]]; then
        sample
        next_sample=$((next_sample + SAMPLE))
    fi
    sleep 1
done
sample

# ---------------------------------------------------------------- verdict

python3 "$REPO_ROOT/scripts/soak-plot.py" "$OUT/samples.csv" "$OUT/soak.svg"
verdict=$(python3 - "$OUT/samples.csv" "$WORK/client.jsonl" "$FAULT_SECONDS" <<'EOF'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
fault_s = int(sys.argv[3])
problems, notes = [], []
for node in sorted({r["node"] for r in rows}):
    rss = [int(r["rss_kib"]) for r in rows if r["node"] == node and r["rss_kib"]]
    if len(rss) < 2:
        continue
    quarter, end = rss[max(0, len(rss) // 4 - 1)], rss[-1]
    notes.append(f"node {node} RSS {rss[0] // 1024}->{quarter // 1024}->{end // 1024} MiB")
    if end > quarter * 1.5 + 16 * 1024:
        problems.append(f"node {node}'s RSS grew from {quarter // 1024} to {end // 1024} MiB after the first quarter")
seconds = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
streak = longest = 0
for s in seconds:
    failed = sum(s["errors"].values())
    streak = streak + 1 if failed and failed >= s["ops"] else 0
    longest = max(longest, streak)
ops = sum(s["ops"] for s in seconds)
errors = sum(sum(s["errors"].values()) for s in seconds)
notes.append(f"{ops} calls, {errors} failed, longest all-failing stretch {longest} s")
if longest > fault_s + 30:
    problems.append(f"the client's calls all failed for {longest} s (a fault lasts {fault_s} s)")
print(("FAIL: " + "; ".join(problems) + " | " if problems else "") + ", ".join(notes))
EOF
)
minutes=$(python3 -c "print(round(($SECONDS - $START) / 60, 1))")
if [[ -n $died ]]; then
    echo "soak $BACKEND: FAIL ($died died; $minutes min, $faults faults; $verdict)"
    exit 1
fi
if [[ $verdict == FAIL:* ]]; then
    echo "soak $BACKEND: FAIL ($minutes min, $faults faults; ${verdict#FAIL: })"
    exit 1
fi
echo "soak $BACKEND: PASS ($minutes min, $faults faults; $verdict; plot $OUT/soak.svg)"
