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
$K --endpoint sqlite://$W/src.db --listen-address 127.0.0.1:23900 --metrics-bind-address 127.0.0.1:0 >$W/src.log 2>&1 &
sleep 1
$B --endpoint http://127.0.0.1:23900 --workload load --keys 100000 --clients 16 --shape k8s >/dev/null
$B --endpoint http://127.0.0.1:23900 --workload cas --keys 100000 --clients 16 --shape k8s --seconds 15 >/dev/null
REV=$(etcdctl --endpoints 127.0.0.1:23900 get / -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
etcdctl --endpoints 127.0.0.1:23900 compact $((REV - 20000)) >/dev/null
pkill -f "listen-address 127.0.0.1:23900"; sleep 1
ls -la $W/src.db
for to in "sqlite://$W/copy.db" "$PG_THROWAWAY_URL/copy" "$MYSQL_THROWAWAY_URL/copy"; do
  s=$(date +%s.%N)
  $K migrate --from sqlite://$W/src.db --to "$to" 2>&1 | grep -o 'versions=[0-9]* keys=[0-9]*' 
  e=$(date +%s.%N); echo "migrate sqlite -> ${to%%:*}: $(echo "$e - $s" | bc) s"
  s=$(date +%s.%N)
  $K migrate --from sqlite://$W/src.db --to "$to" 2>&1 | grep -c "continuing" >/dev/null
  e=$(date +%s.%N); echo "  again (nothing new; check + verify): $(echo "$e - $s" | bc) s"
done
# from etcd 3.7 with the same load
etcd-3.7 --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23910 --advertise-client-urls http://127.0.0.1:23910 --listen-peer-urls http://127.0.0.1:23911 --quota-backend-bytes 8589934592 >$W/etcd.log 2>&1 &
sleep 2
$B --endpoint http://127.0.0.1:23910 --workload load --keys 100000 --clients 16 --shape k8s >/dev/null
$B --endpoint http://127.0.0.1:23910 --workload cas --keys 100000 --clients 16 --shape k8s --seconds 10 >/dev/null
REV=$(etcdctl --endpoints 127.0.0.1:23910 get / -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
etcdctl --endpoints 127.0.0.1:23910 compact $((REV - 20000)) >/dev/null
s=$(date +%s.%N)
$K migrate --from http://127.0.0.1:23910 --to sqlite://$W/from-etcd.db 2>&1 | grep -o 'versions=[0-9]* keys=[0-9]*'
e=$(date +%s.%N); echo "migrate etcd 3.7 -> sqlite: $(echo "$e - $s" | bc) s"
pkill -f "etcd-3.7 --data-dir $W" || true
# from kine-rs's embedded NATS with the same load, read from the stopped node's store
$K --endpoint "nats://?dataDir=$W/nats" --listen-address 127.0.0.1:23900 --metrics-bind-address 127.0.0.1:0 >$W/nats.log 2>&1 &
sleep 2
$B --endpoint http://127.0.0.1:23900 --workload load --keys 100000 --clients 16 --shape k8s >/dev/null
$B --endpoint http://127.0.0.1:23900 --workload cas --keys 100000 --clients 16 --shape k8s --seconds 10 >/dev/null
REV=$(etcdctl --endpoints 127.0.0.1:23900 get / -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
etcdctl --endpoints 127.0.0.1:23900 compact $((REV - 20000)) >/dev/null
pkill -f "listen-address 127.0.0.1:23900"; sleep 2
s=$(date +%s.%N)
$K --endpoint "nats://?dataDir=$W/nats" inspect status 2>/dev/null | tr '\n' ' '; echo
e=$(date +%s.%N); echo "inspect status of the stopped NATS store: $(echo "$e - $s" | bc) s"
s=$(date +%s.%N)
$K migrate --from "nats://?dataDir=$W/nats" --to sqlite://$W/from-nats.db 2>&1 | grep -o 'versions=[0-9]* keys=[0-9]*'
e=$(date +%s.%N); echo "migrate embedded NATS (stopped) -> sqlite: $(echo "$e - $s" | bc) s"
rm -rf "$W"
