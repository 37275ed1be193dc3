#!/usr/bin/env bash
# Watch fan-out at scale (issue 21): each system started afresh, then
#   1. 10,000 watchers over 100 connections, each on a key of its own, 1,000 puts/s (8 writer
#      connections): delivery latency, and the server's memory per watcher (resident memory
#      once every watch exists minus before, on a process that served nothing before);
#   2. 1,000 watchers on one prefix over 10 connections, 200 puts/s (200,000 deliveries/s);
#   3. the same with 2 of the 10 connections not reading while the writers write (clients
#      that stopped reading): the latency of the 8 that read, against run 2, shows whether
#      slow watchers delay fast ones; the slow ones must still get every event afterwards.
#
#   bench/fanout.sh [seconds-per-run] [SYSTEM...]      (default 10 s; all systems)
#
# Systems: etcd (3.7), kine-sqlite (Go kine v0.17.5, its default SQLite), kine-rs-sqlite,
# kine-rs-nats-embedded. Needs target/release/kine-rs and kine-rs-bench, etcd-3.7 in $(go env
# GOPATH)/bin (scripts/install-test-deps) and Go kine there (installed with `go install` when
# missing). Output: target/bench/fanout-<time>/runs.log and summary.md (bench/summarize.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
seconds=10
if [[ ${1:-} =~ ^[0-9]+$ ]]; then seconds=$1; shift; fi
all=(etcd kine-sqlite kine-rs-sqlite kine-rs-nats-embedded)
systems=("$@")
[[ ${#systems[@]} -gt 0 ]] || systems=("${all[@]}")
die() { echo "fanout.sh: $*" >&2; exit 2; }
for s in "${systems[@]}"; do
    [[ " ${all[*]} " == *" $s "* ]] || die "unknown system $s (one of: ${all[*]})"
done
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
etcd=${ETCD_BIN:-$gobin/etcd-3.7}
gokine=$gobin/kine
kine_rs=target/release/kine-rs
bench=target/release/kine-rs-bench
for b in "$kine_rs" "$bench"; do [[ -x $b ]] || die "$b not found: cargo build --release -p kine-rs -p kine-rs-bench"; done
[[ -x $etcd ]] || die "etcd 3.7 not found at $etcd: run scripts/install-test-deps or set ETCD_BIN"
if [[ " ${systems[*]} " == *" kine-sqlite "* && ! -x $gokine ]]; then
    go install -tags nats github.com/k3s-io/kine@v0.17.5 || die "go install Go kine failed"
fi

source bench/lib.sh
out=target/bench/fanout-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
runs=$out/runs.log
data=$(mktemp -d /tmp/kine-rs-fanout.XXXXXX)
pid=
stop() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=
}
trap 'stop; rm -rf "$data"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
say() { echo "$*" | tee -a "$runs"; }

url=http://127.0.0.1:23700
listen=(--listen-address 127.0.0.1:23700 --metrics-bind-address 0)
say "# $(date -u +%FT%TZ) bench/fanout.sh $seconds ${systems[*]}; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "# etcd $("$etcd" --version | awk '/etcd Version/ {print $3}'); kine-rs $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.lock || echo ' (uncommitted changes)')"
failed=0
for system in "${systems[@]}"; do
    dir=$data/$system
    mkdir -p "$dir"
    case "$system" in
    etcd)
        "$etcd" --name default --data-dir "$dir" --log-level warn --listen-client-urls "$url" --advertise-client-urls "$url" \
            --listen-peer-urls http://127.0.0.1:23780 --initial-advertise-peer-urls http://127.0.0.1:23780 \
            --initial-cluster default=http://127.0.0.1:23780 >"$out/$system.log" 2>&1 & ;;
    kine-sqlite) env -C "$dir" "$gokine" "${listen[@]}" >"$out/$system.log" 2>&1 & ;;
    kine-rs-sqlite) "$kine_rs" "${listen[@]}" --endpoint "sqlite://$dir/state.db" >"$out/$system.log" 2>&1 & ;;
    kine-rs-nats-embedded) "$kine_rs" "${listen[@]}" --endpoint "nats://?dataDir=$dir/js" >"$out/$system.log" 2>&1 & ;;
    esac
    pid=$!
    wait_serving "$system" "$url" "$pid" "$out/$system.log"
    for w in "--watch-on key --watchers 10000 --clients 100 --rate 1000 --writers 8" \
        "--watchers 1000 --clients 10 --rate 200" "--watchers 1000 --clients 10 --rate 200 --slow-clients 2"; do
        # shellcheck disable=SC2086
        line=$("$bench" --endpoint "$url" --label "$system" --seconds "$seconds" --server-pid "$pid" --workload watch $w) || true
        if [[ $line == label=* ]]; then say "$line"; else say "# FAILED: $system $w"; failed=$((failed + 1)); fi
    done
    stop
done
echo
bench/summarize.py --baseline "${systems[0]}" <"$runs" | tee "$out/summary.md"
# Memory per watcher: the first run of each system, on its fresh process.
{
    echo
    echo "Server memory with 10,000 watchers (fresh process): KiB per watcher, resident MiB once all exist"
    echo
    echo "| system | KiB per watcher | RSS MiB with the watches |"
    echo "|---|---|---|"
    awk '/watch_on=key/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        printf "| %s | %s | %s |\n", f["label"], f["server_kib_per_watcher"], f["server_rss_watches_mib"] }' "$runs"
    echo
    echo "The slow connections' events, read once the writers stopped (missed: not there 60 s later)"
    echo
    echo "| system | delivered | missed |"
    echo "|---|---|---|"
    awk '/slow_clients=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        printf "| %s | %s | %s |\n", f["label"], f["slow_events"], f["slow_missed"] }' "$runs"
} | tee -a "$out/summary.md"
echo "fanout.sh: report lines in $runs, tables in $out/summary.md"
[[ $failed == 0 ]] || die "$failed run(s) failed (# FAILED lines in $runs)"
