#!/bin/bash
# kine-rs migrate on 100,000 Kubernetes-shaped pods (1-4 KiB) plus 15 s of updates, compacted
# 20,000 revisions back: SQLite into SQLite, PostgreSQL and MariaDB (each, then a second run that
# finds nothing new: the resume check and the verification alone), the same load on etcd 3.7
# into SQLite, and on kine-rs's embedded NATS (read from the stopped node's store) into SQLite.
# Needs release builds of kine-rs and kine-rs-bench, etcd-3.7, PostgreSQL, MariaDB
# (scripts/install-test-deps). Prints one line per step (docs/BENCHMARKS.md, "Migration").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/go/bin:/usr/sbin:$PATH
source scripts/pg-throwaway.sh
source scripts/mysql-throwaway.sh
K=$PWD/target/release/kine-rs; B=$PWD/target/release/kine-rs-bench
W=$(mktemp -d /tmp/migbench.XXXX)
pg_throwaway_start; mysql_throwaway_start
trap 'pg_throwaway_stop; mysql_throwaway_stop; pkill -f "listen-address 127.0.0.1:23900" || true; pkill -f "etcd-3.7 --data-dir $W" || true; rm -rf "$W"' EXIT
# 100,000 pods and SECONDS of updates through ENDPOINT (host:port), then a compaction 20,000
# revisions back.
load() {
  local at=$1 seconds=$2 rev
  $B --endpoint "http://$at" --workload load --keys 100000 --clients 16 --shape k8s >/dev/null
  $B --endpoint "http://$at" --workload cas --keys 100000 --clients 16 --shape k8s --seconds "$seconds" >/dev/null
  rev=$(etcdctl --endpoints "$at" get / -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
  etcdctl --endpoints "$at" compact $((rev - 20000)) >/dev/null
}
# Waits until something listens on 127.0.0.1:PORT.
ready() {
  for _ in $(seq 150); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.2
  done
  echo "nothing listens on 127.0.0.1:$1" >&2
  return 1
}
# Runs a command and prints "LABEL: N s" after its output.
timed() {
  local label=$1 s e
  shift
  s=$(date +%s.%N)
  "$@"
  e=$(date +%s.%N)
  echo "$label: $(echo "$e - $s" | bc) s"
}
counts() { grep -o 'versions=[0-9]* keys=[0-9]*' || true; }
migrate() { $K migrate --from "$1" --to "$2" 2>&1 | counts; }
again() { $K migrate --from "$1" --to "$2" >/dev/null 2>&1; }

$K --endpoint sqlite://$W/src.db --listen-address 127.0.0.1:23900 --metrics-bind-address 127.0.0.1:0 >$W/src.log 2>&1 &
ready 23900
load 127.0.0.1:23900 15
pkill -f "listen-address 127.0.0.1:23900"; sleep 1
ls -la $W/src.db
for to in "sqlite://$W/copy.db" "$PG_THROWAWAY_URL/copy" "$MYSQL_THROWAWAY_URL/copy"; do
  timed "migrate sqlite -> ${to%%:*}" migrate "sqlite://$W/src.db" "$to"
  timed "  again (nothing new; check + verify)" again "sqlite://$W/src.db" "$to"
done
# from etcd 3.7 with the same load
etcd-3.7 --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23910 --advertise-client-urls http://127.0.0.1:23910 --listen-peer-urls http://127.0.0.1:23911 --quota-backend-bytes 8589934592 >$W/etcd.log 2>&1 &
ready 23910
load 127.0.0.1:23910 10
timed "migrate etcd 3.7 -> sqlite" migrate http://127.0.0.1:23910 "sqlite://$W/from-etcd.db"
pkill -f "etcd-3.7 --data-dir $W" || true
# from kine-rs's embedded NATS with the same load, read from the stopped node's store
$K --endpoint "nats://?dataDir=$W/nats" --listen-address 127.0.0.1:23900 --metrics-bind-address 127.0.0.1:0 >$W/nats.log 2>&1 &
ready 23900
load 127.0.0.1:23900 10
pkill -f "listen-address 127.0.0.1:23900"; sleep 2
status() { $K --endpoint "nats://?dataDir=$W/nats" inspect status 2>/dev/null | tr '\n' ' '; echo; }
timed "inspect status of the stopped NATS store" status
timed "migrate embedded NATS (stopped) -> sqlite" migrate "nats://?dataDir=$W/nats" "sqlite://$W/from-nats.db"
rm -rf "$W"
