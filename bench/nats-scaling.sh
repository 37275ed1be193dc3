#!/usr/bin/env bash
# NATS backend: linearizable get and get+update (CAS) as the bucket grows (1 k, 100 k, 300 k
# keys), kine-rs and Go kine side by side on one nats-server, in one run.
#
#   bench/nats-scaling.sh [seconds-per-run] [rounds]
#
# Needs: target/release/kine-rs and target/release/kine-rs-bench (cargo build --release -p
# kine-rs -p kine-rs-bench), nats-server and Go kine (`go install -tags nats
# github.com/k3s-io/kine@v0.17.5`) in $PATH or ~/go/bin. Prints one report line per run (the
# systems alternate within each round), then a table of medians and ratios (bench/summarize.py).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
rounds=${2:-3}
export PATH="$PATH:$(go env GOPATH 2>/dev/null)/bin"
bench=target/release/kine-rs-bench
dir=$(mktemp -d /tmp/kine-rs-bench.XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

nats-server -a 127.0.0.1 -p 24222 -js -sd "$dir/js" >"$dir/nats.log" 2>&1 &
pids+=($!)
sleep 1
target/release/kine-rs --listen-address 127.0.0.1:23791 --metrics-bind-address 0 \
  --endpoint 'nats://127.0.0.1:24222?noEmbed&bucket=kiners' >"$dir/kine-rs.log" 2>&1 &
kine_rs=$!
pids+=($kine_rs)
kine --listen-address 127.0.0.1:23792 --metrics-bind-address 0 \
  --endpoint 'nats://127.0.0.1:24222?noEmbed&bucket=gokine' >"$dir/gokine.log" 2>&1 &
gokine=$!
pids+=($gokine)
sleep 3
echo "# $(date -u +%FT%TZ) $(nproc) cores; nats-server $(nats-server --version | awk '{print $2}'); Go kine $(go version -m "$(command -v kine)" | awk '$1=="mod"{print $3}'); kine-rs $(git rev-parse --short HEAD)"
for keys in 1000 100000 300000; do
  for system in "kine-rs 23791" "gokine 23792"; do
    set -- $system
    $bench --endpoint "http://127.0.0.1:$2" --workload load --keys "$keys" --clients 64
  done
  for round in $(seq "$rounds"); do
    for workload in get cas; do
      for clients in 1 16; do
        for system in "kine-rs 23791 $kine_rs" "gokine 23792 $gokine"; do
          set -- $system
          $bench --endpoint "http://127.0.0.1:$2" --label "$1" --workload $workload --clients $clients \
            --keys "$keys" --seconds "$seconds" --server-pid "$3"
        done
      done
    done
  done
done | tee "$dir/runs.txt"
echo
bench/summarize.py --baseline gokine <"$dir/runs.txt"
