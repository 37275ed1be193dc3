#!/usr/bin/env bash
# Read-only copies of a NATS bucket (docs/nats.md, "Topologies"), measured on loopback:
#   lag       a copy's replication lag at 500 and 2,000 writes/s: the delay from a write's
#             acknowledgement on the origin to its watch event on the copy (ms), and how many
#             revisions the origin was ahead when it arrived; the same watch on the origin itself
#             beside it. Two set-ups: "local" (the copy's mirror on the origin's nats-server) and
#             "leaf" (the origin a kine-rs on its embedded server, a leaf node of a hub
#             nats-server in JetStream domain edge; the copy's mirror on the hub).
#   failover  the leaf set-up under a write load of 500 and 2,000 writes/s; the edge kine-rs (and
#             its embedded server) killed with SIGKILL; the copy promoted at once: time to the
#             promotion and to the first write it takes, acknowledged writes lost (the RPO).
#   reads     get, list and watch fan-out on the origin, on one copy, and on three copies at
#             once (the "local" set-up; three load generators at the same time).
# Writes are puts of 2 KiB values (a Kubernetes object's size) from 8 connections, each
# writer on keys of its own (the watch workload of kine-rs-bench with --write-endpoint).
#
#   bench/copies.sh [seconds-per-run] [parts]   (defaults: 15, "local leaf failover")
#
# Parts: local (lag and reads on the local set-up), leaf (lag over the leaf connection),
# failover (three rounds at each rate).
#
# Needs target/release/kine-rs and target/release/kine-rs-bench (cargo build --release -p
# kine-rs -p kine-rs-bench) and nats-server in $(go env GOPATH)/bin (scripts/install-test-deps).
# Output: report lines in target/bench/copies-<time>/runs.log, server logs next to it.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
seconds=${1:-15}
parts=${2:-local leaf failover}
wants() { [[ " $parts " == *" $1 "* ]]; }

die() {
    echo "copies.sh: $*" >&2
    exit 2
}
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
nats=${NATS_SERVER_BIN:-$gobin/nats-server}
kine_rs=target/release/kine-rs
bench=target/release/kine-rs-bench
for b in "$kine_rs" "$bench" "$nats"; do
    [[ -x $b ]] || die "$b not found (cargo build --release -p kine-rs -p kine-rs-bench; scripts/install-test-deps)"
done
out=target/bench/copies-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
runs=$out/runs.log
data=$(mktemp -d /tmp/kine-rs-copies.XXXXXX)
pids=()
cleanup() {
    if [[ ${#pids[@]} -gt 0 ]]; then
        kill "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
    pids=()
    rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
say() { echo "$*" | tee -a "$runs"; }

# start LABEL COMMAND...: a server in the background, its output in $out/LABEL.log; $! is its pid.
start() {
    local label=$1
    shift
    "$@" >>"$out/$label.log" 2>&1 &
    pids+=($!)
}
# serving PORT: waits until a kine-rs on PORT answers (60 s).
serving() {
    for _ in $(seq 300); do
        "$bench" --endpoint "http://127.0.0.1:$1" --workload load --keys 1 >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "nothing serving on port $1"
}
kine() { # kine LABEL PORT ENDPOINT
    start "$1" "$kine_rs" --listen-address "127.0.0.1:$2" --metrics-bind-address 0 --endpoint "$3"
}
stop_all() { cleanup; data=$(mktemp -d /tmp/kine-rs-copies.XXXXXX); }

# The leaf set-up: hub nats-server 24320 (leaf port 24322), edge kine-rs 24301 on its embedded
# server (domain edge), copy kine-rs 24302 on the hub.
leaf_setup() {
    cat >"$data/hub.conf" <<EOF
server_name: hub
leafnodes { listen: 127.0.0.1:24322 }
EOF
    cat >"$data/edge.conf" <<EOF
server_name: kine-edge
jetstream { domain: edge }
leafnodes { remotes: [ { url: "nats-leaf://127.0.0.1:24322" } ] }
EOF
    start hub "$nats" -c "$data/hub.conf" -a 127.0.0.1 -p 24320 -js -sd "$data/hub"
    kine edge 24301 "nats://?serverConfig=$data/edge.conf&dataDir=$data/edge"
    edge_pid=$!
    serving 24301
    kine copy 24302 "nats://127.0.0.1:24320?noEmbed&bucket=kine-copy&mirror=kine&mirrorDomain=edge"
    serving 24302
}

# The local set-up: nats-server 24420; origin 24401; copies 24402-24404 (buckets copy1-3).
local_setup() {
    start nats "$nats" -a 127.0.0.1 -p 24420 -js -sd "$data/nats"
    sleep 0.5
    kine origin 24401 "nats://127.0.0.1:24420?noEmbed"
    serving 24401
    for i in 1 2 3; do
        kine "copy$i" $((24401 + i)) "nats://127.0.0.1:24420?noEmbed&bucket=copy$i&mirror=kine"
        serving $((24401 + i))
    done
}

run() { # run LABEL ARGS...: one kine-rs-bench run, its report line logged
    local label=$1
    shift
    local line
    line=$("$bench" --label "$label" "$@") || true
    if [[ $line == label=* ]]; then say "$line"; else say "# FAILED: $label $*"; fi
}

lag_runs() { # lag_runs SETUP ORIGIN_PORT COPY_PORT
    for rate in 500 2000; do
        run "$1-origin-$rate" --endpoint "http://127.0.0.1:$2" --workload watch --watchers 10 --clients 2 \
            --writers 8 --rate $rate --value-bytes 2048 --seconds "$seconds"
        run "$1-copy-$rate" --endpoint "http://127.0.0.1:$3" --write-endpoint "http://127.0.0.1:$2" \
            --workload watch --watchers 10 --clients 2 --writers 8 --rate $rate --value-bytes 2048 --seconds "$seconds"
    done
}

say "# $(date -u +%FT%TZ) bench/copies.sh $seconds; $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); nats-server $("$nats" --version | awk '{print $2}'); kine-rs $(git rev-parse --short HEAD)"

if wants local; then
say "## lag, local"
local_setup
lag_runs local 24401 24402
say "## reads: origin, one copy, three copies at once"
"$bench" --endpoint http://127.0.0.1:24401 --workload load --keys 10000 --shape k8s
sleep 2
for w in "--workload get --clients 16 --keys 10000 --shape k8s" "--workload list --clients 4 --keys 10000 --shape k8s --limit 500"; do
    # shellcheck disable=SC2086
    run origin --endpoint http://127.0.0.1:24401 --seconds "$seconds" $w
    # shellcheck disable=SC2086
    run copy1 --endpoint http://127.0.0.1:24402 --seconds "$seconds" $w
    three=()
    for i in 1 2 3; do
        # shellcheck disable=SC2086
        "$bench" --label "three-copies-$i" --endpoint "http://127.0.0.1:$((24401 + i))" --seconds "$seconds" $w >"$data/three-$i" &
        three+=($!)
    done
    wait "${three[@]}" || true
    for i in 1 2 3; do say "$(cat "$data/three-$i")"; done
done
run watch-origin --endpoint http://127.0.0.1:24401 --workload watch --watchers 1000 --clients 10 --rate 200 --seconds "$seconds"
run watch-copy1 --endpoint http://127.0.0.1:24402 --write-endpoint http://127.0.0.1:24401 --workload watch \
    --watchers 1000 --clients 10 --rate 200 --seconds "$seconds"
stop_all
fi

if wants leaf; then
    say "## lag, leaf"
    leaf_setup
    lag_runs leaf 24301 24302
    stop_all
fi

if wants failover; then
    say "## failover, leaf"
    for rate in 500 2000; do
        for _ in 1 2 3; do
            leaf_setup
            run "failover-$rate" --endpoint http://127.0.0.1:24302 --write-endpoint http://127.0.0.1:24301 \
                --workload failover --writers 8 --rate $rate --value-bytes 2048 --seconds "$seconds" \
                --origin-pid "$edge_pid"
            stop_all
        done
    done
fi
say "# done; lines in $runs"
