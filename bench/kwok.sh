#!/usr/bin/env bash
# A whole control plane at scale on each datastore in turn: kube-apiserver,
# kube-controller-manager and kube-scheduler 1.37.2, with kwok v0.8.0 simulating the nodes and
# the pods' lifecycle, grown step by step (bench/kwok-load.py: fill, then churn) and measured
# as Kubernetes' scalability SLOs measure it; then one table per step with ratios against etcd
# and the largest step each system carried within the SLOs (bench/summarize-kwok.py), and a
# chart of p99 latency against cluster size (bench/charts.py kwok).
#
#   bench/kwok.sh [--steps 100:3000,500:10000,1000:30000] [--churn-seconds 120]
#                 [--ready-timeout 900] [SYSTEM...]
#
# A step is NODES:PODS (pods in Deployments of 20); the cluster grows from one step to the next
# and a system's ladder stops at the first step whose pods do not all run within
# --ready-timeout. Systems (bench/stores.sh; default: etcd kine-sqlite kine-rs-sqlite
# kine-rs-nats-embedded kine-rs-postgres): etcd, kine-sqlite, kine-nats-embedded, kine-rs-sqlite,
# kine-rs-nats-embedded, kine-rs-nats, kine-rs-nats-cluster, kine-rs-postgres, kine-rs-mysql.
#
# Nodes: kwok's own stages (from its module): Ready at once, a lease renewed every 10 s, status
# every 10-20 min (node-initialize, node-heartbeat-with-lease); pods Running once bound, deleted
# once terminating (the "fast" pod-ready, pod-complete, pod-delete). kube-controller-manager and
# kube-scheduler run with --kube-api-qps 100 (burst 200), as clusters of this size are run.
# Each component has its own user, so API priority and fairness classifies it as in a cluster
# (kwok in the group system:nodes).
#
# Needs: target/release/kine-rs; kube-scheduler-1.37.2 (tools/kubernetes/build.sh ""
# kube-scheduler) and kwok (go install sigs.k8s.io/kwok/cmd/kwok@v0.8.0) in $(go env GOPATH)/bin
# besides what bench/apiserver.sh needs. Output: target/bench/kwok-<time>/runs.log (one JSON
# line per system and step), summary.md, kwok-*.svg, every component's log.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=100:3000,500:10000,1000:30000 churn=120 ready_timeout=900
systems=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --churn-seconds) churn=$2; shift 2 ;;
    --ready-timeout) ready_timeout=$2; shift 2 ;;
    -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "kwok.sh: unknown option $1" >&2; exit 2 ;;
    *) systems+=("$1"); shift ;;
    esac
done
[[ $steps =~ ^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$ ]] || { echo "kwok.sh: --steps NODES:PODS[,NODES:PODS...]" >&2; exit 2; }
[[ $churn =~ ^[0-9]+$ && $ready_timeout =~ ^[0-9]+$ ]] || { echo "kwok.sh: --churn-seconds and --ready-timeout take seconds" >&2; exit 2; }
source bench/stores.sh
[[ ${#systems[@]} -gt 0 ]] || systems=(etcd kine-sqlite kine-rs-sqlite kine-rs-nats-embedded kine-rs-postgres)
check_binaries "${systems[@]}"
kcm=$gobin/kube-controller-manager-1.37.2
scheduler=$gobin/kube-scheduler-1.37.2
kwok=$gobin/kwok
kwok_version=v0.8.0
[[ -x $kcm ]] || stores_die "$kcm not found: run scripts/install-test-deps"
[[ -x $scheduler ]] || stores_die "$scheduler not found: tools/kubernetes/build.sh \"\" kube-scheduler"
[[ -x $kwok ]] || stores_die "$kwok not found: go install sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
stages=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$kwok_version/kustomize/stage
[[ -d $stages ]] || go mod download "sigs.k8s.io/kwok@$kwok_version" 2>/dev/null || true
[[ -d $stages ]] || stores_die "kwok's stages not found in $stages"

stores_begin kwok
declare -A tokens
: >"$work/tokens.csv"
# The load (first: start_apiserver's readiness check uses it), then the components.
for user in bench-load system:kube-controller-manager system:kube-scheduler kwok; do
    tokens[$user]=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    groups=""
    [[ $user == kwok ]] && groups=',"system:nodes"'
    echo "${tokens[$user]},$user,$user$groups" >>"$work/tokens.csv"
done
kubeconfig() {
    cat >"$work/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster: {server: "https://127.0.0.1:23943", certificate-authority: "$work/serving.crt"}
users:
- name: u
  user: {token: "${tokens[$2]}"}
contexts:
- name: bench
  context: {cluster: bench, user: u}
current-context: bench
EOF
}
kubeconfig kcm system:kube-controller-manager
kubeconfig scheduler system:kube-scheduler
kubeconfig kwok kwok
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$stages/$f"
done >"$work/stages.yaml"

say "# $(date -u +%FT%TZ) bench/kwok.sh --steps $steps --churn-seconds $churn --ready-timeout $ready_timeout ${systems[*]}; $(nproc) cores, $(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1048576)) GiB"
say "# $(stores_versions); kube-controller-manager and kube-scheduler 1.37.2; kwok $kwok_version"
for system in "${systems[@]}"; do
    dir=$work/$system
    mkdir -p "$dir"
    start_store "$system" "$dir"
    start_apiserver "$system" --max-requests-inflight=800 --max-mutating-requests-inflight=400
    "$kcm" --kubeconfig="$work/kcm.kubeconfig" --leader-elect=false --secure-port=0 \
        --kube-api-qps=100 --kube-api-burst=200 --use-service-account-credentials=false \
        --service-account-private-key-file="$work/sa.key" --root-ca-file="$work/serving.crt" \
        >"$out/$system-kcm.log" 2>&1 &
    pids+=($!)
    # kube-scheduler started at once after kube-apiserver was ready never scheduled a pod in
    # some runs (its informers' first lists); a few seconds later it always did.
    sleep 5
    "$scheduler" --kubeconfig="$work/scheduler.kubeconfig" --leader-elect=false --secure-port=0 \
        --kube-api-qps=100 --kube-api-burst=200 -v=2 >"$out/$system-scheduler.log" 2>&1 &
    pids+=($!)
    "$kwok" --kubeconfig="$work/kwok.kubeconfig" --manage-all-nodes --config="$work/stages.yaml" \
        --cidr=10.0.0.0/8 --node-lease-duration-seconds=40 --server-address=127.0.0.1:0 \
        >"$out/$system-kwok.log" 2>&1 &
    pids+=($!)
    for step in ${steps//,/ }; do
        nodes=${step%%:*} pods=${step##*:}
        line=$(python3 bench/kwok-load.py --server https://127.0.0.1:23943 --ca "$work/serving.crt" \
            --token "${tokens[bench-load]}" --label "$system" --nodes "$nodes" --pods "$pods" \
            --churn-seconds "$churn" --ready-timeout "$ready_timeout" --store-pids "$store_pids" \
            --store-dir "$store_dir") || { say "# FAILED: $system at $step (the load script failed)"; break; }
        say "$line"
        [[ $line == *'"ready": true'* ]] || { say "# $system: not every pod ran within ${ready_timeout} s at $step; its ladder ends"; break; }
    done
    stop_store "$system"
    rm -rf "$dir"
done
python3 bench/summarize-kwok.py <"$runs" | tee "$out/summary.md"
python3 bench/charts.py kwok "$runs" "$out"
echo "kwok.sh: report lines in $runs, tables in $out/summary.md, charts (SVG) in $out"
