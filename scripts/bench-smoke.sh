#!/usr/bin/env bash
# Smoke test of the load generator (CI; a few seconds): starts kine-rs on a temporary SQLite
# file and runs kine-rs-bench once per workload and shape for 1 s with small key counts. Fails
# unless every run prints a report line with ops > 0 and errors=0. It proves that the tool
# produces numbers, not what the numbers are (bench/compare.sh measures).
#
# Environment:
#   KINE_RS_BIN        the kine-rs binary (default: target/debug/kine-rs)
#   KINE_RS_BENCH_BIN  the bench binary (default: target/debug/kine-rs-bench, built by
#                      `cargo test --workspace` or `cargo build -p kine-rs-bench`)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KINE_RS_BIN:-target/debug/kine-rs}
bench=${KINE_RS_BENCH_BIN:-target/debug/kine-rs-bench}

die() {
    echo "bench-smoke: error: $*" >&2
    exit 2
}
[[ -x $bin ]] || die "kine-rs binary not found at '$bin' (cargo build -p kine-rs, or set KINE_RS_BIN)"
[[ -x $bench ]] || die "kine-rs-bench binary not found at '$bench' (cargo build -p kine-rs-bench, or set KINE_RS_BENCH_BIN)"

dir=$(mktemp -d "${TMPDIR:-/tmp}/kine-rs-bench-smoke.XXXXXX")
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

# Port 0: kine-rs picks a free port and names it in its ready line.
"$bin" --listen-address 127.0.0.1:0 --metrics-bind-address 0 --endpoint "sqlite://$dir/state.db" >"$dir/kine-rs.log" 2>&1 &
pid=$!
endpoint=
for _ in $(seq 200); do
    endpoint=$(grep -o 'etcd clients connect to http://[0-9.]*:[0-9]*' "$dir/kine-rs.log" | sed 's/.* //') || true
    [[ -n $endpoint ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -z $endpoint ]]; then
    cat "$dir/kine-rs.log" >&2
    die "kine-rs did not become ready"
fi

failed=0
# One run: the arguments after the common ones; the report line must show ops > 0, errors=0.
run() {
    local line ops errors
    if ! line=$("$bench" --endpoint "$endpoint" --server-pid "$pid" --seconds 1 "$@"); then
        echo "not ok - $* (exit status; output: $line)"
        failed=$((failed + 1))
        return
    fi
    ops=$(tr ' ' '\n' <<<"$line" | sed -n 's/^ops=//p')
    errors=$(tr ' ' '\n' <<<"$line" | sed -n 's/^errors=//p')
    # A run with slow connections: they, too, got every event once they read.
    slow_events=$(tr ' ' '\n' <<<"$line" | sed -n 's/^slow_events=//p')
    slow_missed=$(tr ' ' '\n' <<<"$line" | sed -n 's/^slow_missed=//p')
    if [[ $* == *--slow-clients* && ! ($slow_events =~ ^[0-9]+$ && $slow_events -gt 0 && $slow_missed == 0) ]]; then
        errors="slow connections: $slow_events delivered, $slow_missed missed"
    fi
    if [[ $ops =~ ^[0-9]+$ && $ops -gt 0 && $errors == 0 ]]; then
        echo "ok - $line"
    else
        echo "not ok - $* ($line)"
        failed=$((failed + 1))
    fi
}

run --workload put --clients 2
for shape in flat k8s; do
    run --workload create --shape $shape --clients 2
    run --workload get --shape $shape --clients 2 --keys 200
    run --workload cas --shape $shape --clients 2 --keys 200
    run --workload delete --shape $shape --clients 2 --keys 200
    run --workload list --shape $shape --clients 2 --keys 200 --limit 50
    run --workload count --shape $shape --keys 200
done
run --workload progress --clients 2
run --workload watch --watchers 10 --clients 2 --rate 100
run --workload watch --watch-on key --watchers 20 --clients 4 --rate 100 --writers 2
run --workload watch --watchers 10 --clients 3 --rate 100 --slow-clients 1
# Bad input gets an error, not a run.
if "$bench" --endpoint "$endpoint" --workload watch --watchers 0 2>/dev/null; then
    echo "not ok - --watchers 0 was accepted"
    failed=$((failed + 1))
fi
[[ $failed == 0 ]] || die "$failed run(s) failed"
echo "bench-smoke: all runs produced numbers"
