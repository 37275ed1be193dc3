#!/usr/bin/env bash
# How each datastore's cost grows with the size of the store (issue 43, item 2): Kubernetes-
# shaped keys (/registry/pods/<ns>/<name>) loaded step by step up to each size of a ladder, and
# at every step, 16 clients for --seconds each: gets, list pages (limit 500), creates, updates
# (get + conditional update: each step adds history), then one client reading the whole list in
# pages of 500 at the first page's revision (kube-apiserver's paginated list) and through
# RangeStream (both up to 1,000,000 keys), and a watch catching up on 10,000 events from an old
# revision; the resident
# memory and the size on disk. After the last step: the time from a restart to serving, then a
# physical compaction at the current revision and a defragmentation, timed, and the disk after
# (resident memory: with and without the pages of mapped files, as etcd and kine-rs on SQLite
# map their database files).
# A system that fails a step (etcd past its 2 GiB quota: `mvcc: database space exceeded`) is
# reported at the step where it stopped; the ladder goes on with the others.
#
#   bench/store-size.sh [--sizes N,N,...] [--value-bytes B] [--seconds S] [SYSTEM...]
#
# Defaults: sizes 10000,100000,1000000; values of 1-4 KiB (--value-bytes fixes their size:
# 10,000,000 keys of 1-4 KiB are 25 GB per system, of 256 bytes 2.5 GB); 5 s per workload;
# systems etcd kine-rs-sqlite kine-rs-nats-embedded kine-rs-postgres (any of bench/stores.sh).
# Each system starts afresh and runs alone on the machine.
#
# Needs what bench/compaction.sh needs. Output: target/bench/store-size-<time>/runs.log (the
# report lines, `size`, `restart` and `compact` lines), summary.md (bench/summarize-store-size.py)
# and every server's log.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0
sizes=10000,100000,1000000 value_bytes="" seconds=5
systems=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --value-bytes) value_bytes=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "store-size.sh: unknown option $1" >&2; exit 2 ;;
    *) systems+=("$1"); shift ;;
    esac
done
[[ $sizes =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "store-size.sh: --sizes takes numbers ≥ 1, comma separated" >&2; exit 2; }
[[ -z $value_bytes || $value_bytes =~ ^[1-9][0-9]*$ ]] || { echo "store-size.sh: --value-bytes takes a number ≥ 1" >&2; exit 2; }
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "store-size.sh: --seconds takes a number ≥ 1" >&2; exit 2; }
IFS=, read -ra ladder <<<"$sizes"
sorted=$(printf '%s\n' "${ladder[@]}" | sort -n | paste -sd,)
[[ $sorted == "$sizes" ]] || { echo "store-size.sh: --sizes must grow ($sizes)" >&2; exit 2; }
source bench/stores.sh
[[ ${#systems[@]} -gt 0 ]] || systems=(etcd kine-rs-sqlite kine-rs-nats-embedded kine-rs-postgres)
check_binaries --no-apiserver "${systems[@]}"
bench=target/release/kine-rs-bench
[[ -x $bench ]] || stores_die "$bench not found: cargo build --release -p kine-rs-bench"
command -v etcdctl >/dev/null || stores_die "etcdctl not found (Debian: apt-get install etcd-client)"
shape=(--shape k8s ${value_bytes:+--value-bytes $value_bytes})

# since T0: seconds since the `date +%s.%N` T0.
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.2f", t1 - t0}'; }

# rss PID NAME: NAME_rss_mib (resident, the mapped database files' cached pages included) and
# NAME_anon_mib (the process's own memory) of the process.
rss() {
    awk -v n="$2" '/^VmRSS:/ {r = $2} /^RssAnon:/ {a = $2} END {printf "%s_rss_mib=%.1f %s_anon_mib=%.1f", n, r / 1024, n, a / 1024}' "/proc/$1/status" 2>/dev/null || echo "$2_rss_mib=nan"
}

# revision URL: the store's current revision.
revision() {
    etcdctl --endpoints "$1" --command-timeout 60s endpoint status -w json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])'
}

# step SYSTEM URL PID KEYS WORKLOAD [ARG...]: one kine-rs-bench run at a store of KEYS keys;
# its report line to $runs. Fails (with a FAILED line) when the run does.
step() {
    local system=$1 url=$2 pid=$3 keys=$4 workload=$5 line
    shift 5
    if line=$({ "$bench" --endpoint "$url" --label "$system" --workload "$workload" --server-pid "$pid" "$@" \
        2>&1 1>&3 | tee -a "$out/$system-bench.log" >&2; } 3>&1); then
        say "$line"
    else
        [[ -z $line ]] || say "$line"
        say "# FAILED: $system at $keys keys, $workload: $(grep -i '^error' "$out/$system-bench.log" | tail -1 || true) (log: $out/$system-bench.log)"
        return 1
    fi
}

# ladder SYSTEM URL PID: every size in turn; stops at the first step that fails.
ladder() {
    local system=$1 url=$2 pid=$3 keys t0 load_s w
    for keys in "${ladder[@]}"; do
        t0=$(date +%s.%N)
        "$bench" --endpoint "$url" --workload load --keys "$keys" "${shape[@]}" >>"$out/$system-bench.log" 2>&1 || {
            say "# FAILED: $system loading $keys keys: $(grep -i '^error' "$out/$system-bench.log" | tail -1 || true) (log: $out/$system-bench.log)"
            return 1
        }
        load_s=$(since "$t0")
        say "size label=$system keys=$keys load_s=$load_s revision=$(revision "$url") disk_bytes=$(du -sb "$store_dir" | cut -f1) $(rss_fields)"
        for w in get list create cas; do
            step "$system" "$url" "$pid" "$keys" "$w" --keys "$keys" "${shape[@]}" --clients 16 --seconds "$seconds" || return 1
        done
        if [[ $keys -le 1000000 ]]; then
            for w in list-all stream-all; do
                step "$system" "$url" "$pid" "$keys" "$w" --keys "$keys" "${shape[@]}" --clients 1 --seconds "$seconds" || return 1
            done
        fi
        # The catch-up's own 1,000 keys (flat, /bench/r/...) are outside the pods' prefix.
        step "$system" "$url" "$pid" "$keys" replay --events 10000 --keys 1000 --seconds "$seconds" || return 1
    done
}

# rss_fields: the memory of the store's process (etcd, Go kine, kine-rs, or PostgreSQL's or
# MariaDB's server) and of kine-rs on those.
rss_fields() {
    local first=${store_pids%%,*} last=${store_pids##*,}
    rss "$first" store
    [[ $last == "$first" ]] || { echo -n " "; rss "$last" kine_rs; }
}

stores_begin store-size
say "# $(date -u +%FT%TZ) bench/store-size.sh --sizes $sizes${value_bytes:+ --value-bytes $value_bytes} --seconds $seconds ${systems[*]}; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
versions=$(stores_versions)
say "# ${versions#kube-apiserver *; }; Go kine $gokine_version"
for system in "${systems[@]}"; do
    dir=$work/$system
    mkdir -p "$dir"
    start_store "$system" "$dir"
    url=${store_urls%%,*}
    # kine-rs's process on PostgreSQL and MariaDB (the database's CPU is in its backends).
    if wait_store "$system" "$url" && ladder "$system" "$url" "${store_pids##*,}"; then
        t0=$(date +%s.%N)
        restart_store "$system" "$dir"
        if wait_store "$system" "$url"; then
            say "restart label=$system keys=${ladder[-1]} serving_s=$(since "$t0") $(rss_fields)"
            rev=$(revision "$url") before=$(du -sb "$store_dir" | cut -f1)
            t0=$(date +%s.%N)
            if etcdctl --endpoints "$url" --command-timeout 3600s compact "$rev" --physical >>"$out/$system-bench.log" 2>&1; then
                compact_s=$(since "$t0") after=$(du -sb "$store_dir" | cut -f1)
                t0=$(date +%s.%N)
                etcdctl --endpoints "$url" --command-timeout 3600s defrag >>"$out/$system-bench.log" 2>&1 || say "# FAILED: $system defrag (log: $out/$system-bench.log)"
                say "compact label=$system keys=${ladder[-1]} revision=$rev compact_s=$compact_s defrag_s=$(since "$t0") disk_before_bytes=$before disk_compacted_bytes=$after disk_defragmented_bytes=$(du -sb "$store_dir" | cut -f1)"
            else
                say "# FAILED: $system compact at $rev (log: $out/$system-bench.log)"
            fi
        fi
    fi
    stop_store "$system"
    rm -rf "$dir"
done
python3 bench/summarize-store-size.py "$runs" >"$out/summary.md"
say "$(cat "$out/summary.md")"
echo "store-size.sh: report lines in $runs, the tables in $out/summary.md"
