#!/usr/bin/env bash
# kube-apiserver on each datastore in turn, the same load through its REST API
# (bench/apiserver-load.py), and one table of the phases with ratios against etcd and against Go
# kine on the same backend (bench/summarize-apiserver.py).
#
#   bench/apiserver.sh [--rounds R] [--objects M] [--namespaces N] [--clients C] [--watchers W]
#                      [SYSTEM...]
#
# Systems (default: all): etcd (3.7), kine-sqlite, kine-nats-embedded (Go kine v0.17.5),
# kine-rs-sqlite, kine-rs-nats-embedded, kine-rs-nats (an external nats-server),
# kine-rs-postgres, kine-rs-mysql. Each round starts every system afresh (its own empty store),
# one after the other, with a new kube-apiserver 1.37.2 on it; the load runs alone on the
# machine with them. Defaults: 1 round, 10 namespaces × 500 ConfigMaps, 16 clients, 10 watchers.
#
# Needs: target/release/kine-rs (cargo build --release -p kine-rs); etcd-3.7, nats-server and
# kube-apiserver-1.37.2 in $(go env GOPATH)/bin (scripts/install-test-deps); Go kine (installed
# with `go install` when missing); Debian's postgresql and mariadb-server; openssl, python3.
# Output: target/bench/apiserver-<time>/runs.log (the report lines), the logs next to it,
# summary.md (the tables) and the charts (bench/charts.py: apiserver-*.svg).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=1 objects=500 namespaces=10 clients=16 watchers=10
systems=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --objects) objects=$2; shift 2 ;;
    --namespaces) namespaces=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --watchers) watchers=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "apiserver.sh: unknown option $1" >&2; exit 2 ;;
    *) systems+=("$1"); shift ;;
    esac
done
all=(etcd kine-sqlite kine-nats-embedded kine-rs-sqlite kine-rs-nats-embedded kine-rs-nats kine-rs-postgres kine-rs-mysql)
[[ ${#systems[@]} -gt 0 ]] || systems=("${all[@]}")
for s in "${systems[@]}"; do
    [[ " ${all[*]} " == *" $s "* ]] || { echo "apiserver.sh: unknown system $s (one of: ${all[*]})" >&2; exit 2; }
done
for n in "$rounds" "$objects" "$namespaces" "$clients"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "apiserver.sh: --rounds, --objects, --namespaces and --clients take numbers ≥ 1" >&2; exit 2; }
done

die() { echo "apiserver.sh: $*" >&2; exit 1; }
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
etcd=${ETCD_BIN:-$gobin/etcd-3.7}
nats=${NATS_SERVER_BIN:-$gobin/nats-server}
apiserver=${KUBE_APISERVER_BIN:-$gobin/kube-apiserver-1.37.2}
gokine=$gobin/kine
gokine_version=v0.17.5
kine_rs=target/release/kine-rs
[[ -x $kine_rs ]] || die "$kine_rs not found: cargo build --release -p kine-rs"
for b in "$etcd" "$nats" "$apiserver"; do [[ -x $b ]] || die "$b not found: run scripts/install-test-deps"; done
if [[ " ${systems[*]} " == *" kine-"[sn]* && ! -x $gokine ]]; then
    go install -tags nats "github.com/k3s-io/kine@$gokine_version" || die "go install Go kine failed"
fi

out=target/bench/apiserver-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
runs=$out/runs.log
work=$(mktemp -d /tmp/kine-rs-apibench.XXXXXX)
pids=()
# Stops the processes started, newest first (kube-apiserver before its datastore: without one
# its graceful shutdown waits for it), each with SIGTERM and after 15 s SIGKILL.
stop_all() {
    local i p
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        p=${pids[i]}
        kill "$p" 2>/dev/null || continue
        for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    pids=()
}
source scripts/pg-throwaway.sh
source scripts/mysql-throwaway.sh
cleanup() {
    stop_all
    pg_throwaway_stop 2>/dev/null || true
    mysql_throwaway_stop 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
say() { echo "$*" | tee -a "$runs"; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=kine-rs-bench \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$work/serving.key" -out "$work/serving.crt" >/dev/null 2>&1 ||
    die "openssl: the serving certificate"
openssl ecparam -name prime256v1 -genkey -noout -out "$work/sa.key" 2>/dev/null || die "openssl: the service account key"
token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
echo "$token,bench-admin,bench-admin,system:masters" >"$work/tokens.csv"

# start_store SYSTEM DIR: starts the datastore on 127.0.0.1:23900 (etcd API), its processes in
# $store_pids (all of them count for CPU and memory).
start_store() {
    local system=$1 dir=$2 url="http://127.0.0.1:23900" listen=(--listen-address 127.0.0.1:23900 --metrics-bind-address 0)
    store_pids=""
    case "$system" in
    etcd)
        "$etcd" --name default --data-dir "$dir/etcd" --log-level warn --listen-client-urls "$url" \
            --advertise-client-urls "$url" --listen-peer-urls http://127.0.0.1:23980 \
            --initial-advertise-peer-urls http://127.0.0.1:23980 --initial-cluster default=http://127.0.0.1:23980 \
            >"$out/$system.log" 2>&1 & ;;
    kine-sqlite) env -C "$dir" "$gokine" "${listen[@]}" >"$out/$system.log" 2>&1 & ;;
    kine-nats-embedded) "$gokine" "${listen[@]}" --endpoint "nats://?dataDir=$dir/js" >"$out/$system.log" 2>&1 & ;;
    kine-rs-sqlite) "$kine_rs" "${listen[@]}" --endpoint "sqlite://$dir/state.db" >"$out/$system.log" 2>&1 & ;;
    kine-rs-nats-embedded) "$kine_rs" "${listen[@]}" --endpoint "nats://?dataDir=$dir/js" >"$out/$system.log" 2>&1 & ;;
    kine-rs-nats)
        "$nats" -a 127.0.0.1 -p 23920 -js -sd "$dir/nats" >"$out/$system-nats-server.log" 2>&1 &
        pids+=($!) store_pids=$!
        "$kine_rs" "${listen[@]}" --endpoint "nats://127.0.0.1:23920?noEmbed" >"$out/$system.log" 2>&1 & ;;
    kine-rs-postgres)
        pg_throwaway_start >/dev/null
        store_pids=$(head -1 "$PG_THROWAWAY_DIR/data/postmaster.pid")
        "$kine_rs" "${listen[@]}" --endpoint "$PG_THROWAWAY_URL/kine?sslmode=disable" >"$out/$system.log" 2>&1 & ;;
    kine-rs-mysql)
        mysql_throwaway_start >/dev/null
        store_pids=$MYSQL_THROWAWAY_PID
        "$kine_rs" "${listen[@]}" --endpoint "$MYSQL_THROWAWAY_URL/kine" >"$out/$system.log" 2>&1 & ;;
    esac
    pids+=($!)
    store_pids=${store_pids:+$store_pids,}$!
}

stop_store() {
    stop_all
    case "$1" in
    kine-rs-postgres) pg_throwaway_stop >/dev/null 2>&1 || true ;;
    kine-rs-mysql) mysql_throwaway_stop >/dev/null 2>&1 || true ;;
    esac
}

start_apiserver() {
    "$apiserver" --etcd-servers=http://127.0.0.1:23900 --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
        --secure-port=23943 --tls-cert-file="$work/serving.crt" --tls-private-key-file="$work/serving.key" \
        --cert-dir="$work/apiserver-certs" --token-auth-file="$work/tokens.csv" --authorization-mode=AlwaysAllow \
        --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$work/sa.key" \
        --service-account-signing-key-file="$work/sa.key" --service-cluster-ip-range=10.96.0.0/24 \
        --endpoint-reconciler-type=none --profiling=false >"$out/$1-apiserver.log" 2>&1 &
    pids+=($!) apiserver_pid=$!
    for _ in $(seq 240); do
        python3 - "$work/serving.crt" "$token" <<'EOF' 2>/dev/null && return 0
import ssl, sys, urllib.request
req = urllib.request.Request("https://127.0.0.1:23943/readyz", headers={"Authorization": "Bearer " + sys.argv[2]})
sys.exit(0 if urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sys.argv[1]), timeout=5).read() == b"ok" else 1)
EOF
        sleep 0.5
    done
    die "kube-apiserver on $1 not ready within 120 s (log: $out/$1-apiserver.log)"
}

say "# $(date -u +%FT%TZ) bench/apiserver.sh --rounds $rounds --objects $objects --namespaces $namespaces --clients $clients --watchers $watchers ${systems[*]}; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "# kube-apiserver 1.37.2; etcd $("$etcd" --version | awk '/etcd Version/ {print $3}'); nats-server $("$nats" --version | awk '{print $2}'); kine-rs $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.lock || echo ' (uncommitted changes)')"
for round in $(seq "$rounds"); do
    for system in "${systems[@]}"; do
        dir=$work/$system-$round
        mkdir -p "$dir"
        start_store "$system" "$dir"
        start_apiserver "$system"
        # The load alone measures; the apiserver's own start-up writes are done.
        sleep 2
        python3 bench/apiserver-load.py --server https://127.0.0.1:23943 --ca "$work/serving.crt" --token "$token" \
            --label "$system" --namespaces "$namespaces" --objects "$objects" --clients "$clients" \
            --watchers "$watchers" --pids "$store_pids" --apiserver-pid "$apiserver_pid" | tee -a "$runs" || say "# FAILED: $system round $round"
        stop_store "$system"
        rm -rf "$dir"
    done
done
python3 bench/summarize-apiserver.py <"$runs" | tee "$out/summary.md"
python3 bench/charts.py apiserver "$runs" "$out"
echo "apiserver.sh: report lines in $runs, tables in $out/summary.md, charts (SVG) in $out"
