#!/usr/bin/env bash
# A/B of two kine-rs builds on a replicated bucket: a 3-node nats-server cluster on loopback,
# each build on a bucket of its own (replicas=3) through server n0, both buckets' stream leaders
# placed on $LEADER (n1 by default: reads ask a leader on another server; n0: on the connected
# one), then linearizable gets at 1, 16 and 64 clients and CAS updates at 16, the builds
# alternating within each round (docs/benchmarks-history.md).
#
#   A=old/kine-rs B=target/release/kine-rs bench/nats-cluster-ab.sh [seconds] [rounds]
#
# Needs target/release/kine-rs-bench and nats-server (scripts/install-test-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${A:?the first build: A=path/to/kine-rs}
B=${B:-target/release/kine-rs}
LEADER=${LEADER:-n1}
bench=$PWD/target/release/kine-rs-bench
secs=${1:-6}
rounds=${2:-2}
export PATH="$PATH:$(go env GOPATH 2>/dev/null)/bin"
dir=$(mktemp -d /tmp/kine-rs-nats-ab.XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
routes='"nats-route://127.0.0.1:24330","nats-route://127.0.0.1:24331","nats-route://127.0.0.1:24332"'
for i in 0 1 2; do
  cat >"$dir/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$((24320 + i))
jetstream { store_dir: "$dir/js$i" }
cluster { name: ab, listen: 127.0.0.1:$((24330 + i)), routes: [$routes] }
CONF
  nats-server -c "$dir/n$i.conf" >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
sleep 4
"$A" --listen-address 127.0.0.1:23901 --metrics-bind-address 0 \
  --endpoint 'nats://127.0.0.1:24320?noEmbed&bucket=a&replicas=3' >"$dir/a.log" 2>&1 &
pids+=($!)
"$B" --listen-address 127.0.0.1:23902 --metrics-bind-address 0 \
  --endpoint 'nats://127.0.0.1:24320?noEmbed&bucket=b&replicas=3' >"$dir/b.log" 2>&1 &
pids+=($!)
sleep 6
# Moves a stream's leader with a stepdown naming the preferred server, over a raw NATS
# connection, until STREAM.INFO names it.
place() {
  python3 - "$1" "$LEADER" <<'PY'
import json, socket, sys, time
stream, leader = sys.argv[1], sys.argv[2]
s = socket.create_connection(("127.0.0.1", 24320)); f = s.makefile("rb")
f.readline(); s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.ab 1\r\n')
def request(subject, payload=b""):
    s.sendall(b"PUB %s _INBOX.ab %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
    while True:
        line = f.readline()
        if line.startswith(b"PING"): s.sendall(b"PONG\r\n")
        if line.startswith(b"MSG "):
            body = f.read(int(line.split()[-1]) + 2)[:-2]
            return json.loads(body)
for _ in range(40):
    if request("$JS.API.STREAM.INFO." + stream).get("cluster", {}).get("leader") == leader:
        sys.exit(0)
    request("$JS.API.STREAM.LEADER.STEPDOWN." + stream, json.dumps({"placement": {"preferred": leader}}).encode())
    time.sleep(0.5)
sys.exit(f"{stream}: could not move its leader to {leader}")
PY
}
place KV_a
place KV_b
for port in 23901 23902; do "$bench" --endpoint "http://127.0.0.1:$port" --workload load --keys 10000 --clients 32 >/dev/null; done
echo "# $(date -u +%FT%TZ) $(nproc) cores; nats-server $(nats-server --version | awk '{print $2}'); leaders on $LEADER, kine-rs through n0; A=$A B=$B"
for round in $(seq "$rounds"); do
  for w in "get 1" "get 16" "get 64" "cas 16"; do
    set -- $w
    for sys in "A 23901" "B 23902"; do
      set -- $w $sys
      echo "round=$round system=$3 $("$bench" --endpoint "http://127.0.0.1:$4" --workload "$1" --clients "$2" --keys 10000 --seconds "$secs")"
    done
  done
done
