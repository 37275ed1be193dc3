#!/usr/bin/env bash
# A large table on PostgreSQL or MySQL/MariaDB: kine-rs and Go kine side by side on one
# throwaway database server (a database each). Preloads N keys (default 200 000), gives them
# history (20 s of get + conditional update from 16 clients), then measures paginated lists
# (limit 500), counts of all keys and gets, 1 and 16 clients, the systems alternating.
#
#   bench/sql-large.sh postgres|mysql [keys] [seconds-per-run]
#
# Needs: target/release/kine-rs and target/release/kine-rs-bench, Debian's postgresql or
# mariadb-server, and Go kine (`go install -tags nats github.com/k3s-io/kine@v0.17.5`; skipped
# when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
db=${1:?usage: bench/sql-large.sh postgres|mysql [keys] [seconds-per-run]}
keys=${2:-200000}
seconds=${3:-10}
export PATH="$PATH:$(go env GOPATH 2>/dev/null)/bin"
bench=target/release/kine-rs-bench
logs=$(mktemp -d /tmp/kine-rs-bench-sql.XXXXXX)
case "$db" in
  postgres)
    source scripts/pg-throwaway.sh
    stop_db=pg_throwaway_stop
    pg_throwaway_start
    endpoint() { echo "$PG_THROWAWAY_URL/$1?sslmode=disable"; }
    version="PostgreSQL $PG_THROWAWAY_VERSION"
    ;;
  mysql)
    source scripts/mysql-throwaway.sh
    stop_db=mysql_throwaway_stop
    mysql_throwaway_start
    endpoint() { echo "$MYSQL_THROWAWAY_URL/$1"; }
    version="MariaDB $MYSQL_THROWAWAY_VERSION"
    ;;
  *) echo "usage: bench/sql-large.sh postgres|mysql [keys] [seconds-per-run]" >&2; exit 2 ;;
esac
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; $stop_db; }
trap cleanup EXIT
target/release/kine-rs --listen-address 127.0.0.1:23793 --metrics-bind-address 0 \
  --endpoint "$(endpoint kiners)" >"$logs/kine-rs.log" 2>&1 &
pids+=($!)
systems=("kine-rs 23793 $!")
if command -v kine >/dev/null; then
  kine --listen-address 127.0.0.1:23794 --metrics-bind-address 0 \
    --endpoint "$(endpoint gokine)" >"$logs/gokine.log" 2>&1 &
  pids+=($!)
  systems+=("gokine 23794 $!")
  gokine_version=$(go version -m "$(command -v kine)" | awk '$1=="mod"{print $3}')
fi
sleep 3
echo "# $(date -u +%FT%TZ) $(nproc) cores; $version; Go kine ${gokine_version:-absent}; kine-rs $(git rev-parse --short HEAD); logs in $logs"
for system in "${systems[@]}"; do
  set -- $system
  $bench --endpoint "http://127.0.0.1:$2" --workload load --keys "$keys" --clients 64
  $bench --endpoint "http://127.0.0.1:$2" --label "$1" --workload cas --keys "$keys" --clients 16 --seconds 20
done
for workload in list count get; do
  for clients in 1 16; do
    for system in "${systems[@]}"; do
      set -- $system
      $bench --endpoint "http://127.0.0.1:$2" --label "$1" --workload $workload --clients $clients \
        --keys "$keys" --seconds "$seconds" --server-pid "$3"
    done
  done
done | tee "$logs/runs.txt"
echo
bench/summarize.py --baseline "${systems[-1]%% *}" <"$logs/runs.txt"
