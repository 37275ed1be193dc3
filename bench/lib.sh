# Shell functions shared by the bench scripts (sourced; they define `die` and `$bench`).

# wait_serving LABEL URL PID LOG: until the server at URL takes a first write (etcd may listen
# before it has a leader); fails if its process PID exits or 60 s pass (LOG: its output).
wait_serving() {
    local label=$1 url=$2 pid=$3 log=$4 i
    for i in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || die "$label exited during start-up: $(tail -5 "$log")"
        "$bench" --endpoint "$url" --workload load --keys 1 2>/dev/null && return 0
        sleep 0.2
    done
    die "$label not serving at $url within 60 s (log: $log)"
}
