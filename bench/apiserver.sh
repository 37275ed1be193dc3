#!/usr/bin/env bash
# kube-apiserver on each datastore in turn, the same load through its REST API
# (bench/apiserver-load.py), and one table of the phases with ratios against etcd and against Go
# kine on the same backend (bench/summarize-apiserver.py).
#
#   bench/apiserver.sh [--rounds R] [--objects M] [--namespaces N] [--clients C] [--watchers W]
#                      [SYSTEM...]
#
# Systems (bench/stores.sh; default: all but kine-rs-nats-cluster): etcd (3.7), kine-sqlite,
# kine-nats-embedded (Go kine v0.17.5), kine-rs-sqlite, kine-rs-nats-embedded, kine-rs-nats (an
# external nats-server), kine-rs-nats-cluster, kine-rs-postgres, kine-rs-mysql. Each round
# starts every system afresh (its own empty store), one after the other, with a new
# kube-apiserver 1.37.2 on it; the load runs alone on the machine with them. Defaults: 1 round, 10 namespaces × 500 ConfigMaps, 16 clients, 10 watchers.
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
source bench/stores.sh
[[ ${#systems[@]} -gt 0 ]] || systems=(etcd kine-sqlite kine-nats-embedded kine-rs-sqlite kine-rs-nats-embedded kine-rs-nats kine-rs-postgres kine-rs-mysql)
for n in "$rounds" "$objects" "$namespaces" "$clients"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "apiserver.sh: --rounds, --objects, --namespaces and --clients take numbers ≥ 1" >&2; exit 2; }
done

check_binaries "${systems[@]}"

stores_begin apiserver
token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
echo "$token,bench-admin,bench-admin,system:masters" >"$work/tokens.csv"

say "# $(date -u +%FT%TZ) bench/apiserver.sh --rounds $rounds --objects $objects --namespaces $namespaces --clients $clients --watchers $watchers ${systems[*]}; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "# $(stores_versions)"
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
