#!/bin/bash
# S3 durability of the SQLite datastore against a local versitygw (docs/BENCHMARKS.md, "S3
# durability"):
#  1. writes with shipping off, on (--s3-ship-interval 1s) and with --s3-sync: creates (the
#     kube-apiserver Txn) of 256-byte values at 1 and 16 clients, 10 s each, with the S3
#     requests and bytes they cost per 1,000 writes (versitygw's request log; object sizes);
#  2. restore time (`kine-rs s3-restore`) of 100,000 Kubernetes-shaped pods (1-4 KiB) and of
#     1,000,000 256-byte keys: from the WAL segments alone, then from a checkpoint.
# Needs release builds of kine-rs and kine-rs-bench, versitygw (scripts/install-test-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/go/bin:/usr/sbin:$PATH
K=$PWD/target/release/kine-rs; B=$PWD/target/release/kine-rs-bench
W=$(mktemp -d /tmp/s3bench.XXXX)
PORT=23950; GW=23951
mkdir -p "$W/gw/kine"
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret versitygw --port 127.0.0.1:$GW posix "$W/gw" >"$W/gw.log" 2>&1 &
GWPID=$!
trap 'kill $GWPID 2>/dev/null || true; pkill -f "listen-address 127.0.0.1:$PORT" || true; rm -rf "$W"' EXIT
sleep 1
s3() { echo --s3-bucket kine --s3-folder "$1" --s3-endpoint http://127.0.0.1:$GW --s3-access-key bench --s3-secret-key bench-secret; }
serve() { # DB LOG ARGS...
  local db=$1 log=$2; shift 2
  $K --endpoint sqlite://$db --listen-address 127.0.0.1:$PORT --metrics-bind-address 127.0.0.1:0 "$@" >"$log" 2>&1 &
  for _ in $(seq 100); do grep -q "kine-rs ready" "$log" && return; sleep 0.1; done
  cat "$log"; exit 1
}
stop() { pkill -TERM -f "listen-address 127.0.0.1:$PORT"; while pgrep -f "listen-address 127.0.0.1:$PORT" >/dev/null; do sleep 0.1; done; }
requests() { wc -l <"$W/gw.log"; }
bytes_under() { du -sb --apparent-size "$W/gw/kine/$1" 2>/dev/null | cut -f1 || echo 0; }

echo "== writes (creates, 256 B values, 10 s per run)"
for mode in off async sync; do
  for clients in 1 16; do
    folder="w-$mode-$clients"; args=()
    case $mode in async) args=($(s3 $folder));; sync) args=($(s3 $folder) --s3-sync);; esac
    serve "$W/$folder.db" "$W/$folder.log" "${args[@]}"
    r0=$(requests)
    line=$($B --endpoint http://127.0.0.1:$PORT --workload create --clients $clients --seconds 10)
    stop
    r1=$(requests)
    ops=$(echo "$line" | grep -o ' ops=[0-9]*' | cut -d= -f2)
    echo "$mode clients=$clients $(echo "$line" | grep -o 'ops_per_s=[0-9.]*\|p50_ms=[0-9.]*\|p99_ms=[0-9.]*' | tr '\n' ' ')"
    if [ "$mode" != off ]; then
      echo "  S3 per 1000 writes: $(echo "scale=1; ($r1 - $r0) * 1000 / $ops" | bc) requests, $(echo "scale=0; $(bytes_under $folder) * 1000 / $ops / 1024" | bc) KiB stored"
    fi
  done
done

restore() { # FOLDER LABEL
  local t=$W/restored-$RANDOM.db s e
  s=$(date +%s.%N)
  $K --endpoint sqlite://$t $(s3 $1) s3-restore 2>&1 | grep -o 'revision=[0-9]*\|checkpoint=[A-Za-z0-9()]*\|segments=[0-9]*\|versions=[0-9]*' | tr '\n' ' '
  e=$(date +%s.%N); echo "-> $2: $(echo "$e - $s" | bc) s"
  rm -f "$t" "$t-wal" "$t-shm"
}

echo "== restore"
for shape in "k8s 100000" "flat 1000000"; do
  set -- $shape
  folder="r-$1-$2"
  serve "$W/$folder.db" "$W/$folder.log" $(s3 $folder)
  s=$(date +%s.%N)
  $B --endpoint http://127.0.0.1:$PORT --workload load --keys $2 --clients 16 --shape $1 >/dev/null
  e=$(date +%s.%N); echo "loaded $2 $1 keys with shipping on: $(echo "$e - $s" | bc) s"
  stop
  restore $folder "$2 $1 keys, from the segments"
  # A checkpoint: serve again with a short interval until one is written.
  serve "$W/$folder.db" "$W/$folder.log" $(s3 $folder) --s3-checkpoint-interval 1s
  for _ in $(seq 600); do grep -q "S3 checkpoint written" "$W/$folder.log" && break; sleep 0.5; done
  grep "S3 checkpoint written" "$W/$folder.log" | grep -o 'parts=[0-9]* elapsed_ms=[0-9]*' | sed 's/^/checkpoint written: /'
  stop
  restore $folder "$2 $1 keys, from the checkpoint"
done
