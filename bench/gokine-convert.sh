#!/bin/bash
# Moving a Go kine cluster to kine-rs and back, at Kubernetes size (issue #41): 100,000 pods
# (1-4 KiB values, kine-rs-bench's k8s shape) written through Go kine v0.17.5, compacted through
# its Compact RPC (as kube-apiserver compacts; Go kine keeps the newest 1,000 revisions), then
# 20,000 updates (get + conditional update, as kube-apiserver updates). Each conversion runs
# twice: while Go kine still serves (the copy; no stop), then after 1,000 more updates with Go
# kine stopped (the switch-over: the stop a user needs, Go kine's table read again plus what
# changed). Conversions:
#   Go kine SQLite (k3s's URL) -> kine-rs SQLite, -> kine-rs's embedded NATS (dataDir),
#                                -> a 3-node nats-server cluster (replicas=3)
#   Go kine PostgreSQL -> kine-rs PostgreSQL
#   kine-rs SQLite (the copy above) -> Go kine SQLite (--to-go-kine; one transaction, no resume)
# Prints one line per step (docs/BENCHMARKS.md, "Conversions from and to Go kine").
#
#   bench/gokine-convert.sh            # KEYS=100000 UPDATES=20000 by default
#
# Needs release builds of kine-rs and kine-rs-bench (cargo build --release -p kine-rs -p
# kine-rs-bench), Go kine, nats-server, PostgreSQL, etcdctl (scripts/install-test-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/go/bin:/usr/sbin:$PATH
KEYS=${KEYS:-100000}
UPDATES=${UPDATES:-20000}
K=${KINE_RS_BIN:-$PWD/target/release/kine-rs}
bench=${BENCH_BIN:-$PWD/target/release/kine-rs-bench}
GO_KINE=${GO_KINE_BIN:-$HOME/go/bin/kine}
die() { echo "gokine-convert: $*" >&2; exit 1; }
for b in "$K" "$bench" "$GO_KINE"; do [[ -x $b ]] || die "missing $b"; done
command -v nats-server >/dev/null || die "missing nats-server (scripts/install-test-deps)"
source bench/lib.sh
source scripts/pg-throwaway.sh
W=$(mktemp -d /tmp/gokine-convert.XXXX)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pg_throwaway_stop >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT
pg_throwaway_start >/dev/null

revision() { etcdctl --endpoints "$1" get /bench-revision -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])'; }
# updates URL N: get + conditional updates of random pods until N more revisions exist.
updates() {
  local url=$1 target
  target=$(($(revision "$url") + $2))
  while [[ $(revision "$url") -lt $target ]]; do
    "$bench" --endpoint "$url" --workload cas --keys "$KEYS" --clients 16 --shape k8s --seconds 2 >/dev/null
  done
}
# Runs a command and prints "LABEL: N s (peak RSS M MB)" after the counts it logged.
timed() {
  local label=$1 s e
  shift
  s=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$W/rss" "$@" >"$W/step.log" 2>&1 || { tail -5 "$W/step.log"; die "$label failed"; }
  e=$(date +%s.%N)
  printf '%s: %.1f s (peak RSS %d MB; %s)\n' "$label" "$(echo "$e - $s" | bc)" $(($(cat "$W/rss") / 1024)) \
    "$(grep -o 'revision=[0-9]* compact_revision=[0-9]* versions=[0-9]* keys=[0-9]*\|rows=[0-9]* keys=[0-9]*' "$W/step.log" | tail -1)"
}
# gokine NAME ENDPOINT PORT: starts Go kine and fills it.
gokine() {
  local name=$1 endpoint=$2 port=$3 url=http://127.0.0.1:$3 s e rev
  "$GO_KINE" --endpoint "$endpoint" --listen-address "127.0.0.1:$port" --metrics-bind-address 0 >"$W/$name.log" 2>&1 &
  pids+=($!)
  GOKINE_PID=$!
  wait_serving "Go kine on $name" "$url" "$GOKINE_PID" "$W/$name.log"
  s=$(date +%s.%N)
  "$bench" --endpoint "$url" --workload load --keys "$KEYS" --clients 16 --shape k8s >/dev/null 2>&1
  rev=$(revision "$url")
  etcdctl --endpoints "$url" --command-timeout=900s compact "$rev" >/dev/null
  updates "$url" "$UPDATES"
  e=$(date +%s.%N)
  printf 'Go kine on %s: %d pods, compacted at %d, %d updates: %.0f s; revision %d\n' "$name" "$KEYS" "$rev" "$UPDATES" "$(echo "$e - $s" | bc)" "$(revision "$url")"
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }

# ---- Go kine on SQLite (k3s's URL) into kine-rs SQLite, embedded NATS, a 3-node NATS cluster
routes='"nats-route://127.0.0.1:24430","nats-route://127.0.0.1:24431","nats-route://127.0.0.1:24432"'
for i in 0 1 2; do
  printf 'server_name: n%s\nlisten: 127.0.0.1:%s\nmax_payload: 2MB\njetstream { store_dir: "%s" }\ncluster { name: conv, listen: 127.0.0.1:%s, routes: [%s] }\n' \
    "$i" $((24420 + i)) "$W/js$i" $((24430 + i)) "$routes" >"$W/n$i.conf"
  nats-server -c "$W/n$i.conf" >"$W/n$i.log" 2>&1 &
  pids+=($!)
done
src="sqlite://$W/state.db?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate"
gokine sqlite "$src" 24400
ls -la "$W/state.db" | awk '{print "state.db: " $5 " bytes"}'
targets=("sqlite://$W/kiners.db" "nats://?dataDir=$W/nats" "nats://127.0.0.1:24420?noEmbed&bucket=kine&replicas=3")
for to in "${targets[@]}"; do
  timed "copy while Go kine serves: Go kine sqlite -> $to" "$K" migrate --from "$src" --to "$to"
done
updates http://127.0.0.1:24400 1000
stop "$GOKINE_PID"
for to in "${targets[@]}"; do
  timed "  the stop (1,000 updates later, Go kine stopped): -> $to" "$K" migrate --from "$src" --to "$to"
done
# ---- kine-rs back to Go kine
timed "kine-rs sqlite -> Go kine sqlite (--to-go-kine)" "$K" migrate --from "sqlite://$W/kiners.db" --to "sqlite://$W/back.db" --to-go-kine

# ---- Go kine on PostgreSQL into kine-rs PostgreSQL
src="$PG_THROWAWAY_URL/gokine?sslmode=disable"
gokine postgres "$src" 24401
timed "copy while Go kine serves: Go kine postgres -> kine-rs postgres" "$K" migrate --from "$src" --to "$PG_THROWAWAY_URL/kiners?sslmode=disable"
updates http://127.0.0.1:24401 1000
stop "$GOKINE_PID"
timed "  the stop (1,000 updates later, Go kine stopped): -> kine-rs postgres" "$K" migrate --from "$src" --to "$PG_THROWAWAY_URL/kiners?sslmode=disable"
