#!/usr/bin/env bash
# Side by side in one run on loopback (issue 12): etcd 3.6, Go kine and kine-rs, the same
# workloads, the systems alternating within each round; a table of medians with ratios against
# etcd and against Go kine on the same backend (bench/summarize.py).
#
#   bench/compare.sh [seconds-per-run] [rounds]        (defaults: 5 s, 3 rounds)
#
# To measure a part only: COMPARE_SYSTEMS="etcd kine-postgres kine-rs-postgres" starts only the
# systems named (labels below), COMPARE_WORKLOADS=REGEX runs only the workloads whose arguments
# match (grep -E), e.g. COMPARE_WORKLOADS='progress|get --clients 1 '.
#
# Systems (label, client port):
#   etcd              23800  etcd 3.6: $(go env GOPATH)/bin/etcd-3.6 (scripts/install-test-deps builds it)
#   kine-sqlite       23801  Go kine v0.17.5 on SQLite: its default database, ./db/state.db of a temp dir
#   kine-nats         23802  Go kine on NATS JetStream: the shared nats-server, bucket gokine
#   kine-postgres     23803  Go kine on PostgreSQL: the shared throwaway server, database gokine
#   kine-mysql        23804  Go kine on MariaDB: the shared throwaway server, database gokine
#   kine-nats-embedded 23805 Go kine on its embedded NATS server (nats://?dataDir=, in the
#                            process, its own store)
#   kine-rs-sqlite    23811  kine-rs (target/release/kine-rs) on SQLite, a temp file
#   kine-rs-nats      23812  kine-rs on the same nats-server, bucket kiners
#   kine-rs-postgres  23813  kine-rs on the same PostgreSQL, database kiners
#   kine-rs-mysql     23814  kine-rs on the same MariaDB, database kiners
#   kine-rs-nats-embedded 23815 kine-rs on its embedded NATS server (nats://?dataDir=), the
#                            default a `nats://` endpoint gets
# One nats-server (-js, port 23820) and throwaway PostgreSQL and MariaDB servers
# (scripts/pg-throwaway.sh, scripts/mysql-throwaway.sh) serve both kines.
#
# Durability: what is on disk when a write is acknowledged (every system at its defaults):
#   etcd              its WAL, fsynced per commit (a batch of raft entries).
#   kine-rs, SQLite   WAL journal, synchronous=FULL: fsync per commit (a commit groups the
#                     writes queued meanwhile).
#   Go kine, SQLite   its default DSN: _journal_mode=WAL&_synchronous=NORMAL: no fsync per
#                     commit, only at WAL checkpoints. An acknowledged write survives a crash of
#                     kine but not a power loss: less than the others, and what its users get.
#   NATS (both)       JetStream's default: the stream's files are fsynced every 2 minutes
#                     (sync_interval); an acknowledged write is in the server's files.
#   PostgreSQL        fsync=on, synchronous_commit=on (defaults): WAL fsynced per commit.
#   MariaDB           innodb_flush_log_at_trx_commit=1: redo log fsynced per commit.
# Nothing compacts during the run (etcd, Go kine and kine-rs all leave it to the client), and
# the kines' Prometheus listeners are off (--metrics-bind-address 0).
#
# Server CPU and RSS are those of the process serving the etcd API; for the NATS, PostgreSQL
# and MariaDB rows the datastore's own CPU and memory are not counted (for etcd, SQLite and
# the embedded NATS servers they are, in-process).
#
# Needs: target/release/kine-rs and target/release/kine-rs-bench (cargo build --release -p
# kine-rs -p kine-rs-bench); etcd-3.6 and nats-server in $(go env GOPATH)/bin
# (scripts/install-test-deps); Debian's postgresql and mariadb-server; Go kine (installed with
# `go install` when missing). Output: report lines in target/bench/compare-<time>/runs.log
# (server logs next to it), then the tables, also in summary.md there, and the charts
# (bench/charts.py: etcd-api-*.svg) next to them. Exits 2 if a kine-rs run failed; a failed run
# of etcd or Go kine is reported (a # FAILED line, a closing message) and is one of the results.
set -euo pipefail
cd "$(dirname "$0")/.."
# A run with no successful operation reports so on stderr; a backtrace adds nothing there.
export RUST_BACKTRACE=0
seconds=${1:-5}
rounds=${2:-3}
keys=10000
gokine_version=v0.17.5

die() {
    echo "compare.sh: $*" >&2
    exit 2
}
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
etcd=${ETCD_BIN:-$gobin/etcd-3.6}
nats=${NATS_SERVER_BIN:-$gobin/nats-server}
gokine=$gobin/kine
kine_rs=target/release/kine-rs
bench=target/release/kine-rs-bench
for b in "$kine_rs" "$bench"; do
    [[ -x $b ]] || die "$b not found: cargo build --release -p kine-rs -p kine-rs-bench"
done
[[ -x $etcd ]] || die "etcd 3.6 not found at $etcd: run scripts/install-test-deps (it builds it from tools/etcd) or set ETCD_BIN"
[[ -x $nats ]] || die "nats-server not found at $nats: run scripts/install-test-deps or set NATS_SERVER_BIN"
if [[ ! -x $gokine ]]; then
    command -v go >/dev/null || die "Go kine not found at $gokine, and no go to install it with"
    echo "compare.sh: go install -tags nats github.com/k3s-io/kine@$gokine_version" >&2
    go install -tags nats "github.com/k3s-io/kine@$gokine_version"
    [[ -x $gokine ]] || die "Go kine not found at $gokine after go install"
fi

out=target/bench/compare-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
runs=$out/runs.log
data=$(mktemp -d /tmp/kine-rs-compare.XXXXXX)
source scripts/pg-throwaway.sh
source scripts/mysql-throwaway.sh
source bench/lib.sh
pids=()
cleanup() {
    if [[ ${#pids[@]} -gt 0 ]]; then
        kill "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
    pg_throwaway_stop || true
    mysql_throwaway_stop || true
    rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A line for the log and the terminal.
say() { echo "$*" | tee -a "$runs"; }

systems=() # "label port pid"
# start LABEL PORT COMMAND...: runs a server in the background, its output in $out/LABEL.log.
start() {
    local label=$1 port=$2
    shift 2
    if [[ -n ${COMPARE_SYSTEMS:-} && " $COMPARE_SYSTEMS " != *" $label "* ]]; then
        return 0
    fi
    "$@" >"$out/$label.log" 2>&1 &
    pids+=($!)
    systems+=("$label $port $!")
}

# A field of the process's /proc status (kB), in MiB.
status_mib() { awk -v f="$2:" '$1 == f {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

"$nats" -a 127.0.0.1 -p 23820 -js -sd "$data/nats" >"$out/nats-server.log" 2>&1 &
pids+=($!)
pg_throwaway_start
mysql_throwaway_start
pg=$PG_THROWAWAY_URL
my=$MYSQL_THROWAWAY_URL
nats_url=nats://127.0.0.1:23820?noEmbed
mkdir -p "$data/etcd" "$data/kine-sqlite" "$data/kine-rs-sqlite"

# An 8 GiB quota: nothing compacts, and a long run would reach the default 2 GiB, where etcd
# refuses writes (NOSPACE alarm).
start etcd 23800 "$etcd" --name default --data-dir "$data/etcd" --log-level warn \
    --listen-client-urls http://127.0.0.1:23800 --advertise-client-urls http://127.0.0.1:23800 \
    --listen-peer-urls http://127.0.0.1:23880 --initial-advertise-peer-urls http://127.0.0.1:23880 \
    --initial-cluster default=http://127.0.0.1:23880 --quota-backend-bytes 8589934592
# No --endpoint: Go kine's own default database and DSN, in the temp dir.
start kine-sqlite 23801 env -C "$data/kine-sqlite" "$gokine" --listen-address 127.0.0.1:23801 --metrics-bind-address 0
start kine-nats 23802 "$gokine" --listen-address 127.0.0.1:23802 --metrics-bind-address 0 --endpoint "$nats_url&bucket=gokine"
start kine-postgres 23803 "$gokine" --listen-address 127.0.0.1:23803 --metrics-bind-address 0 \
    --endpoint "$pg/gokine?sslmode=disable"
start kine-mysql 23804 "$gokine" --listen-address 127.0.0.1:23804 --metrics-bind-address 0 --endpoint "$my/gokine"
start kine-nats-embedded 23805 "$gokine" --listen-address 127.0.0.1:23805 --metrics-bind-address 0 \
    --endpoint "nats://?dataDir=$data/kine-nats-embedded"
start kine-rs-sqlite 23811 "$kine_rs" --listen-address 127.0.0.1:23811 --metrics-bind-address 0 \
    --endpoint "sqlite://$data/kine-rs-sqlite/state.db"
start kine-rs-nats 23812 "$kine_rs" --listen-address 127.0.0.1:23812 --metrics-bind-address 0 --endpoint "$nats_url&bucket=kiners"
start kine-rs-postgres 23813 "$kine_rs" --listen-address 127.0.0.1:23813 --metrics-bind-address 0 \
    --endpoint "$pg/kiners?sslmode=disable"
start kine-rs-mysql 23814 "$kine_rs" --listen-address 127.0.0.1:23814 --metrics-bind-address 0 --endpoint "$my/kiners"
start kine-rs-nats-embedded 23815 "$kine_rs" --listen-address 127.0.0.1:23815 --metrics-bind-address 0 \
    --endpoint "nats://?dataDir=$data/kine-rs-nats-embedded"

# Ready = a first key written (etcd may listen before it has a leader); then the preload of
# both shapes, then the idle memory.
for s in "${systems[@]}"; do
    read -r label port pid <<<"$s"
    wait_serving "$label" "http://127.0.0.1:$port" "$pid" "$out/$label.log"
    for shape in flat k8s; do
        "$bench" --endpoint "http://127.0.0.1:$port" --workload load --shape $shape --keys $keys
    done
done
sleep 2

say "# $(date -u +%FT%TZ) bench/compare.sh $seconds $rounds; $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) RAM, $(lscpu | sed -n 's/^Model name: *//p'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "# etcd $("$etcd" --version | awk '/etcd Version/ {print $3}'); Go kine $(go version -m "$gokine" | awk '$1 == "mod" {print $3}'); nats-server $("$nats" --version | awk '{print $2}'); PostgreSQL $PG_THROWAWAY_VERSION; MariaDB $MYSQL_THROWAWAY_VERSION; kine-rs $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.lock || echo ' (working tree with uncommitted changes)'), binary of $(date -u -r "$kine_rs" +%FT%TZ)"
for s in "${systems[@]}"; do
    read -r label port pid <<<"$s"
    # RssAnon leaves out mapped files (etcd's bbolt file, kine-rs's SQLite file).
    say "idle label=$label rss_mib=$(status_mib "$pid" VmRSS) anon_mib=$(status_mib "$pid" RssAnon)"
done

workloads=(
    "--workload put --clients 1"
    "--workload put --clients 16"
    "--workload put --clients 256"
    "--workload get --clients 1 --keys $keys"
    "--workload get --clients 16 --keys $keys"
    "--workload get --clients 256 --keys $keys"
    "--workload create --shape k8s --clients 16"
    "--workload create --clients 16"
    "--workload create --clients 64"
    "--workload cas --shape k8s --clients 16 --keys $keys"
    "--workload delete --shape k8s --clients 16 --keys 10000"
    "--workload list --shape k8s --clients 1 --keys $keys --limit 500"
    "--workload list --shape k8s --clients 16 --keys $keys --limit 500"
    "--workload count --shape k8s --clients 1 --keys $keys"
    "--workload watch --watchers 1000 --clients 10 --rate 200"
    "--workload replay --events 100000 --keys 1000"
    "--workload progress --clients 16"
)
if [[ -n ${COMPARE_WORKLOADS:-} ]]; then
    chosen=()
    for w in "${workloads[@]}"; do
        if grep -Eq -- "$COMPARE_WORKLOADS" <<<"$w"; then chosen+=("$w"); fi
    done
    [[ ${#chosen[@]} -gt 0 ]] || die "COMPARE_WORKLOADS=$COMPARE_WORKLOADS matches no workload"
    workloads=("${chosen[@]}")
fi
failed=0 peer_failed=0
for round in $(seq "$rounds"); do
    started=$SECONDS
    for w in "${workloads[@]}"; do
        for s in "${systems[@]}"; do
            read -r label port pid <<<"$s"
            # A run that printed its report line counts (its errors are in the table); one
            # that did not (a crash, a refused connection) is a failure. $w is a list of
            # arguments.
            # shellcheck disable=SC2086
            line=$("$bench" --endpoint "http://127.0.0.1:$port" --label "$label" --seconds "$seconds" \
                --server-pid "$pid" $w) || true
            if [[ $line == label=* ]]; then
                say "$line"
            else
                say "# FAILED: $label $w"
                if [[ $label == kine-rs* ]]; then failed=$((failed + 1)); else peer_failed=$((peer_failed + 1)); fi
            fi
        done
    done
    for s in "${systems[@]}"; do
        read -r label port pid <<<"$s"
        kill -0 "$pid" 2>/dev/null || die "$label died during round $round (log: $out/$label.log)"
    done
    # The load average, to spot other work on the machine (this run alone keeps it at 3–5).
    say "# round $round of $rounds took $((SECONDS - started)) s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo
bench/summarize.py --baseline etcd \
    --pair kine-rs-sqlite=kine-sqlite,kine-rs-nats=kine-nats,kine-rs-postgres=kine-postgres,kine-rs-mysql=kine-mysql,kine-rs-nats-embedded=kine-nats-embedded \
    <"$runs" | tee "$out/summary.md"
python3 bench/charts.py etcd-api "$runs" "$out"
echo
echo "compare.sh: report lines in $runs, tables in $out/summary.md, charts (SVG) in $out"
# A peer's failure is one of the results (Go kine fails every watch replay); kine-rs's is not.
[[ $peer_failed == 0 ]] || echo "compare.sh: $peer_failed run(s) of etcd or Go kine failed (# FAILED lines in $runs)"
[[ $failed == 0 ]] || die "$failed run(s) of kine-rs failed (# FAILED lines in $runs)"
