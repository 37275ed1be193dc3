#!/usr/bin/env bash
# Runs the Kubernetes storage test suite (k8s.io/apiserver) unmodified against
# kine-rs. See README.md.
#
#   conformance/run.sh --backend sqlite|memory|nats|nats-embedded|postgres|mysql|s3 [--run REGEX] [--bin PATH]
#                      [--pkg PACKAGE]... [--apiserver-version VERSION] [--verbose]
# --apiserver-version runs another release of the suite (a pre-release, e.g. v0.38.0-beta.0) in a
# work directory of its own; the default is the pinned one below.
set -euo pipefail

# ---- pinned versions and suite selection (change them here only) ----------
PINNED_APISERVER_VERSION=v0.37.2
# Packages of k8s.io/apiserver whose tests start their server through
# pkg/storage/etcd3/testserver (directly, or via pkg/storage/etcd3/testing).
DEFAULT_PACKAGES=(
    ./pkg/storage/etcd3/...
    ./pkg/storage/cacher/
    ./pkg/storage/storagebackend/factory/
    ./pkg/registry/generic/registry/
    ./pkg/reconcilers/
    ./pkg/util/peerproxy/
)
# Timeout of one package's test binary (go test -timeout).
GO_TEST_TIMEOUT=90m
ORIG_IMPORT=k8s.io/apiserver/pkg/storage/etcd3/testserver
OUR_IMPORT=kine-rs/conformance/testserver
# ---------------------------------------------------------------------------

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

BACKEND=""
APISERVER_VERSION=$PINNED_APISERVER_VERSION
RUN=""
BIN=""
VERBOSE=0
PACKAGES=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) BACKEND="${2:?}"; shift 2 ;;
        --run) RUN="${2:?}"; shift 2 ;;
        --bin) BIN="${2:?}"; shift 2 ;;
        --pkg) PACKAGES+=("${2:?}"); shift 2 ;;
        --apiserver-version) APISERVER_VERSION="${2:?}"; shift 2 ;;
        --verbose) VERBOSE=1; shift ;;
        -h|--help) usage ;;
        *) echo "run.sh: unknown argument: $1" >&2; usage ;;
    esac
done
case "$BACKEND" in
    sqlite|memory|nats|nats-embedded|postgres|mysql|s3) ;;
    *) echo "run.sh: --backend sqlite|memory|nats|nats-embedded|postgres|mysql|s3 is required" >&2; usage ;;
esac
[[ ${#PACKAGES[@]} -gt 0 ]] || PACKAGES=("${DEFAULT_PACKAGES[@]}")

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/.." && pwd)"
if [[ "$APISERVER_VERSION" == "$PINNED_APISERVER_VERSION" ]]; then
    WORK="${CONFORMANCE_WORK_DIR:-$HERE/.work}"
else
    WORK="${CONFORMANCE_WORK_DIR:-$HERE/.work}-$APISERVER_VERSION"
fi
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
SRC="$WORK/apiserver"

log() { echo "run.sh: $*" >&2; }
die() { echo "run.sh: ERROR: $*" >&2; exit 1; }

# ---- 1. the kine-rs binary -------------------------------------------------
if [[ -z "$BIN" ]]; then
    log "building kine-rs (cargo build --release -p kine-rs)"
    (cd "$REPO_ROOT" && cargo build --release -p kine-rs)
    BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/kine-rs"
fi
[[ -f "$BIN" && -x "$BIN" ]] || die "kine-rs binary not found or not executable: $BIN"
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"

# Steps 2 to 4 and the compilation run under a lock: runs for several backends may start at
# once (scripts/test runs them side by side); the first prepares the suite and compiles it, the
# others wait for it and use the same copy and the same compiled packages.
exec 9>"$WORK/.prepare.lock"
flock 9

# ---- 2. the suite source, fetched through the Go module proxy --------------
# Only the module cache is needed after the first run, so later runs work
# offline.
log "fetching k8s.io/apiserver@$APISERVER_VERSION"
DOWNLOAD="$(go mod download -json "k8s.io/apiserver@$APISERVER_VERSION" || true)"
ORIG="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$DOWNLOAD")"
if [[ -z "$ORIG" || ! -f "$ORIG/go.mod" ]]; then
    # e.g. "requires go >= 1.27.0 (running go 1.26.8; GOTOOLCHAIN=local)": a newer suite may
    # need a newer Go; GOTOOLCHAIN=go1.27.4 conformance/run.sh … fetches one through the proxy.
    die "go mod download k8s.io/apiserver@$APISERVER_VERSION: $(sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' <<<"$DOWNLOAD" | sed 's/\\u003e/>/g; s/\\u003c/</g')"
fi

# A writable copy of the pristine module source with the swap below. A copy made earlier from
# the same source is kept (another backend's run may be using it), and checked below.
STAMP="$SRC/.kine-rs-import-swap"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$ORIG" ]]; then
    log "reusing the suite copy in $SRC"
else
    rm -rf "$SRC"
    cp -r "$ORIG" "$SRC"
    chmod -R u+w "$SRC"
fi

# ---- 3. the import swap: the only change made to the suite -----------------
# Every importer of the upstream test server (test files, plus the helper
# package pkg/storage/etcd3/testing that other packages' tests use) gets ours.
mapfile -t SWAPPED < <(cd "$SRC" && grep -rlF --include='*.go' -e "\"$ORIG_IMPORT\"" -e "\"$OUR_IMPORT\"" . | sort)
[[ ${#SWAPPED[@]} -gt 0 ]] || die "no file imports $ORIG_IMPORT: did the suite move?"
# (In a copy kept from an earlier run, nothing is left to swap: its files stay untouched.)
mapfile -t TO_SWAP < <(cd "$SRC" && grep -rlF --include='*.go' "\"$ORIG_IMPORT\"" . | sort)
[[ ${#TO_SWAP[@]} -eq 0 ]] || (cd "$SRC" && sed -i "s#\"$ORIG_IMPORT\"#\"$OUR_IMPORT\"#" "${TO_SWAP[@]}")
before=$(cd "$ORIG" && cat "${SWAPPED[@]}" | grep -cF "\"$ORIG_IMPORT\"")
after=$(cd "$SRC" && cat "${SWAPPED[@]}" | grep -cF "\"$OUR_IMPORT\"")
[[ "$before" == "$after" ]] || die "import swap: $before imports before, $after after"
if grep -rqF --include='*.go' "\"$ORIG_IMPORT\"" "$SRC"; then
    die "import swap incomplete: $ORIG_IMPORT is still imported"
fi
# Nothing but those import lines may differ from the pristine source.
changed=$(diff -r -x "$(basename "$STAMP")" "$ORIG" "$SRC" | grep -c '^[<>]' || true)
[[ "$changed" == $((2 * before)) ]] ||
    die "import swap changed $changed diff lines, expected $((2 * before))"
echo "$ORIG" >"$STAMP"
log "import swap: $before import lines in ${#SWAPPED[@]} files: ${SWAPPED[*]}"

# ---- 4. module wiring: a workspace of the suite copy and our module --------
# In a workspace both are main modules, so the suite resolves $OUR_IMPORT to
# this directory without any edit to its go.mod.
if [[ ! -f "$WORK/go.work" ]]; then
    (cd "$WORK" && go work init "./apiserver" "$HERE")
fi
export GOWORK="$WORK/go.work"
cd "$SRC"

# Make sure the packages really run against our server: among all imports of
# the test packages and their dependencies, ours must appear and the upstream
# test server must not (./pkg/storage/etcd3/... lists that package itself,
# which is harmless: it has no tests and nothing imports it any more).
imports="$(go list -deps -test -f '{{join .Imports "\n"}}' "${PACKAGES[@]}")"
grep -qxF "$OUR_IMPORT" <<<"$imports" || die "$OUR_IMPORT is not used by ${PACKAGES[*]}"
! grep -qxF "$ORIG_IMPORT" <<<"$imports" || die "$ORIG_IMPORT is still imported by ${PACKAGES[*]}"

# ---- 5. run ---------------------------------------------------------------
LOGS="$WORK/logs/$BACKEND"
rm -rf "$LOGS"
mkdir -p "$LOGS"
OUT="$WORK/test-$BACKEND.log"
export KINE_RS_BIN="$BIN" KINE_RS_BACKEND="$BACKEND" KINE_RS_LOG_DIR="$LOGS"

# A free TCP port on 127.0.0.1 (the kernel's choice).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 10 s for something to listen on 127.0.0.1:$1; dies naming $2 and showing log $3.
wait_listening() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    die "$2 did not listen on 127.0.0.1:$1: $(tail -20 "$3")"
}

if [[ "$BACKEND" == nats ]]; then
    # One nats-server with JetStream for the whole run; each test uses its own bucket.
    NATS_BIN="${NATS_SERVER_BIN:-$(command -v nats-server || echo "$HOME/go/bin/nats-server")}"
    [[ -x "$NATS_BIN" ]] || die "nats-server not found (go install github.com/nats-io/nats-server/v2@v2.15.2, or set NATS_SERVER_BIN)"
    NATS_PORT="$(free_port)"
    rm -rf "$WORK/nats" && mkdir -p "$WORK/nats"
    "$NATS_BIN" -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$WORK/nats" >"$WORK/nats/server.log" 2>&1 &
    NATS_PID=$!
    trap 'kill $NATS_PID 2>/dev/null; wait $NATS_PID 2>/dev/null' EXIT
    wait_listening "$NATS_PORT" nats-server "$WORK/nats/server.log"
    export KINE_RS_NATS_URL="nats://127.0.0.1:$NATS_PORT"
    log "nats-server $("$NATS_BIN" --version) on $KINE_RS_NATS_URL"
fi

if [[ "$BACKEND" == postgres ]]; then
    # One throwaway PostgreSQL server for the whole run; each test uses a database of its own,
    # which kine-rs creates. Without fsync, as the upstream harness runs its etcd
    # (testserver.RunEtcd sets UnsafeNoFsync): TestCompact gives a compaction cycle (two commits)
    # 100 ms, and on a busy CI disk one fsync'ed commit took 15-64 ms (log_min_duration_statement).
    source "$REPO_ROOT/scripts/pg-throwaway.sh"
    export PG_THROWAWAY_OPTIONS="-c fsync=off -c synchronous_commit=off"
    pg_throwaway_start || die "cannot start PostgreSQL"
    trap pg_throwaway_stop EXIT
    export KINE_RS_PG_URL="$PG_THROWAWAY_URL"
    log "PostgreSQL $PG_THROWAWAY_VERSION on ${PG_THROWAWAY_URL##*@}"
fi

if [[ "$BACKEND" == mysql ]]; then
    # One throwaway MariaDB server for the whole run; each test uses a database of its own,
    # which kine-rs creates.
    source "$REPO_ROOT/scripts/mysql-throwaway.sh"
    mysql_throwaway_start || die "cannot start MariaDB"
    trap mysql_throwaway_stop EXIT
    export KINE_RS_MYSQL_URL="$MYSQL_THROWAWAY_URL"
    log "MariaDB $MYSQL_THROWAWAY_VERSION on ${MYSQL_THROWAWAY_URL##*@}"
fi

if [[ "$BACKEND" == s3 ]]; then
    # One S3-compatible server (versitygw, Apache-2.0) for the whole run; each kine-rs keeps its
    # SQLite database in a folder of its own of bucket "kine", with --s3-sync.
    S3_BIN="${VERSITYGW_BIN:-$(command -v versitygw || echo "$HOME/go/bin/versitygw")}"
    [[ -x "$S3_BIN" ]] || die "versitygw not found (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0, or set VERSITYGW_BIN)"
    S3_PORT="$(free_port)"
    rm -rf "$WORK/s3" && mkdir -p "$WORK/s3/data/kine"
    export KINE_RS_S3_ACCESS_KEY=conformance-access KINE_RS_S3_SECRET_KEY=conformance-secret-key
    ROOT_ACCESS_KEY=$KINE_RS_S3_ACCESS_KEY ROOT_SECRET_KEY=$KINE_RS_S3_SECRET_KEY \
        "$S3_BIN" --port "127.0.0.1:$S3_PORT" posix "$WORK/s3/data" >"$WORK/s3/server.log" 2>&1 &
    S3_PID=$!
    trap 'kill $S3_PID 2>/dev/null; wait $S3_PID 2>/dev/null' EXIT
    wait_listening "$S3_PORT" versitygw "$WORK/s3/server.log"
    export KINE_RS_S3_URL="http://127.0.0.1:$S3_PORT"
    log "versitygw on $KINE_RS_S3_URL"
fi

# Compile first with the default parallelism (both cores)...
log "compiling test binaries"
t0=$SECONDS
go test -count=1 -run '^$' "${PACKAGES[@]}" >/dev/null ||
    die "the suite does not build (rerun: cd $SRC && GOWORK=$GOWORK go vet ${PACKAGES[*]})"
log "compiled in $((SECONDS - t0))s"
flock -u 9

# ...then run one package at a time: each test starts its own server, and the
# suite has timing-sensitive watch tests that a busy 2-core machine can break.
log "running ${PACKAGES[*]} against $BIN (backend $BACKEND); full output: $OUT"
args=(-v -count=1 -p 1 -timeout "$GO_TEST_TIMEOUT")
[[ -n "$RUN" ]] && args+=(-run "$RUN")
filter='^[[:space:]]*--- (PASS|FAIL|SKIP)|^(ok|FAIL|panic:)[[:space:]]'
[[ "$VERBOSE" == 1 ]] && filter='.'
t0=$SECONDS
set +e
go test "${args[@]}" "${PACKAGES[@]}" 2>&1 | tee "$OUT" | grep --line-buffered -aE "$filter"
status=${PIPESTATUS[0]}
set -e
log "tests ran in $((SECONDS - t0))s"

# Top-level tests only: a test with a failed subtest fails itself.
count() { grep -acE "^--- $1:" "$OUT" || true; }
passed=$(count PASS)
failed=$(count FAIL)
skipped=$(count SKIP)
if [[ "$failed" -gt 0 ]]; then
    echo "failed tests:"
    grep -aE '^--- FAIL:' "$OUT" | sed 's/^--- FAIL: /  /'
    # What the failing tests printed (the filter above hides it): each line of output of a test
    # that failed, after its name. go test -v marks whose output follows with "=== RUN|NAME|CONT".
    echo "failure details:"
    awk '
        FNR == NR { if (match($0, /--- FAIL: [^ ]+/)) failed[substr($0, RSTART + 10, RLENGTH - 10)] = 1; next }
        /^=== (RUN|NAME|CONT) / { current = $3; next }
        /^[[:space:]]*--- / || /^=== / { next }
        (current in failed) && NF > 0 && shown++ < 60 { print "  " current ": " $0 }
    ' "$OUT" "$OUT"
    echo "full output: $OUT; server logs: $LOGS"
fi
echo "conformance-$BACKEND: $passed passed, $failed failed, $skipped skipped"
if [[ "$status" -ne 0 || "$failed" -gt 0 || "$passed" -eq 0 ]]; then
    [[ "$status" -ne 0 && "$failed" -eq 0 ]] && echo "go test exited with status $status (build failure, panic or timeout?); see $OUT"
    exit 1
fi
