#!/usr/bin/env bash
# A list of 100 k and 1 M keys through RangeStream (etcd 3.7) and through paginated Range (pages
# of 500, what kube-apiserver does without RangeStream), on etcd 3.7, kine-rs on SQLite and
# kine-rs on its embedded NATS server, one after the other on this machine: time to the last
# byte and the server's peak resident memory during the list (its VmHWM, reset before each
# run). Keys /bench/k/<i> with 256-byte values (kine-rs-bench's flat shape).
#
#   bench/range-stream.sh [keys...]        (default: 100000 1000000)
#
# Needs target/release/kine-rs and target/release/kine-rs-bench, and etcd-3.7 in
# $(go env GOPATH)/bin (scripts/install-test-deps). Report lines in
# target/bench/range-stream-<time>/runs.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(100000 1000000)
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
etcd=${ETCD37_BIN:-$gobin/etcd-3.7}
kine_rs=target/release/kine-rs
bench=target/release/kine-rs-bench
for b in "$kine_rs" "$bench" "$etcd"; do
    [[ -x $b ]] || { echo "range-stream.sh: $b not found" >&2; exit 2; }
done
out=target/bench/range-stream-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
runs=$out/runs.log
data=$(mktemp -d /tmp/kine-rs-range-stream.XXXXXX)
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=
    rm -rf "$data"
    mkdir -p "$data"
}
trap 'cleanup; rm -rf "$data"' EXIT
say() { echo "$*" | tee -a "$runs"; }

start() { # start LABEL COMMAND...
    local label=$1
    shift
    "$@" >>"$out/$label.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        "$bench" --endpoint http://127.0.0.1:24500 --workload load --keys 1 >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "range-stream.sh: $label not serving" >&2
    exit 2
}

say "# $(date -u +%FT%TZ) bench/range-stream.sh ${sizes[*]}; $(nproc) cores; etcd $("$etcd" --version | awk '/etcd Version/ {print $3}'); kine-rs $(git rev-parse --short HEAD)"
for keys in "${sizes[@]}"; do
    for system in etcd-3.7 kine-rs-sqlite kine-rs-nats-embedded; do
        case $system in
            etcd-3.7) start "$system" "$etcd" --name default --data-dir "$data/etcd" --log-level warn \
                --listen-client-urls http://127.0.0.1:24500 --advertise-client-urls http://127.0.0.1:24500 \
                --listen-peer-urls http://127.0.0.1:24580 --initial-advertise-peer-urls http://127.0.0.1:24580 \
                --initial-cluster default=http://127.0.0.1:24580 --quota-backend-bytes 8589934592 ;;
            kine-rs-sqlite) start "$system" "$kine_rs" --listen-address 127.0.0.1:24500 --metrics-bind-address 0 \
                --endpoint "sqlite://$data/state.db" ;;
            kine-rs-nats-embedded) start "$system" "$kine_rs" --listen-address 127.0.0.1:24500 \
                --metrics-bind-address 0 --endpoint "nats://?dataDir=$data/nats" ;;
        esac
        "$bench" --endpoint http://127.0.0.1:24500 --workload load --keys "$keys"
        sleep 2
        for w in stream-all list-all; do
            line=$("$bench" --endpoint http://127.0.0.1:24500 --label "$system" --workload $w --keys "$keys" \
                --limit 500 --seconds 1 --server-pid "$pid") || line="# FAILED: $system $w $keys"
            say "$line"
        done
        say "idle-after label=$system rss_mib=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$pid/status")"
        cleanup
    done
done
