#!/usr/bin/env bash
# python-etcd3's own test suite (0.12.0, unmodified, from its PyPI sdist; scripts/install-test-deps
# installs it) against kine-rs on 127.0.0.1:2379, on a fresh datastore, inside a private network
# namespace (some of its tests hard-code localhost:2379) and a private PID namespace (its
# serializable-read tests SIGSTOP every process whose command line has `--name pifpaf1` or
# `pifpaf2`: seeing the whole machine, a run beside another run of this script stopped that
# run's nodes, and failed when they had exited before it could resume them). On NATS,
# PostgreSQL and MariaDB, three kine-rs nodes named pifpaf0..2 serve one bucket or database (the
# suite expects pifpaf's 3-member cluster); on SQLite and memory, one node. The servers
# (nats-server, a throwaway PostgreSQL or MariaDB) run inside the namespaces too.
#
#   scripts/python-etcd3.sh [sqlite|memory|nats|postgres|mysql]
#
# Tests that need what kine-rs does not have are left out, named below with the reason
# (COMPAT.md, "Clients"). Every other test must pass. Needs root (unshare).
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${1:-sqlite}
bin=$(realpath "${KINE_RS_BIN:-target/debug/kine-rs}")
home=${PYTHON_ETCD3_HOME:-$HOME/.cache/kine-rs/python-etcd3}
[ -x "$home/venv/bin/python" ] || { echo "python-etcd3: not installed in $home (run scripts/install-test-deps)" >&2; exit 2; }
if [ "${KINE_RS_NETNS:-}" != 1 ]; then
  exec unshare --net --pid --fork --mount-proc --kill-child env KINE_RS_NETNS=1 KINE_RS_BIN="$bin" "$0" "$@"
fi
ip link set lo up
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$backend" = postgres ]; then pg_throwaway_stop; fi
  if [ "$backend" = mysql ]; then mysql_throwaway_stop; fi
  rm -rf "$work"
}
trap cleanup EXIT
case $backend in
  sqlite) endpoint="sqlite://$work/state.db" ;;
  memory) endpoint="memory://" ;;
  nats)
    "${NATS_SERVER_BIN:-$(go env GOPATH)/bin/nats-server}" -js -a 127.0.0.1 -p 4222 -sd "$work/nats" >"$work/nats.log" 2>&1 &
    pids+=($!)
    endpoint="nats://127.0.0.1:4222?noEmbed"
    ;;
  postgres)
    source scripts/pg-throwaway.sh
    pg_throwaway_start || { echo "python-etcd3: cannot start PostgreSQL" >&2; exit 1; }
    endpoint="$PG_THROWAWAY_URL/python_etcd3"
    ;;
  mysql)
    source scripts/mysql-throwaway.sh
    mysql_throwaway_start || { echo "python-etcd3: cannot start MariaDB" >&2; exit 1; }
    endpoint="$MYSQL_THROWAWAY_URL/python_etcd3"
    ;;
  *) echo "python-etcd3: unknown backend $backend" >&2; exit 2 ;;
esac
nodes=3
case $backend in sqlite | memory) nodes=1 ;; esac
for i in $(seq 0 $((nodes - 1))); do
  "$bin" --name "pifpaf$i" --endpoint "$endpoint" --listen-address "127.0.0.1:$((2379 + 2 * i))" \
    --metrics-bind-address 0 --bcrypt-cost 4 >"$work/kine-rs-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do
  etcdctl --endpoints 127.0.0.1:2379 endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
etcdctl --endpoints 127.0.0.1:2379 endpoint health >/dev/null || { cat "$work/kine-rs-0.log"; exit 1; }

t=tests/test_etcd3.py
left_out=()
if [ "$nodes" = 1 ]; then
  left_out+=(
    # Want a 3-member cluster named pifpaf0..2 (SQLite and memory serve one node): MemberList,
    # and SIGSTOP of the other members (pgrep '--name pifpaf[12]') before a serializable read.
    "$t::TestEtcd3::test_member_list"
    "$t::TestEtcd3::test_get_key_serializable"
    "$t::TestEtcd3::test_get_prefix_serializable"
  )
fi
deselect=()
for test in "${left_out[@]}"; do
  echo "python-etcd3: left out: $test"
  deselect+=(--deselect "$test")
done
cd "$home/etcd3-0.12.0"
status=0
PYTHONPATH=.:etcd3 PYTHON_ETCD_HTTP_URL=http://127.0.0.1:2379 TEST_ETCD_VERSION=v3.7.3 \
  "$home/venv/bin/python" -m pytest tests -p no:cacheprovider -q -rfE -W ignore::DeprecationWarning \
  "${deselect[@]}" || status=$?
if [ "$status" != 0 ]; then
  echo "--- kine-rs log (last 40 lines)"
  tail -40 "$work/kine-rs-0.log"
fi
exit "$status"
