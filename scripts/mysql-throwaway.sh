# Sourced by conformance/run.sh and bench scripts: a throwaway MariaDB server on loopback.
#
#   source scripts/mysql-throwaway.sh
#   mysql_throwaway_start     # sets MYSQL_THROWAWAY_URL=mysql://kine:…@tcp(127.0.0.1:PORT) (add /DB)
#   mysql_throwaway_stop      # stops it and removes its data
#
# mariadb-install-db into a new directory under /tmp, then mariadbd in the background with TCP
# on 127.0.0.1 only, max_connections=500, utf8mb4, and a password user `kine` that may connect
# from anywhere. As root it runs as the `mysql` user (--user=mysql); as anyone else the unix-socket
# admin account is that user instead of root. Server options in $MYSQL_THROWAWAY_OPTIONS
# ("--name=value …") are added last (e.g. --innodb-buffer-pool-size=1G). Binaries from $MARIADB_BIN (a directory), else PATH,
# /usr/sbin, /usr/bin (Debian's mariadb-server and mariadb-client).

# The path of MariaDB binary $1, or nothing.
_mysql_throwaway_bin() {
    if [[ -n "${MARIADB_BIN:-}" ]]; then
        [[ -x "$MARIADB_BIN/$1" ]] && echo "$MARIADB_BIN/$1"
    else
        PATH="$PATH:/usr/sbin:/usr/bin" command -v "$1"
    fi
}

# The admin client ($1: mariadb or mariadb-admin) over the server's socket, then the arguments.
_mysql_throwaway_admin() {
    local bin=$1
    shift
    "$(_mysql_throwaway_bin "$bin")" --no-defaults -u"$MYSQL_THROWAWAY_ADMIN" \
        --socket="$MYSQL_THROWAWAY_DIR/mariadb.sock" "$@"
}

mysql_throwaway_start() {
    local name
    for name in mariadbd mariadb mariadb-admin mariadb-install-db; do
        if [[ -z "$(_mysql_throwaway_bin "$name")" ]]; then
            echo "MariaDB's $name not found (apt-get install mariadb-server mariadb-client, or set MARIADB_BIN)" >&2
            return 1
        fi
    done
    MYSQL_THROWAWAY_DIR="$(mktemp -d /tmp/kine-rs-mysql.XXXXXX)"
    mkdir "$MYSQL_THROWAWAY_DIR/data" "$MYSQL_THROWAWAY_DIR/tmp"
    chmod 711 "$MYSQL_THROWAWAY_DIR" "$MYSQL_THROWAWAY_DIR/data"
    chmod 700 "$MYSQL_THROWAWAY_DIR/tmp"
    # As root: the server runs as `mysql` (it refuses root) and writes its socket, pid file and log
    # next to the data directory. Otherwise the unix-socket admin account is this user.
    local install_as=() server_as=()
    if [[ "$(id -u)" == 0 ]]; then
        chown mysql:mysql "$MYSQL_THROWAWAY_DIR" "$MYSQL_THROWAWAY_DIR/data" "$MYSQL_THROWAWAY_DIR/tmp"
        install_as=(--user=mysql)
        server_as=(--user=mysql)
        MYSQL_THROWAWAY_ADMIN=root
    else
        MYSQL_THROWAWAY_ADMIN="$(id -un)"
        install_as=(--auth-root-socket-user="$MYSQL_THROWAWAY_ADMIN")
    fi
    # --no-defaults must come first: no my.cnf of this machine applies.
    if ! (cd / && "$(_mysql_throwaway_bin mariadb-install-db)" --no-defaults "${install_as[@]}" \
        --datadir="$MYSQL_THROWAWAY_DIR/data" --skip-test-db --auth-root-authentication-method=socket --innodb-use-native-aio=0 \
        --tmpdir="$MYSQL_THROWAWAY_DIR/tmp" \
        >"$MYSQL_THROWAWAY_DIR/install.log" 2>&1); then
        cat "$MYSQL_THROWAWAY_DIR/install.log" >&2
        return 1
    fi
    local port
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    (cd / && exec "$(_mysql_throwaway_bin mariadbd)" --no-defaults "${server_as[@]}" \
        --datadir="$MYSQL_THROWAWAY_DIR/data" --socket="$MYSQL_THROWAWAY_DIR/mariadb.sock" \
        --pid-file="$MYSQL_THROWAWAY_DIR/mariadb.pid" --log-error="$MYSQL_THROWAWAY_DIR/error.log" \
        --port="$port" --bind-address=127.0.0.1 --skip-name-resolve --max-connections=500 \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci \
        --innodb-flush-log-at-trx-commit=1 --max-allowed-packet=64M --innodb-use-native-aio=0 \
        --tmpdir="$MYSQL_THROWAWAY_DIR/tmp" ${MYSQL_THROWAWAY_OPTIONS:-} \
        </dev/null >/dev/null 2>>"$MYSQL_THROWAWAY_DIR/server.out") &
    MYSQL_THROWAWAY_PID=$!
    # Ready when it answers on its socket (up to a minute).
    local i
    for i in $(seq 600); do
        _mysql_throwaway_admin mariadb-admin --connect-timeout=2 ping >/dev/null 2>&1 && break
        if ! kill -0 "$MYSQL_THROWAWAY_PID" 2>/dev/null || [[ "$i" == 600 ]]; then
            echo "mariadbd did not start on port $port" >&2
            tail -20 "$MYSQL_THROWAWAY_DIR/error.log" "$MYSQL_THROWAWAY_DIR/server.out" >&2
            return 1
        fi
        sleep 0.1
    done
    if ! _mysql_throwaway_admin mariadb -e "CREATE USER 'kine'@'%' IDENTIFIED BY 'kine-test-password';
            GRANT ALL ON *.* TO 'kine'@'%'; FLUSH PRIVILEGES;"; then
        return 1
    fi
    MYSQL_THROWAWAY_URL="mysql://kine:kine-test-password@tcp(127.0.0.1:$port)"
    MYSQL_THROWAWAY_VERSION="$("$(_mysql_throwaway_bin mariadbd)" --version | awk '{print $3}')"
    MYSQL_THROWAWAY_VERSION="${MYSQL_THROWAWAY_VERSION%%-*}"
}

mysql_throwaway_stop() {
    [[ -n "${MYSQL_THROWAWAY_DIR:-}" ]] || return 0
    if [[ -n "${MYSQL_THROWAWAY_PID:-}" ]]; then
        # SIGTERM is MariaDB's normal shutdown; SIGKILL after a minute.
        kill -TERM "$MYSQL_THROWAWAY_PID" 2>/dev/null || true
        local i
        for i in $(seq 600); do
            kill -0 "$MYSQL_THROWAWAY_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$MYSQL_THROWAWAY_PID" 2>/dev/null || true
        wait "$MYSQL_THROWAWAY_PID" 2>/dev/null || true
    fi
    rm -rf "$MYSQL_THROWAWAY_DIR"
    MYSQL_THROWAWAY_DIR=
    MYSQL_THROWAWAY_PID=
}
