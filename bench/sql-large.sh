#!/usr/bin/env bash
# PostgreSQL with a large table: kine-rs and Go kine side by side on one throwaway PostgreSQL
# (a database each). Preloads N keys (default 200 000), gives them history (20 s of
# get + conditional update from 16 clients), then measures paginated lists (limit 500), counts
# of all keys and gets, 1 and 16 clients, the systems alternating.
#
#   bench/postgres-large.sh [keys] [seconds-per-run]
#
# Needs: target/release/kine-rs and target/release/kine-rs-bench, Debian's postgresql, and Go
# kine (`go install -tags nats github.com/k3s-io/kine@v0.17.5`; skipped when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${1:-200000}
seconds=${2:-10}
export PATH="$PATH:$(go env GOPATH 2>/dev/null)/bin"
bench=target/release/kine-rs-bench
logs=$(mktemp -d /tmp/kine-rs-bench-pg.XXXXXX)
source scripts/pg-throwaway.sh
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; pg_throwaway_stop; }
trap cleanup EXIT
pg_throwaway_start
target/release/kine-rs --listen-address 127.0.0.1:23793 --metrics-bind-address 0 \
  --endpoint "$PG_THROWAWAY_URL/kiners?sslmode=disable" >"$logs/kine-rs.log" 2>&1 &
pids+=($!)
systems=("kine-rs 23793 $!")
if command -v kine >/dev/null; then
  kine --listen-address 127.0.0.1:23794 --metrics-bind-address 0 \
    --endpoint "$PG_THROWAWAY_URL/gokine?sslmode=disable" >"$logs/gokine.log" 2>&1 &
  pids+=($!)
  systems+=("gokine 23794 $!")
  gokine_version=$(go version -m "$(command -v kine)" | awk '$1=="mod"{print $3}')
fi
sleep 3
echo "# $(date -u +%FT%TZ) $(nproc) cores; PostgreSQL $PG_THROWAWAY_VERSION; Go kine ${gokine_version:-absent}; kine-rs $(git rev-parse --short HEAD); logs in $logs"
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
