#!/usr/bin/env bash
# Compaction stall on each datastore in turn (kine-rs-bench --workload compaction,
# bench/src/compaction.rs): a history of --keys keys and --superseded updates of them is
# written, then --clients writers put new keys while one physical compaction at the history's
# last revision runs; then one table (bench/summarize-compaction.py) of the compaction's time,
# the latency of the writes that overlapped it against the 2 s before, and the store's size on
# disk after it.
#
#   bench/compaction.sh [--superseded N] [--keys K] [--clients C] [SYSTEM...]
#
# Defaults: 1,000,000 superseded versions over 100,000 keys, 16 writers; systems etcd
# kine-sqlite kine-rs-sqlite kine-rs-nats-embedded kine-rs-postgres kine-rs-mysql (any of
# bench/stores.sh: etcd, kine-sqlite, kine-nats-embedded, kine-rs-sqlite, kine-rs-nats-embedded,
# kine-rs-nats, kine-rs-nats-cluster, kine-rs-postgres, kine-rs-mysql). Each system starts
# afresh, alone on the machine; a compaction not done within 1800 s counts as unfinished.
# The server CPU and memory reported are those of the system's first process (for
# kine-rs-postgres and kine-rs-mysql the database server's, for kine-rs-nats nats-server's).
#
# Needs: target/release/kine-rs-bench (cargo build --release -p kine-rs-bench), and
# target/release/kine-rs for the kine-rs systems; etcd-3.7 and nats-server in
# $(go env GOPATH)/bin (scripts/install-test-deps); Go kine (installed with `go install` when
# missing); etcdctl; Debian's postgresql and mariadb-server for those systems. No
# kube-apiserver. Output: target/bench/compaction-<time>/runs.log (the report lines and each
# store's size), summary.md, every server's log and the bench's progress (SYSTEM-bench.log).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
superseded=1000000 keys=100000 clients=16
systems=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --superseded) superseded=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compaction.sh: unknown option $1" >&2; exit 2 ;;
    *) systems+=("$1"); shift ;;
    esac
done
for n in "$superseded" "$keys" "$clients"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "compaction.sh: --superseded, --keys and --clients take numbers ≥ 1" >&2; exit 2; }
done
source bench/stores.sh
[[ ${#systems[@]} -gt 0 ]] || systems=(etcd kine-sqlite kine-rs-sqlite kine-rs-nats-embedded kine-rs-postgres kine-rs-mysql)
check_binaries --no-apiserver "${systems[@]}"
bench=target/release/kine-rs-bench
[[ -x $bench ]] || stores_die "$bench not found: cargo build --release -p kine-rs-bench"
command -v etcdctl >/dev/null || stores_die "etcdctl not found (Debian: apt-get install etcd-client)"

stores_begin compaction
say "# $(date -u +%FT%TZ) bench/compaction.sh --superseded $superseded --keys $keys --clients $clients ${systems[*]}; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
versions=$(stores_versions)
say "# ${versions#kube-apiserver *; }; Go kine $gokine_version"
for system in "${systems[@]}"; do
    dir=$work/$system
    mkdir -p "$dir"
    start_store "$system" "$dir"
    url=${store_urls%%,*} pid=${store_pids%%,*}
    if wait_store "$system" "$url"; then
        # The report line (stdout) is printed even when the compaction failed or did not finish;
        # the progress (stderr) goes to the terminal and the bench's log.
        if line=$({ "$bench" --endpoint "$url" --label "$system" --workload compaction --keys "$keys" \
            --events "$superseded" --clients "$clients" --seconds 1800 --server-pid "$pid" \
            2>&1 1>&3 | tee "$out/$system-bench.log" >&2; } 3>&1); then
            say "$line"
        else
            [[ -z $line ]] || say "$line"
            say "# FAILED: $system: $(grep -m1 '^Error' "$out/$system-bench.log" || echo "kine-rs-bench failed") (log: $out/$system-bench.log)"
        fi
        say "disk label=$system bytes=$(du -sb "$store_dir" | cut -f1)"
    fi
    stop_store "$system"
    rm -rf "$dir"
done
python3 bench/summarize-compaction.py "$runs" >"$out/summary.md"
say "$(cat "$out/summary.md")"
echo "compaction.sh: report lines in $runs, the table in $out/summary.md"
