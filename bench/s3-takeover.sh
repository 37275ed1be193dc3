#!/bin/bash
# Takeover by an S3 standby after a long --s3-sync write load (docs/s3.md, "Takeover"): a
# writer and a standby kine-rs on one folder of a local versitygw, a 2-s writer lock lease
# (LEASE=10s for another: on a busy machine a long run wants a longer one, or the writer may
# miss its renewals and stop by itself);
# kine-rs-bench's failover workload creates RATE keys/s (256-byte values, 16 connections) on the
# writer for SECONDS, kills it with SIGKILL, and times until the standby, which takes the writer
# lock by itself once the lease ran out, acknowledges a write. Prints the bench's report line
# (first_write_ms: kill to first write; lost: acknowledged writes the standby does not hold), the
# segments and checkpoints the writer shipped, how long the killed writer took to exit (and what
# held it: bench/exit-watch.py), the standby's takeover log lines and its peak RSS.
#
#   bench/s3-takeover.sh [seconds] [rate] [extra kine-rs flags...]   (defaults: 300 500)
#   KINE=/path/to/other/kine-rs bench/s3-takeover.sh 300 500         (another build, e.g. an older one)
#   KEEP=1 bench/s3-takeover.sh ...                                     (the logs and data are kept)
# Needs release builds of kine-rs and kine-rs-bench, and versitygw (scripts/install-test-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/go/bin:/usr/sbin:$PATH
SECONDS_=${1:-300}; RATE=${2:-500}; shift $(( $# < 2 ? $# : 2 ))
K=${KINE:-$PWD/target/release/kine-rs}; B=$PWD/target/release/kine-rs-bench
W=$(mktemp -d /tmp/s3takeover.XXXX)
GW=23961; P1=23962; P2=23963
mkdir -p "$W/gw/kine"
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret versitygw --port 127.0.0.1:$GW posix "$W/gw" >"$W/gw.log" 2>&1 &
PIDS=($!); disown
trap 'kill -9 "${PIDS[@]}" 2>/dev/null || true; [ -n "${KEEP:-}" ] && echo "kept $W" || rm -rf "$W"' EXIT
sleep 1
S3=(--s3-bucket kine --s3-folder takeover --s3-endpoint http://127.0.0.1:$GW --s3-access-key bench
  --s3-secret-key bench-secret --s3-lock-lease "${LEASE:-2s}" --s3-sync)
node() { # NAME PORT [FLAGS...]: starts a node, waits until it serves, sets NODE_PID
  local name=$1 port=$2; shift 2
  $K --endpoint sqlite://$W/$name.db --listen-address 127.0.0.1:$port --metrics-bind-address 127.0.0.1:0 \
    --name "$name" "${S3[@]}" "$@" >"$W/$name.log" 2>&1 &
  NODE_PID=$!; PIDS+=($NODE_PID); disown
  touch "$W/$name.log"
  for _ in $(seq 300); do grep -q "kine-rs ready" "$W/$name.log" && return; sleep 0.1; done
  cat "$W/$name.log"; exit 1
}
EXTRA=("$@")
node writer $P1 "${EXTRA[@]}"; WRITER=$NODE_PID
node standby $P2 "${EXTRA[@]}"; STANDBY=$NODE_PID
grep -q "serving a read-only copy" "$W/standby.log" || { cat "$W/standby.log"; exit 1; }
echo "== $("$K" --version | head -1); ${SECONDS_} s of $RATE writes/s (--s3-sync, lease ${LEASE:-2s}), then kill -9 of the writer ${EXTRA[*]:+(${EXTRA[*]})}"
python3 bench/exit-watch.py $WRITER >"$W/exit.txt" 2>&1 &
WATCH=$!
$B --endpoint http://127.0.0.1:$P2 --write-endpoint http://127.0.0.1:$P1 --workload failover \
  --origin-pid $WRITER --rate "$RATE" --writers 16 --seconds "$SECONDS_" --label s3-standby 2>"$W/bench.err" ||
  { echo "kine-rs-bench failed:"; grep -v "; again" "$W/bench.err" | head -5 || true; }
segments=$(ls "$W/gw/kine/takeover/wal/0000000001" 2>/dev/null | sort -n | tail -1 | sed 's/^0*//' || true)
echo "writer: ${segments:-?} segments shipped, $(grep -c "S3 checkpoint written" "$W/writer.log" || true) checkpoints"
(grep "S3 checkpoint written" "$W/writer.log" || true) | tail -1 | grep -o 'revision=[0-9]*\|parts=[0-9]*\|elapsed_ms=[0-9]*' |
  tr '\n' ' ' | sed 's/^./  last checkpoint: &/;s/ $/\n/' || true
wait $WATCH 2>/dev/null || true
echo "writer: $(cat "$W/exit.txt")"
echo "standby:"
grep -E "restored the store from S3|caught up with the S3 store|took the S3 writer lock|holds the S3 store" "$W/standby.log" |
  sed -E 's/^[^ ]+ +//; s/\x1b\[[0-9;]*m//g; s/^/  /' || true
echo "  peak RSS $(grep VmHWM /proc/$STANDBY/status | awk '{print $2/1024 " MiB"}')"
