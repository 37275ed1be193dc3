# The datastores and the kube-apiserver the benchmarks run against, started and stopped the same
# way in each (bench/apiserver.sh, bench/kwok.sh). Sourced; the script calls `stores_begin NAME`
# before starting anything.
#
# Systems: etcd (3.7), kine-sqlite and kine-nats-embedded (Go kine v0.17.5), kine-rs-sqlite,
# kine-rs-nats-embedded, kine-rs-nats (an external nats-server), kine-rs-nats-cluster (three
# kine-rs whose embedded nats-servers cluster by routes, the bucket with three replicas),
# kine-rs-postgres, kine-rs-mysql. Each serves the etcd API on 127.0.0.1:23900 (the cluster on
# 23900-23902).

STORE_SYSTEMS=(etcd kine-sqlite kine-nats-embedded kine-rs-sqlite kine-rs-nats-embedded kine-rs-nats
    kine-rs-nats-cluster kine-rs-postgres kine-rs-mysql)
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
etcd=${ETCD_BIN:-$gobin/etcd-3.7}
nats=${NATS_SERVER_BIN:-$gobin/nats-server}
apiserver=${KUBE_APISERVER_BIN:-$gobin/kube-apiserver-1.37.2}
gokine=$gobin/kine
gokine_version=v0.17.5
kine_rs=${KINE_RS_BIN:-target/release/kine-rs}
source scripts/pg-throwaway.sh
source scripts/mysql-throwaway.sh

stores_die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# check_binaries [--no-apiserver] SYSTEM...: what those systems need is there (Go kine is
# installed if missing), and kube-apiserver unless --no-apiserver (the datastores alone).
check_binaries() {
    local s need=("$etcd" "$nats" "$apiserver")
    if [[ ${1:-} == --no-apiserver ]]; then need=("$etcd" "$nats"); shift; fi
    for s in "$@"; do
        [[ " ${STORE_SYSTEMS[*]} " == *" $s "* ]] || stores_die "unknown system $s (one of: ${STORE_SYSTEMS[*]})"
    done
    if [[ " $* " == *" kine-rs-"* && ! -x $kine_rs ]]; then stores_die "$kine_rs not found: cargo build --release -p kine-rs"; fi
    for b in "${need[@]}"; do [[ -x $b ]] || stores_die "$b not found: run scripts/install-test-deps"; done
    if [[ " $* " == *" kine-"[sn]* && ! -x $gokine ]]; then
        go install -tags nats "github.com/k3s-io/kine@$gokine_version" || stores_die "go install Go kine failed"
    fi
}

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

stores_cleanup() {
    stop_all
    pg_throwaway_stop 2>/dev/null || true
    mysql_throwaway_stop 2>/dev/null || true
    rm -rf "$work"
}

# stores_begin NAME: a run's report directory target/bench/NAME-<time> ($out, its report lines
# in $runs, appended with `say`), a scratch directory ($work) removed with everything started
# when the script ends, and kube-apiserver's certificates (make_certs).
stores_begin() {
    out=target/bench/$1-$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$out"
    runs=$out/runs.log
    work=$(mktemp -d "/tmp/kine-rs-$1.XXXXXX")
    trap stores_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    make_certs
}
say() { echo "$*" | tee -a "$runs"; }

# make_certs: kube-apiserver's serving certificate and service-account key in $work.
make_certs() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=kine-rs-bench \
        -addext subjectAltName=IP:127.0.0.1 -keyout "$work/serving.key" -out "$work/serving.crt" >/dev/null 2>&1 ||
        stores_die "openssl: the serving certificate"
    openssl ecparam -name prime256v1 -genkey -noout -out "$work/sa.key" 2>/dev/null ||
        stores_die "openssl: the service account key"
}

# start_store SYSTEM DIR: starts the datastore, its etcd API URLs in $store_urls (comma
# separated) and its processes in $store_pids (all of them count for CPU and memory), its data
# under DIR, or for PostgreSQL and MariaDB in the throwaway server's directory: $store_dir is
# where it is.
start_store() {
    local system=$1 dir=$2 url="http://127.0.0.1:23900" listen=(--listen-address 127.0.0.1:23900 --metrics-bind-address 0)
    store_pids="" store_urls=$url store_dir=$dir
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
    kine-rs-nats-cluster)
        local i routes=""
        for i in 0 1 2; do routes+="${routes:+, }\"nats-route://127.0.0.1:2396$i\""; done
        store_urls=""
        for i in 0 1 2; do
            mkdir -p "$dir/node$i"
            printf 'server_name: kine-rs-%s\njetstream { store_dir: "%s" }\ncluster {\n  name: kine-rs\n  listen: 127.0.0.1:2396%s\n  routes: [%s]\n}\n' \
                "$i" "$dir/node$i/js" "$i" "$routes" >"$dir/node$i/nats.conf"
            "$kine_rs" --listen-address "127.0.0.1:2390$i" --metrics-bind-address 0 --name "kine-rs-$i" \
                --endpoint "nats://?serverConfig=$dir/node$i/nats.conf&replicas=3" >"$out/$system-$i.log" 2>&1 &
            pids+=($!)
            store_pids+="${store_pids:+,}$!"
            store_urls+="${store_urls:+,}http://127.0.0.1:2390$i"
        done
        return ;;
    kine-rs-postgres)
        # A database server already up (restart_store) keeps its data.
        [[ -n ${PG_THROWAWAY_DIR:-} ]] || pg_throwaway_start >/dev/null
        store_pids=$(head -1 "$PG_THROWAWAY_DIR/data/postmaster.pid") store_dir=$PG_THROWAWAY_DIR
        "$kine_rs" "${listen[@]}" --endpoint "$PG_THROWAWAY_URL/kine?sslmode=disable" >"$out/$system.log" 2>&1 & ;;
    kine-rs-mysql)
        [[ -n ${MYSQL_THROWAWAY_DIR:-} ]] || mysql_throwaway_start >/dev/null
        store_pids=$MYSQL_THROWAWAY_PID store_dir=$MYSQL_THROWAWAY_DIR
        "$kine_rs" "${listen[@]}" --endpoint "$MYSQL_THROWAWAY_URL/kine" >"$out/$system.log" 2>&1 & ;;
    *) stores_die "unknown system $system" ;;
    esac
    pids+=($!)
    store_pids=${store_pids:+$store_pids,}$!
}

# restart_store SYSTEM DIR: the datastore's processes stopped and started again on the same
# data (PostgreSQL and MariaDB stay up: kine-rs restarts on them).
restart_store() {
    stop_all
    start_store "$@"
}

# wait_store SYSTEM URL: until the store at URL answers (etcd: once it has a leader); fails if
# one of its processes exits or 60 s pass.
wait_store() {
    local p
    for _ in $(seq 300); do
        etcdctl --endpoints "$2" --dial-timeout 1s --command-timeout 2s endpoint health >/dev/null 2>&1 && return 0
        for p in ${store_pids//,/ }; do kill -0 "$p" 2>/dev/null || { say "# FAILED: $1 exited at start (log: $out/$1.log)"; return 1; }; done
        sleep 0.2
    done
    say "# FAILED: $1 not answering at $2 within 60 s (log: $out/$1.log)"
    return 1
}

stop_store() {
    stop_all
    case "$1" in
    kine-rs-postgres) pg_throwaway_stop >/dev/null 2>&1 || true ;;
    kine-rs-mysql) mysql_throwaway_stop >/dev/null 2>&1 || true ;;
    esac
}

# start_apiserver LABEL [FLAG...]: kube-apiserver 1.37.2 on $store_urls, serving on
# 127.0.0.1:23943 with the certificates of make_certs and the tokens in $work/tokens.csv; waits
# for /readyz (with the first token of tokens.csv). Its pid in $apiserver_pid.
start_apiserver() {
    local label=$1 token
    shift
    token=$(head -1 "$work/tokens.csv" | cut -d, -f1)
    "$apiserver" --etcd-servers="$store_urls" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
        --secure-port=23943 --tls-cert-file="$work/serving.crt" --tls-private-key-file="$work/serving.key" \
        --cert-dir="$work/apiserver-certs" --token-auth-file="$work/tokens.csv" --authorization-mode=AlwaysAllow \
        --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$work/sa.key" \
        --service-account-signing-key-file="$work/sa.key" --service-cluster-ip-range=10.96.0.0/24 \
        --endpoint-reconciler-type=none --profiling=false "$@" >"$out/$label-apiserver.log" 2>&1 &
    pids+=($!) apiserver_pid=$!
    for _ in $(seq 240); do
        python3 - "$work/serving.crt" "$token" <<'EOF' 2>/dev/null && return 0
import ssl, sys, urllib.request
req = urllib.request.Request("https://127.0.0.1:23943/readyz", headers={"Authorization": "Bearer " + sys.argv[2]})
sys.exit(0 if urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sys.argv[1]), timeout=5).read() == b"ok" else 1)
EOF
        kill -0 "$apiserver_pid" 2>/dev/null || stores_die "kube-apiserver on $label exited at start (log: $out/$label-apiserver.log)"
        sleep 0.5
    done
    stores_die "kube-apiserver on $label not ready within 120 s (log: $out/$label-apiserver.log)"
}

# The versions, for a report's header.
stores_versions() {
    echo "kube-apiserver 1.37.2; etcd $("$etcd" --version | awk '/etcd Version/ {print $3}'); nats-server $("$nats" --version | awk '{print $2}'); kine-rs $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.lock || echo ' (uncommitted changes)')"
}
