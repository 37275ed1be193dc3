# Sourced by conformance/run.sh and bench scripts: a throwaway PostgreSQL server on loopback.
#
#   source scripts/pg-throwaway.sh
#   pg_throwaway_start        # sets PG_THROWAWAY_URL=postgres://kine:…@127.0.0.1:PORT (add /DB)
#   pg_throwaway_stop         # stops it and removes its data
#
# initdb into a new directory under /tmp, a password user `kine`, TCP on 127.0.0.1 only,
# max_connections=300, plus any server options in $PG_THROWAWAY_OPTIONS ("-c name=value …").
# As root it runs as the `postgres` user (PostgreSQL refuses root).
# Binaries from $PG_BIN, or the newest /usr/lib/postgresql/*/bin (Debian's postgresql).

pg_throwaway_start() {
    PG_THROWAWAY_BIN="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)}"
    if [[ -z "$PG_THROWAWAY_BIN" || ! -x "$PG_THROWAWAY_BIN/initdb" ]]; then
        echo "PostgreSQL not found (apt-get install postgresql, or set PG_BIN)" >&2
        return 1
    fi
    PG_THROWAWAY_DIR="$(mktemp -d /tmp/kine-rs-pg.XXXXXX)"
    chmod 711 "$PG_THROWAWAY_DIR"
    PG_THROWAWAY_AS=()
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres:postgres "$PG_THROWAWAY_DIR"
        PG_THROWAWAY_AS=(runuser -u postgres --)
    fi
    printf 'kine-test-password\n' >"$PG_THROWAWAY_DIR/pwfile"
    if [[ ${#PG_THROWAWAY_AS[@]} -gt 0 ]]; then chown postgres "$PG_THROWAWAY_DIR/pwfile"; fi
    if ! (cd / && "${PG_THROWAWAY_AS[@]}" "$PG_THROWAWAY_BIN/initdb" -D "$PG_THROWAWAY_DIR/data" -U kine \
        --pwfile="$PG_THROWAWAY_DIR/pwfile" --auth-local=trust --auth-host=scram-sha-256 -E UTF8 \
        --locale=C.UTF-8 --no-sync >"$PG_THROWAWAY_DIR/initdb.log" 2>&1); then
        cat "$PG_THROWAWAY_DIR/initdb.log" >&2
        return 1
    fi
    local port
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    if ! (cd / && "${PG_THROWAWAY_AS[@]}" "$PG_THROWAWAY_BIN/pg_ctl" -D "$PG_THROWAWAY_DIR/data" \
        -l "$PG_THROWAWAY_DIR/server.log" -w -t 60 start \
        -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$PG_THROWAWAY_DIR -c max_connections=300 ${PG_THROWAWAY_OPTIONS:-}" \
        >/dev/null); then
        tail -20 "$PG_THROWAWAY_DIR/server.log" >&2
        return 1
    fi
    PG_THROWAWAY_URL="postgres://kine:kine-test-password@127.0.0.1:$port"
    PG_THROWAWAY_VERSION="$("$PG_THROWAWAY_BIN/postgres" --version | awk '{print $3}')"
}

pg_throwaway_stop() {
    [[ -n "${PG_THROWAWAY_DIR:-}" ]] || return 0
    # Immediate: the data is removed next, so no shutdown checkpoint. (A fast stop after the
    # storage suite, 249 databases, took 62 s on a busy machine: past pg_ctl's 60 s, and the
    # failure in this EXIT trap failed a suite whose tests had all passed.) If pg_ctl still
    # fails, the postmaster is killed so that nothing outlives the caller.
    if ! (cd / && "${PG_THROWAWAY_AS[@]}" "$PG_THROWAWAY_BIN/pg_ctl" -D "$PG_THROWAWAY_DIR/data" -m immediate \
        -w -t 60 stop >/dev/null 2>&1); then
        local pid
        pid="$(head -n1 "$PG_THROWAWAY_DIR/data/postmaster.pid" 2>/dev/null || true)"
        echo "pg-throwaway: pg_ctl stop failed; killing the postmaster (${pid:-no pid file})" >&2
        if [[ -n "$pid" ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    rm -rf "$PG_THROWAWAY_DIR"
    PG_THROWAWAY_DIR=
}
