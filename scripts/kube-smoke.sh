#!/usr/bin/env bash
# Kubernetes smoke test: a real kube-apiserver (and kube-controller-manager) on kine-rs, driven
# with kubectl.
#
#   scripts/kube-smoke.sh [--expect-range-stream yes|no] [--no-controller-manager] [--keep] BACKEND
#
# BACKEND: sqlite, memory, nats-embedded (kine-rs's own nats-server), nats (an external
# nats-server started here), postgres, mysql (throwaway servers, scripts/*-throwaway.sh); or etcd:
# the reference run, etcd itself in place of kine-rs (ETCD_BIN, default
# $(go env GOPATH)/bin/etcd-3.7; etcd 3.6 has no RangeStream: --expect-range-stream no).
#
# Starts kine-rs on a fresh datastore on a free loopback port (metrics on another), makes the
# certificates kube-apiserver needs with openssl, starts kube-apiserver on it (compaction every
# 10 s, static token, AlwaysAllow, default admission plugins and feature gates) and
# kube-controller-manager (namespace, deployment, replicaset, serviceaccount and garbage
# collector controllers; no scheduler, no kubelet: pods stay Pending), then with kubectl:
# namespaces, configmaps, secrets (create/get/list/update/conflict/delete, server-side apply,
# paginated lists, delete by label), a CustomResourceDefinition and objects of it, a background
# `kubectl get --watch` that must see later changes, a Deployment that gets a ReplicaSet and
# Pods and loses them to the garbage collector, the shipped manifests (packaging/kubernetes,
# a server-side dry run), namespace deletion; waits for a compaction by
# kube-apiserver (kine-rs's etcd_debugging_mvcc_compact_revision > 0) and repeats writes, lists
# and a watch after it; checks that kube-apiserver logged no storage errors and kine-rs no
# errors; and tells whether kube-apiserver's lists used etcd's KV.RangeStream, from
#   etcd_request_duration_seconds_count{operation="listStream"|"list"} (kube-apiserver /metrics:
#     streamed and paginated etcd lists, both the watch cache's and GetList's)
#   grpc_server_handled_total{grpc_method="RangeStream",grpc_code=...} (kine-rs /metrics)
# --expect-range-stream yes (default): lists streamed, kine-rs answered RangeStream with OK only.
# --expect-range-stream no: no list streamed, RangeStream was tried and answered Unimplemented,
# kube-apiserver fell back to paginated Range.
#
# Prints `ok - ...` / `not ok - ...` per check and a last line
# `kube-smoke BACKEND: PASS|FAIL (N passed, N failed, T s)`; exits non-zero on failure, also
# when a binary is missing (the message names the command that installs it). On failure the ends
# of the logs are printed and the work directory (logs, metrics, datastore) is kept; --keep keeps
# it always.
#
# Environment: KINE_RS_BIN (default target/debug/kine-rs; kine-rs also reads its KINE_* variables,
# e.g. KINE_EMULATED_ETCD_VERSION=3.6.16: RangeStream Unimplemented as etcd 3.6 answers it, for
# --expect-range-stream no), KUBE_APISERVER_BIN,
# KUBE_CONTROLLER_MANAGER_BIN, KUBECTL_BIN (default $(go env GOPATH)/bin/NAME-1.37.2),
# NATS_SERVER_BIN (nats backend), PG_BIN / MARIADB_BIN (postgres / mysql backends).
set -Eeuo pipefail

KUBE_VERSION=1.37.2
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$SCRIPT_DIR")

usage() {
    sed -n '5,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
EXPECT_RS=yes
WITH_KCM=1
KEEP=0
BACKEND=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --expect-range-stream) EXPECT_RS=${2:-}; shift 2 || usage ;;
    --expect-range-stream=*) EXPECT_RS=${1#*=}; shift ;;
    --no-controller-manager) WITH_KCM=0; shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage ;;
    -*) echo "kube-smoke: unknown option $1" >&2; usage ;;
    *) [[ -z $BACKEND ]] || usage; BACKEND=$1; shift ;;
    esac
done
case "$EXPECT_RS" in yes | no) ;; *) echo "kube-smoke: --expect-range-stream yes|no" >&2; usage ;; esac
case "$BACKEND" in sqlite | memory | nats | nats-embedded | postgres | mysql | etcd) ;; *) usage ;; esac

START=$SECONDS
PASS=0
FAIL=0
# A missing prerequisite is a failure, never a skip.
die() {
    echo "not ok - [$BACKEND] $*"
    echo "kube-smoke $BACKEND: FAIL (setup: $*)"
    exit 1
}

gobin=$( (go env GOPATH 2>/dev/null || echo "$HOME/go") | head -1 | cut -d: -f1)/bin
KINE_RS_BIN=${KINE_RS_BIN:-$REPO_ROOT/target/debug/kine-rs}
KUBE_APISERVER_BIN=${KUBE_APISERVER_BIN:-$gobin/kube-apiserver-$KUBE_VERSION}
KUBE_CONTROLLER_MANAGER_BIN=${KUBE_CONTROLLER_MANAGER_BIN:-$gobin/kube-controller-manager-$KUBE_VERSION}
KUBECTL_BIN=${KUBECTL_BIN:-$gobin/kubectl-$KUBE_VERSION}
[[ $BACKEND == etcd || -x $KINE_RS_BIN ]] || die "kine-rs binary missing at $KINE_RS_BIN (cargo build -p kine-rs, or set KINE_RS_BIN)"
build_hint="tools/kubernetes/build.sh (run by scripts/install-test-deps)"
[[ -x $KUBE_APISERVER_BIN ]] || die "kube-apiserver $KUBE_VERSION missing at $KUBE_APISERVER_BIN: $build_hint"
[[ -x $KUBECTL_BIN ]] || die "kubectl $KUBE_VERSION missing at $KUBECTL_BIN: $build_hint"
if [[ $WITH_KCM == 1 ]]; then
    [[ -x $KUBE_CONTROLLER_MANAGER_BIN ]] ||
        die "kube-controller-manager $KUBE_VERSION missing at $KUBE_CONTROLLER_MANAGER_BIN: $build_hint"
fi
command -v openssl >/dev/null || die "openssl missing (apt-get install openssl)"
command -v python3 >/dev/null || die "python3 missing (apt-get install python3)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kine-rs-kube-smoke.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$LOGS"
PIDS=()       # every process started here, stopped in reverse order
declare -A PNAMES
started() { PIDS+=("$2"); PNAMES[$2]=$1; } # name pid
STOPS=()      # functions that stop the throwaway datastore servers
KINE_PID=""
APISERVER_PID=""
KCM_PID=""

stop_pid() { # pid [go]: SIGTERM; after 10 s SIGKILL (a Go program: SIGQUIT, its goroutines to its log)
    local pid=$1 go=${2:-}
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -n $go ]] && kill -0 "$pid" 2>/dev/null; then
        echo "# pid $pid still running 10 s after SIGTERM: SIGQUIT (goroutine dump in its log)"
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$? i
    trap - EXIT INT TERM ERR
    if [[ $rc -ne 0 && -z $FINISHED ]]; then
        tail_logs
        echo "kube-smoke $BACKEND: FAIL (aborted at ${ERR_AT:-?}, exit $rc; $PASS passed, $FAIL failed, $((SECONDS - START)) s)"
    fi
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[$i]}"; done
    for ((i = ${#STOPS[@]} - 1; i >= 0; i--)); do "${STOPS[$i]}" >/dev/null 2>&1 || true; done
    if [[ $KEEP == 1 || $rc -ne 0 ]]; then
        echo "kube-smoke: work directory kept: $WORK (logs in $LOGS)"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
FINISHED=""
ERR_AT=""
trap 'ERR_AT="line $LINENO: $BASH_COMMAND"' ERR
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- reporting

show() { if [[ $1 == *$'\n'* || -z $1 ]]; then printf '%q' "$1"; else printf '%s' "$1"; fi; }
pass() { PASS=$((PASS + 1)); echo "ok - [$BACKEND] $1"; }
fail() { FAIL=$((FAIL + 1)); echo "not ok - [$BACKEND] $1"; }
check_eq() { # description expected actual
    if [[ $3 == "$2" ]]; then pass "$1"; else fail "$1 (expected: $(show "$2"), actual: $(show "$3"))"; fi
}
check_contains() { # description needle haystack
    if [[ $3 == *"$2"* ]]; then pass "$1"; else fail "$1 (expected to contain: $(show "$2"), actual: $(show "$3"))"; fi
}
tail_logs() {
    local f
    for f in "$LOGS"/*.log; do
        [[ -s $f ]] || continue
        echo "--- last 40 lines of $(basename "$f")"
        tail -n 40 "$f"
    done
}
finish() {
    local secs t0 i pid rc
    # Stop everything in reverse order of start. kine-rs must then shut down cleanly (exit 0)
    # within 10 s (etcd, in the reference run, re-raises the signal: any status).
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid=${PIDS[$i]}
        kill -0 "$pid" 2>/dev/null || continue
        t0=$SECONDS
        if [[ $pid == "$KINE_PID" ]]; then
            kill -TERM "$pid"
            rc=""
            for _ in $(seq 100); do
                kill -0 "$pid" 2>/dev/null || { rc=0; wait "$pid" || rc=$?; break; }
                sleep 0.1
            done
            [[ $SERVER == etcd && -n $rc ]] && rc=0
            check_eq "$SERVER exits 0 on SIGTERM within 10 s" 0 "${rc:-still running}"
        else
            stop_pid "$pid" go
        fi
        echo "# stopped ${PNAMES[$pid]} in $((SECONDS - t0)) s"
    done
    secs=$((SECONDS - START))
    FINISHED=1
    if [[ $FAIL -eq 0 && $PASS -gt 0 ]]; then
        echo "kube-smoke $BACKEND: PASS ($PASS passed, 0 failed, $secs s)"
        exit 0
    fi
    tail_logs
    echo "kube-smoke $BACKEND: FAIL ($PASS passed, $FAIL failed, $secs s)"
    exit 1
}
# Fatal: record the failure and stop here (what follows depends on it).
abort() { fail "$1"; finish; }

# ---------------------------------------------------------------- helpers

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }

# kubectl with the test kubeconfig; run sets OUT, ERR and RC instead of failing.
k() { "$KUBECTL_BIN" --kubeconfig "$WORK/kubeconfig" --cache-dir "$WORK/kube-cache" --request-timeout=60s "$@"; }
run() {
    RC=0
    OUT=$(k "$@" 2>"$WORK/stderr") || RC=$?
    ERR=$(cat "$WORK/stderr")
}
run_ok() { # description kubectl-args...: passes when kubectl exits 0
    local d=$1
    shift
    run "$@"
    if [[ $RC -eq 0 ]]; then pass "$d"; else fail "$d (kubectl $*: exit $RC: $(show "$ERR"))"; fi
    return 0
}
# Polls until `k ARGS` prints EXPECTED (timeout in s), then checks it.
wait_for() { # description timeout expected kubectl-args...
    local d=$1 t=$2 want=$3 end
    shift 3
    end=$((SECONDS + t))
    while :; do
        run "$@"
        [[ $RC -eq 0 && $OUT == "$want" ]] && break
        [[ $SECONDS -ge $end ]] && break
        sleep 0.5
    done
    if [[ $RC -eq 0 && $OUT == "$want" ]]; then
        pass "$d"
    else
        fail "$d (after $t s: expected $(show "$want"), kubectl $*: exit $RC, out $(show "$OUT"), err $(show "$ERR"))"
    fi
}
kine_metrics() { http_get "$KINE_METRICS_URL/metrics"; }
# Sum of the samples of metric $1 whose labels contain every one of $2... (exact `name{` match).
metric_sum() {
    local text=$1 name=$2
    shift 2
    printf '%s\n' "$text" | python3 -c '
import sys
name, needles = sys.argv[1], sys.argv[2:]
total = 0.0
for line in sys.stdin:
    if not line.startswith(name + "{") and not line.startswith(name + " "):
        continue
    labels = line[len(name):line.rfind(" ")]
    if all(n in labels for n in needles):
        total += float(line.rsplit(" ", 1)[1])
print(int(total) if total == int(total) else total)' "$name" "$@"
}

# ---------------------------------------------------------------- datastore

case "$BACKEND" in
sqlite) ENDPOINT="sqlite://$WORK/state.db" ;;
memory) ENDPOINT="memory://" ;;
nats-embedded) ENDPOINT="nats://?dataDir=$WORK/nats" ;;
nats)
    NATS_BIN=${NATS_SERVER_BIN:-$(command -v nats-server || echo "$gobin/nats-server")}
    [[ -x $NATS_BIN ]] || die "nats-server missing (go install github.com/nats-io/nats-server/v2@v2.15.2, run by scripts/install-test-deps; or set NATS_SERVER_BIN)"
    nats_port=$(free_port)
    mkdir -p "$WORK/nats-server"
    # max_payload 2 MB: kine-rs warns when it is below its --max-request-bytes (1.5 MiB).
    echo 'max_payload: 2097152' >"$WORK/nats-server.conf"
    "$NATS_BIN" -c "$WORK/nats-server.conf" -a 127.0.0.1 -p "$nats_port" -js -sd "$WORK/nats-server" \
        >"$LOGS/nats-server.log" 2>&1 &
    started nats-server $!
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break
        sleep 0.1
    done
    ENDPOINT="nats://127.0.0.1:$nats_port?noEmbed&bucket=kube-smoke"
    ;;
postgres)
    # shellcheck source=scripts/pg-throwaway.sh
    source "$SCRIPT_DIR/pg-throwaway.sh"
    STOPS+=(pg_throwaway_stop)
    pg_throwaway_start >"$LOGS/postgres-start.log" 2>&1 ||
        die "cannot start PostgreSQL (apt-get install postgresql, run by scripts/install-test-deps): $(tail -3 "$LOGS/postgres-start.log")"
    ENDPOINT="$PG_THROWAWAY_URL/kubesmoke?sslmode=disable"
    ;;
mysql)
    # shellcheck source=scripts/mysql-throwaway.sh
    source "$SCRIPT_DIR/mysql-throwaway.sh"
    STOPS+=(mysql_throwaway_stop)
    mysql_throwaway_start >"$LOGS/mysql-start.log" 2>&1 ||
        die "cannot start MariaDB (apt-get install mariadb-server mariadb-client, run by scripts/install-test-deps): $(tail -3 "$LOGS/mysql-start.log")"
    ENDPOINT="$MYSQL_THROWAWAY_URL/kubesmoke"
    ;;
etcd) ;; # the reference: etcd itself instead of kine-rs, below
esac

# ---------------------------------------------------------------- kine-rs (or etcd)

ETCD_URL=""
if [[ $BACKEND == etcd ]]; then
    SERVER=etcd
    ETCD_BIN=${ETCD_BIN:-$gobin/etcd-3.7}
    [[ -x $ETCD_BIN ]] || die "etcd missing at $ETCD_BIN (tools/etcd-3.7, built by scripts/install-test-deps; or set ETCD_BIN)"
    client_port=$(free_port) peer_port=$(free_port) metrics_port=$(free_port)
    "$ETCD_BIN" --name smoke --data-dir "$WORK/etcd" \
        --listen-client-urls "http://127.0.0.1:$client_port" --advertise-client-urls "http://127.0.0.1:$client_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "smoke=http://127.0.0.1:$peer_port" --listen-metrics-urls "http://127.0.0.1:$metrics_port" \
        >"$LOGS/etcd.log" 2>&1 &
    KINE_PID=$!
    started etcd "$KINE_PID"
    KINE_METRICS_URL=http://127.0.0.1:$metrics_port
    for _ in $(seq 300); do
        if http_get "$KINE_METRICS_URL/health" 2>/dev/null | grep -q '"health":"true"'; then
            ETCD_URL=http://127.0.0.1:$client_port
            break
        fi
        kill -0 "$KINE_PID" 2>/dev/null || break
        sleep 0.1
    done
    [[ -n $ETCD_URL ]] || abort "etcd starts (not healthy within 30 s)"
    pass "etcd $("$ETCD_BIN" --version | sed -n 's/^etcd Version: //p') ready at $ETCD_URL (metrics $KINE_METRICS_URL)"
else
SERVER=kine-rs

"$KINE_RS_BIN" --listen-address 127.0.0.1:0 --metrics-bind-address 127.0.0.1:0 \
    --endpoint "$ENDPOINT" >"$LOGS/kine-rs.log" 2>&1 &
KINE_PID=$!
started kine-rs "$KINE_PID"
for _ in $(seq 300); do
    line=$(grep -m1 'kine-rs ready: etcd clients connect to ' "$LOGS/kine-rs.log" 2>/dev/null || true)
    if [[ -n $line ]]; then
        ETCD_URL=$(grep -o 'connect to http://[0-9.]*:[0-9]*' <<<"$line" | cut -d' ' -f3)
        KINE_METRICS_URL=$(grep -o 'metrics=http://[0-9.]*:[0-9]*' <<<"$line" | cut -d= -f2)
        break
    fi
    kill -0 "$KINE_PID" 2>/dev/null || break
    sleep 0.1
done
[[ -n $ETCD_URL ]] || abort "kine-rs starts on $BACKEND (no ready line within 30 s)"
pass "kine-rs ready at $ETCD_URL on $BACKEND (metrics $KINE_METRICS_URL)"
fi

# ---------------------------------------------------------------- certificates, kubeconfig

# Serving certificate (self-signed, EC P-256, for 127.0.0.1) and the service account key.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=kube-smoke -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
    -keyout "$WORK/serving.key" -out "$WORK/serving.crt" >"$LOGS/openssl.log" 2>&1 ||
    abort "openssl makes the serving certificate: $(cat "$LOGS/openssl.log")"
openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/sa.key" 2>>"$LOGS/openssl.log" ||
    abort "openssl makes the service account key: $(cat "$LOGS/openssl.log")"
TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
echo "$TOKEN,kube-smoke-admin,kube-smoke-admin,system:masters" >"$WORK/tokens.csv"
API_PORT=$(free_port)
cat >"$WORK/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: smoke
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $WORK/serving.crt
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: smoke
  context: {cluster: smoke, user: admin}
current-context: smoke
EOF
# No user kubectl configuration (kuberc) may change the output.
export KUBERC=off

# ---------------------------------------------------------------- kube-apiserver

# Loopback only; the static token is in group system:masters; default admission plugins and
# feature gates. The endpoint reconciler is off: 127.0.0.1 is no valid endpoint of the
# `kubernetes` service. Compaction every 10 s (the first one at about 20 s: the apiserver
# compacts the revision it saw one interval earlier).
APISERVER_START=$SECONDS
"$KUBE_APISERVER_BIN" \
    --etcd-servers="$ETCD_URL" \
    --etcd-compaction-interval=10s \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$WORK/serving.crt" --tls-private-key-file="$WORK/serving.key" \
    --cert-dir="$WORK/apiserver-certs" \
    --token-auth-file="$WORK/tokens.csv" --authorization-mode=AlwaysAllow \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$WORK/sa.key" --service-account-signing-key-file="$WORK/sa.key" \
    --service-cluster-ip-range=10.96.0.0/24 \
    --endpoint-reconciler-type=none \
    --profiling=false \
    >"$LOGS/kube-apiserver.log" 2>&1 &
APISERVER_PID=$!
started kube-apiserver "$APISERVER_PID"
ready=""
for _ in $(seq 240); do
    kill -0 "$APISERVER_PID" 2>/dev/null || break
    run get --raw /readyz
    if [[ $OUT == ok ]]; then ready=1; break; fi
    sleep 0.5
done
[[ -n $ready ]] || abort "kube-apiserver ready (/readyz) within 120 s (last answer: $(show "$OUT$ERR"))"
pass "kube-apiserver ready in $((SECONDS - APISERVER_START)) s"
run version -o json
check_contains "kube-apiserver reports v$KUBE_VERSION" "\"gitVersion\": \"v$KUBE_VERSION\"" "$(sed -n '/serverVersion/,$p' <<<"$OUT")"
run get --raw /metrics
fg=$(metric_sum "$OUT" kubernetes_feature_enabled 'name="EtcdRangeStream"')
check_eq "feature gate EtcdRangeStream is on (default)" 1 "$fg"

# ---------------------------------------------------------------- kube-controller-manager

if [[ $WITH_KCM == 1 ]]; then
    "$KUBE_CONTROLLER_MANAGER_BIN" \
        --kubeconfig="$WORK/kubeconfig" --secure-port=0 --leader-elect=false \
        --controllers=namespace-controller,deployment-controller,replicaset-controller,serviceaccount-controller,garbage-collector-controller \
        >"$LOGS/kube-controller-manager.log" 2>&1 &
    KCM_PID=$!
    started kube-controller-manager "$KCM_PID"
fi

# ---------------------------------------------------------------- namespaces

NS=smoke
run_ok "create namespace $NS" create namespace "$NS"
wait_for "namespace $NS is Active" 10 Active get namespace "$NS" -o 'jsonpath={.status.phase}'
run_ok "label namespace $NS (update)" label namespace "$NS" purpose=smoke
run get namespaces -l purpose=smoke -o name
check_eq "list namespaces by label" "namespace/$NS" "$OUT"
run get namespaces -o name
check_contains "list namespaces has kube-system" "namespace/kube-system" "$OUT"

# ---------------------------------------------------------------- configmaps

run_ok "create configmap cm1" -n "$NS" create configmap cm1 --from-literal=k=v1
run -n "$NS" get configmap cm1 -o 'jsonpath={.data.k}'
check_eq "get configmap cm1" v1 "$OUT"
run -n "$NS" get configmap cm1 -o yaml
echo "$OUT" >"$WORK/cm1-stale.yaml"
rv1=$(k -n "$NS" get configmap cm1 -o 'jsonpath={.metadata.resourceVersion}' 2>/dev/null || echo 0)
run_ok "update configmap cm1 (patch)" -n "$NS" patch configmap cm1 --type=merge -p '{"data":{"k":"v2"}}'
run -n "$NS" get configmap cm1 -o 'jsonpath={.data.k} {.metadata.resourceVersion}'
check_eq "configmap cm1 updated" v2 "${OUT%% *}"
[[ ${OUT##* } -gt $rv1 ]] && pass "resourceVersion grows on update ($rv1 -> ${OUT##* })" ||
    fail "resourceVersion grows on update ($rv1 -> ${OUT##* })"
run -n "$NS" replace -f "$WORK/cm1-stale.yaml"
check_contains "replace with a stale resourceVersion is a conflict" "the object has been modified" "$ERR"
sed -i 's/^  k: v1$/  k: v3/; /resourceVersion:/d' "$WORK/cm1-stale.yaml"
run_ok "replace configmap cm1 without resourceVersion" -n "$NS" replace -f "$WORK/cm1-stale.yaml"
run -n "$NS" get configmap cm1 -o 'jsonpath={.data.k}'
check_eq "configmap cm1 replaced" v3 "$OUT"
apply_cm() { # value
    printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {k: %s}\n' "$1" |
        k -n "$NS" apply --server-side --field-manager=smoke -f - >/dev/null 2>"$WORK/stderr"
}
apply_cm a1 && pass "server-side apply creates configmap" || fail "server-side apply creates configmap: $(cat "$WORK/stderr")"
apply_cm a2 && pass "server-side apply updates configmap" || fail "server-side apply updates configmap: $(cat "$WORK/stderr")"
run -n "$NS" get configmap applied -o 'jsonpath={.data.k}'
check_eq "server-side applied value" a2 "$OUT"
for i in 0 1 2 3 4 5 6; do
    k -n "$NS" create configmap "bulk-$i" --from-literal=i="$i" >/dev/null 2>"$WORK/stderr" ||
        fail "create configmap bulk-$i: $(cat "$WORK/stderr")"
done
run_ok "label 7 configmaps (update)" -n "$NS" label configmap bulk-0 bulk-1 bulk-2 bulk-3 bulk-4 bulk-5 bulk-6 set=bulk
run -n "$NS" get configmaps -l set=bulk --chunk-size=2 -o name
check_eq "paginated list (chunks of 2) by label" 7 "$(grep -c '^configmap/bulk-' <<<"$OUT" || true)"
run get configmaps -A --chunk-size=3 -o name
check_contains "paginated list across namespaces" "configmap/bulk-6" "$OUT"
run -n "$NS" get --raw "/api/v1/namespaces/$NS/configmaps?limit=4"
cont=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"].get("continue",""))' <<<"$OUT" 2>/dev/null || true)
[[ -n $cont ]] && pass "limit=4 list has a continue token" || fail "limit=4 list has a continue token ($(show "${OUT:0:300}"))"
run_ok "delete configmaps by label" -n "$NS" delete configmaps -l set=bulk
run -n "$NS" get configmaps -l set=bulk -o name
check_eq "deleted configmaps are gone" "" "$OUT"

# ---------------------------------------------------------------- secrets

run_ok "create secret s1" -n "$NS" create secret generic s1 --from-literal=password=p1
run -n "$NS" get secret s1 -o 'jsonpath={.data.password}'
check_eq "get secret s1" p1 "$(base64 -d <<<"$OUT" 2>/dev/null)"
run_ok "update secret s1" -n "$NS" patch secret s1 -p '{"stringData":{"password":"p2"}}'
run -n "$NS" get secret s1 -o 'jsonpath={.data.password}'
check_eq "secret s1 updated" p2 "$(base64 -d <<<"$OUT" 2>/dev/null)"
run_ok "delete secret s1" -n "$NS" delete secret s1
run -n "$NS" get secret s1
check_contains "deleted secret is NotFound" 'secrets "s1" not found' "$ERR"

# ---------------------------------------------------------------- watch

run_ok "create configmap w0" -n "$NS" create configmap w0 --from-literal=k=x
"$KUBECTL_BIN" --kubeconfig "$WORK/kubeconfig" --cache-dir "$WORK/kube-cache" -n "$NS" get configmaps --watch --output-watch-events \
    -o 'jsonpath={.type} {.object.metadata.name} {.object.data.k}{"\n"}' >"$WORK/watch.out" 2>"$LOGS/kubectl-watch.log" &
WATCH_PID=$!
started "kubectl get --watch" "$WATCH_PID"
for _ in $(seq 100); do grep -q '^ADDED w0 x$' "$WORK/watch.out" && break; sleep 0.1; done
check_contains "kubectl get --watch lists the existing configmap" "ADDED w0 x" "$(cat "$WORK/watch.out")"
run_ok "create configmap w1" -n "$NS" create configmap w1 --from-literal=k=1
run_ok "update configmap w1" -n "$NS" patch configmap w1 --type=merge -p '{"data":{"k":"2"}}'
run_ok "delete configmap w1" -n "$NS" delete configmap w1
want=$'ADDED w1 1\nMODIFIED w1 2\nDELETED w1 2'
for _ in $(seq 100); do
    got=$(grep ' w1 ' "$WORK/watch.out" || true)
    [[ $got == "$want" ]] && break
    sleep 0.1
done
check_eq "kubectl get --watch sees create, update and delete made after it started" "$want" "$got"
stop_pid "$WATCH_PID"

# ---------------------------------------------------------------- custom resources

k apply -f - >"$WORK/crd.out" 2>&1 <<'EOF' || fail "create CustomResourceDefinition: $(cat "$WORK/crd.out")"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.smoke.example.com}
spec:
  group: smoke.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
EOF
# (Polled: `kubectl wait --for=condition=Established` fails at once while status.conditions is unset.)
wait_for "CustomResourceDefinition is Established" 30 True get crd widgets.smoke.example.com \
    -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
widget() { printf 'apiVersion: smoke.example.com/v1\nkind: Widget\nmetadata: {name: %s}\nspec: {size: %s}\n' "$1" "$2"; }
ok=1
for _ in $(seq 40); do # discovery of the new resource can lag a moment behind Established
    if widget w-a 1 | k -n "$NS" create -f - >/dev/null 2>"$WORK/stderr"; then ok=0; break; fi
    sleep 0.25
done
[[ $ok == 0 ]] && pass "create custom resource w-a" || fail "create custom resource w-a: $(cat "$WORK/stderr")"
widget w-b 2 | k -n "$NS" create -f - >/dev/null 2>"$WORK/stderr" && pass "create custom resource w-b" ||
    fail "create custom resource w-b: $(cat "$WORK/stderr")"
run -n "$NS" get widgets -o 'jsonpath={range .items[*]}{.metadata.name}={.spec.size} {end}'
check_eq "list custom resources" "w-a=1 w-b=2 " "$OUT"
run_ok "update custom resource" -n "$NS" patch widget w-a --type=merge -p '{"spec":{"size":5}}'
run -n "$NS" get widget w-a -o 'jsonpath={.spec.size}'
check_eq "custom resource updated" 5 "$OUT"
run_ok "delete custom resource w-b" -n "$NS" delete widget w-b
run -n "$NS" get widgets -o name
check_eq "custom resource w-b gone" "widget.smoke.example.com/w-a" "$OUT"

# ---------------------------------------------------------------- controllers

if [[ $WITH_KCM == 1 ]]; then
    wait_for "serviceaccount controller creates default/default" 60 default -n "$NS" get serviceaccount default -o 'jsonpath={.metadata.name}'
    run_ok "create deployment web (2 replicas)" -n "$NS" create deployment web --image=registry.k8s.io/pause:3.10 --replicas=2
    wait_for "deployment creates a ReplicaSet owned by it" 60 Deployment/web -n "$NS" get replicasets -l app=web \
        -o 'jsonpath={range .items[*]}{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}{end}'
    wait_for "replicaset creates 2 Pending pods" 60 "Pending Pending " -n "$NS" get pods -l app=web \
        -o 'jsonpath={range .items[*]}{.status.phase} {end}'
    run_ok "scale deployment web to 3" -n "$NS" scale deployment web --replicas=3
    wait_for "replicaset creates a third pod" 60 3 -n "$NS" get deployment web -o 'jsonpath={.status.replicas}'
    run_ok "delete deployment web" -n "$NS" delete deployment web --wait=true --timeout=60s
    wait_for "garbage collector deletes its ReplicaSet and Pods" 60 "" -n "$NS" get replicasets,pods -l app=web -o name
fi

# ---------------------------------------------------------------- shipped manifests

# packaging/kubernetes/*.yaml, validated by this kube-apiserver (server-side dry run: every
# object checked against its API schema and admission, nothing stored).
for manifest in "$REPO_ROOT"/packaging/kubernetes/*.yaml; do
    run_ok "kubectl apply --dry-run=server -f packaging/kubernetes/$(basename "$manifest")" \
        -n "$NS" apply --dry-run=server -f "$manifest"
done

# ---------------------------------------------------------------- compaction

# kube-apiserver compacts every --etcd-compaction-interval (10 s), from its second round on.
compact_rev=-1
end=$((APISERVER_START + 90))
while [[ $SECONDS -lt $end ]]; do
    compact_rev=$(metric_sum "$(kine_metrics)" etcd_debugging_mvcc_compact_revision)
    [[ $compact_rev -gt 0 ]] && break
    sleep 1
done
[[ $compact_rev -gt 0 ]] &&
    pass "kube-apiserver compacted ($SERVER compact revision $compact_rev, $((SECONDS - APISERVER_START)) s after its start)" ||
    abort "kube-apiserver compacted within 90 s of its start ($SERVER etcd_debugging_mvcc_compact_revision $compact_rev)"

# After the compaction: writes, reads, lists and a watch still work.
"$KUBECTL_BIN" --kubeconfig "$WORK/kubeconfig" --cache-dir "$WORK/kube-cache" -n "$NS" get configmaps --watch --output-watch-events \
    -o 'jsonpath={.type} {.object.metadata.name} {.object.data.k}{"\n"}' >"$WORK/watch2.out" 2>"$LOGS/kubectl-watch2.log" &
WATCH_PID=$!
started "kubectl get --watch" "$WATCH_PID"
for _ in $(seq 100); do grep -q '^ADDED cm1 v3$' "$WORK/watch2.out" && break; sleep 0.1; done
check_contains "kubectl get --watch after compaction lists" "ADDED cm1 v3" "$(cat "$WORK/watch2.out")"
run_ok "patch configmap after compaction" -n "$NS" patch configmap cm1 --type=merge -p '{"data":{"k":"v4"}}'
run -n "$NS" get configmap cm1 -o 'jsonpath={.data.k}'
check_eq "get configmap after compaction" v4 "$OUT"
run_ok "create configmap after compaction" -n "$NS" create configmap after --from-literal=k=z
for _ in $(seq 100); do grep -q '^ADDED after z$' "$WORK/watch2.out" && break; sleep 0.1; done
check_contains "watch after compaction sees changes" $'MODIFIED cm1 v4\nADDED after z' "$(cat "$WORK/watch2.out")"
stop_pid "$WATCH_PID"
run -n "$NS" get configmaps --chunk-size=1 -o name
check_eq "paginated list after compaction (cm1 applied w0 after)" 4 "$(grep -c '^configmap/' <<<"$OUT" || true)"

# ---------------------------------------------------------------- deletions

run_ok "delete CustomResourceDefinition (and its objects)" delete crd widgets.smoke.example.com --timeout=60s
run get crd -o name
check_eq "no CustomResourceDefinition left" "" "$OUT"
if [[ $WITH_KCM == 1 ]]; then
    run_ok "delete namespace $NS (namespace controller empties it)" delete namespace "$NS" --timeout=60s
    run get namespace "$NS"
    check_contains "namespace $NS is gone" 'not found' "$ERR"
else
    run_ok "delete namespace $NS" delete namespace "$NS" --wait=false
    run get namespace "$NS" -o 'jsonpath={.status.phase}'
    check_eq "namespace $NS is Terminating (no namespace controller)" Terminating "$OUT"
fi

# ---------------------------------------------------------------- RangeStream

# kube-apiserver reads lists from etcd on two paths: the watch cache's initial sync of every
# resource (etcd3 watcher) and storage GetList (lists the cache does not serve). Both try
# KV.RangeStream first when the EtcdRangeStream gate is on; an Unimplemented answer marks it
# unsupported for 10 minutes and they fall back to paginated Range. kube-apiserver counts
# each streamed list as etcd_request_duration_seconds{operation="listStream"} and each
# paginated one as operation="list"; GetList also as
# apiserver_storage_list_duration_seconds{streamed="true|false"}.
run get --raw /metrics
api_metrics=$OUT
kine_m=$(kine_metrics)
printf '%s\n' "$api_metrics" >"$WORK/kube-apiserver.metrics"
printf '%s\n' "$kine_m" >"$WORK/$SERVER.metrics"
list_stream=$(metric_sum "$api_metrics" etcd_request_duration_seconds_count 'operation="listStream"')
list_paged=$(metric_sum "$api_metrics" etcd_request_duration_seconds_count 'operation="list"')
getlist_streamed=$(metric_sum "$api_metrics" apiserver_storage_list_duration_seconds_count 'streamed="true"')
getlist_paged=$(metric_sum "$api_metrics" apiserver_storage_list_duration_seconds_count 'streamed="false"')
rs_all=$(metric_sum "$kine_m" grpc_server_handled_total 'grpc_method="RangeStream"')
rs_ok=$(metric_sum "$kine_m" grpc_server_handled_total 'grpc_method="RangeStream"' 'grpc_code="OK"')
rs_unimpl=$(metric_sum "$kine_m" grpc_server_handled_total 'grpc_method="RangeStream"' 'grpc_code="Unimplemented"')
rs_canceled=$(metric_sum "$kine_m" grpc_server_handled_total 'grpc_method="RangeStream"' 'grpc_code="Canceled"')
rs_other=$((rs_all - rs_ok - rs_unimpl - rs_canceled))
echo "# RangeStream: kube-apiserver etcd lists streamed $list_stream, paginated $list_paged" \
    "(of them GetList: streamed $getlist_streamed, paginated $getlist_paged);" \
    "$SERVER KV.RangeStream calls $rs_all (OK $rs_ok, Unimplemented $rs_unimpl, Canceled $rs_canceled, other $rs_other)"
if [[ $EXPECT_RS == yes ]]; then
    [[ $list_stream -gt 0 && $rs_ok -gt 0 ]] &&
        pass "kube-apiserver listed with RangeStream ($list_stream streamed lists, kine-rs answered $rs_ok)" ||
        fail "kube-apiserver listed with RangeStream (etcd_request_duration_seconds_count{operation=\"listStream\"} $list_stream, kine-rs RangeStream OK $rs_ok)"
    check_eq "kine-rs never answered RangeStream with Unimplemented" 0 "$rs_unimpl"
    check_eq "kine-rs answered no RangeStream with an error" 0 "$rs_other"
else
    check_eq "kube-apiserver did not list with RangeStream" 0 "$list_stream"
    if [[ $SERVER == etcd ]]; then
        echo "# etcd counts no call of a method it lacks (RangeStream in etcd 3.6): not checked"
    else
        [[ $rs_unimpl -gt 0 ]] && pass "kube-apiserver tried RangeStream and kine-rs answered Unimplemented ($rs_unimpl)" ||
            fail "kube-apiserver tried RangeStream and kine-rs answered Unimplemented (kine-rs counted $rs_all RangeStream calls, none Unimplemented)"
    fi
    [[ $list_paged -gt 0 ]] && pass "kube-apiserver fell back to paginated Range ($list_paged lists)" ||
        fail "kube-apiserver fell back to paginated Range (no operation=\"list\" request)"
fi

# ---------------------------------------------------------------- logs

# klog error lines (E...) about storage, and the etcd client's own error lines, fail; a sync
# that kube-apiserver cancelled itself (it destroys a storage it just made at startup, whose
# cacher may still be listing; seen on slow starts) and warnings are shown, not failed.
storage_re='etcd|storage|cacher|watch|compact|rpc error|revision|Unimplemented'
errs=$(grep -E '^E[0-9]{4} ' "$LOGS/kube-apiserver.log" | grep -Ei "$storage_re" | grep -v 'context canceled$' || true)
errs+=$(grep -E '^\{"level":"(error|fatal|panic)"' "$LOGS/kube-apiserver.log" || true)
check_eq "kube-apiserver logged no storage errors" "" "$errs"
notes=$(grep -E '^E[0-9]{4} ' "$LOGS/kube-apiserver.log" | grep -Ei "$storage_re" | grep 'context canceled$' || true)
notes+=$(grep -E '^W[0-9]{4} ' "$LOGS/kube-apiserver.log" | grep -v 'Skipping API' | grep -Ei "$storage_re" || true)
if [[ -n $notes ]]; then
    printf '# kube-apiserver storage notes (not failed):\n%s\n' "$(head -10 <<<"$notes" | cut -c1-240 | sed 's/^/#   /')"
fi
n=$(grep -cE '^\{"level":"warn","ts":"[^"]*","logger":"etcd-client"' "$LOGS/kube-apiserver.log" || true)
if [[ $n -gt 0 ]]; then
    echo "# kube-apiserver etcd client warnings (not failed): $n, first and last:"
    grep -E '^\{"level":"warn","ts":"[^"]*","logger":"etcd-client"' "$LOGS/kube-apiserver.log" | sed -n '1p;$p' | cut -c1-400 | sed 's/^/#   /'
fi
if [[ $SERVER == kine-rs ]]; then
    kerrs=$(grep -E ' (ERROR|WARN) |panicked' "$LOGS/kine-rs.log" || true)
    check_eq "kine-rs logged no errors or warnings" "" "$kerrs"
fi
kill -0 "$KINE_PID" 2>/dev/null && pass "$SERVER still running" || fail "$SERVER still running"
kill -0 "$APISERVER_PID" 2>/dev/null && pass "kube-apiserver still running" || fail "kube-apiserver still running"
if [[ $WITH_KCM == 1 ]]; then
    kill -0 "$KCM_PID" 2>/dev/null && pass "kube-controller-manager still running" || fail "kube-controller-manager still running"
fi

finish
