#!/usr/bin/env python3
"""One step of bench/kwok.sh's ladder: a simulated cluster grown to NODES nodes and PODS pods in
Deployments of 20, then churned, measured as Kubernetes' scalability SLOs measure it.

    kwok-load.py --server URL --ca FILE --token T --label SYSTEM --nodes N --pods P
                 [--churn-seconds S] [--ready-timeout S] [--store-pids P1,P2] [--store-dir DIR]

The cluster is kept between steps: a step adds the nodes and Deployments that are missing.
Fill: nodes (kwok, started by kwok.sh, makes them Ready and renews their leases), namespaces,
Deployments, until the Deployments report PODS ready replicas (kube-controller-manager creates
the pods, kube-scheduler binds them, kwok runs them). Churn, for S seconds: a rolling update
every 2 s, a scale up or down every 5 s, 5 Events a second, a namespace's pods listed every 2 s,
every pod and every node listed every 10 s, and a ConfigMap created every 0.5 s and timed until
a watch delivers it. Measured from kube-apiserver's /metrics over the churn (deltas): p99 of
apiserver_request_duration_seconds per verb, resource and scope, the worst in each SLO class
(mutating ≤ 1 s, single-object reads ≤ 1 s, namespace lists ≤ 5 s, cluster lists ≤ 30 s),
etcd_request_duration_seconds p99 of the datastore's writes and reads, 429 and 5xx answers;
the watch delay; the datastore's CPU (fill and churn), memory and disk. Prints one JSON line.
"""
import argparse
import http.client
import json
import ssl
import threading
import time
import urllib.parse

import kwok_metrics as m

NAMESPACES = 10
PER_DEPLOYMENT = 20
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


class Api:
    """kube-apiserver over HTTPS, one keep-alive connection per thread."""

    def __init__(self, server, ca, token):
        u = urllib.parse.urlparse(server)
        self.host, self.port = u.hostname, u.port
        self.tls = ssl.create_default_context(cafile=ca)
        self.token = token
        self.local = threading.local()

    def call(self, method, path, body=None, ctype="application/json", timeout=60):
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls, timeout=timeout)
                self.local.conn = conn
            try:
                headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
                data = None
                if body is not None:
                    data = body if isinstance(body, bytes) else json.dumps(body).encode()
                    headers["Content-Type"] = ctype
                conn.request(method, path, data, headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def json(self, method, path, body=None, ok=(200, 201), ctype="application/json"):
        status, data = self.call(method, path, body, ctype)
        if status not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {status} {data[:300]!r}")
        return json.loads(data) if data else None


def parallel(fn, items, workers=8):
    items = list(items)
    errors = []
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                if not items:
                    return
                item = items.pop()
            try:
                fn(item)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def node(i):
    name = f"kwok-node-{i}"
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"taints": [TAINT]},
            "status": {"allocatable": resources, "capacity": resources}}


def deployment(i):
    name = f"d-{i}"
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app": "kwok-bench"}},
            "spec": {"replicas": PER_DEPLOYMENT, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "fake-image"}],
                                           "nodeSelector": {"type": "kwok"},
                                           "tolerations": [{"key": TAINT["key"], "operator": "Exists",
                                                            "effect": "NoSchedule"}]}}}}


def ns_of(i):
    return f"bench-{i % NAMESPACES}"


def scrape(api):
    status, data = api.call("GET", "/metrics", timeout=120)
    if status != 200:
        raise RuntimeError(f"/metrics: HTTP {status}")
    return m.parse(data.decode())


# ---------------------------------------------------------------------- fill

def fill(api, nodes, pods, timeout):
    def create(path, obj):
        status, data = api.call("POST", path, obj)
        if status not in (201, 409):
            raise RuntimeError(f"POST {path}: HTTP {status} {data[:200]!r}")
    for n in ["bench-probe"] + [f"bench-{i}" for i in range(NAMESPACES)]:
        create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}})
    parallel(lambda i: create("/api/v1/nodes", node(i)), range(nodes))
    deployments = pods // PER_DEPLOYMENT
    parallel(lambda i: create(f"/apis/apps/v1/namespaces/{ns_of(i)}/deployments", deployment(i)), range(deployments))
    deadline = time.monotonic() + timeout
    ready = 0
    while time.monotonic() < deadline:
        ready = ready_replicas(api)
        if ready >= deployments * PER_DEPLOYMENT:
            return True, ready
        time.sleep(5)
    return False, ready


def ready_replicas(api):
    total, cont = 0, ""
    while True:
        q = urllib.parse.urlencode({"labelSelector": "app=kwok-bench", "limit": "500", "continue": cont})
        page = api.json("GET", f"/apis/apps/v1/deployments?{q}")
        total += sum(d.get("status", {}).get("readyReplicas", 0) for d in page["items"])
        cont = page["metadata"].get("continue", "")
        if not cont:
            return total


# ---------------------------------------------------------------------- churn

class Churn:
    def __init__(self, api, deployments, seconds):
        self.api, self.deployments, self.seconds = api, deployments, seconds
        self.stop = threading.Event()
        self.errors = []
        self.sent = {}
        self.delays = []
        self.lock = threading.Lock()

    def every(self, period, fn):
        def loop():
            n = 0
            next_at = time.monotonic()
            while not self.stop.is_set():
                try:
                    fn(n)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    with self.lock:
                        self.errors.append(str(e)[:200])
                n += 1
                next_at += period
                self.stop.wait(max(0.0, next_at - time.monotonic()))
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t

    def rolling(self, n):
        i = n % self.deployments
        patch = {"spec": {"template": {"metadata": {"annotations": {"bench/rollout": str(time.time())}}}}}
        self.api.json("PATCH", f"/apis/apps/v1/namespaces/{ns_of(i)}/deployments/d-{i}", patch,
                      ctype="application/strategic-merge-patch+json")

    def scale(self, n):
        i = (n // 2 * 7 + 3) % self.deployments
        replicas = PER_DEPLOYMENT + 5 if n % 2 == 0 else PER_DEPLOYMENT
        self.api.json("PATCH", f"/apis/apps/v1/namespaces/{ns_of(i)}/deployments/d-{i}/scale",
                      {"spec": {"replicas": replicas}}, ctype="application/merge-patch+json")

    def event(self, n):
        i = n % self.deployments
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.api.json("POST", f"/api/v1/namespaces/{ns_of(i)}/events", {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "bench-"},
            "involvedObject": {"kind": "Deployment", "namespace": ns_of(i), "name": f"d-{i}"},
            "reason": "Bench", "message": f"churn event {n}", "type": "Normal", "firstTimestamp": now,
            "lastTimestamp": now, "count": 1, "source": {"component": "kwok-load"}})

    def listing(self, path):
        cont = ""
        while True:
            q = urllib.parse.urlencode({"limit": "500", "continue": cont})
            page = self.api.json("GET", f"{path}?{q}")
            cont = page["metadata"].get("continue", "")
            if not cont:
                return

    def probe(self, n):
        name = f"probe-{n}-{int(time.time())}"
        with self.lock:
            self.sent[name] = time.monotonic()
        self.api.json("POST", "/api/v1/namespaces/bench-probe/configmaps",
                      {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"n": str(n)}})

    def watch(self):
        conn = http.client.HTTPSConnection(self.api.host, self.api.port, context=self.api.tls,
                                           timeout=self.seconds + 60)
        q = urllib.parse.urlencode({"watch": "1", "timeoutSeconds": str(int(self.seconds) + 30)})
        conn.request("GET", f"/api/v1/namespaces/bench-probe/configmaps?{q}",
                     headers={"Authorization": f"Bearer {self.api.token}"})
        resp = conn.getresponse()
        self.watching.set()
        while not self.stop.is_set():
            line = resp.readline()
            if not line:
                return
            ev = json.loads(line)
            name = ev.get("object", {}).get("metadata", {}).get("name")
            with self.lock:
                sent = self.sent.pop(name, None) if ev.get("type") == "ADDED" else None
            if sent is not None:
                self.delays.append(time.monotonic() - sent)

    def run(self):
        self.watching = threading.Event()
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        self.watching.wait(30)
        threads = [
            self.every(2.0, self.rolling),
            self.every(5.0, self.scale),
            self.every(0.2, self.event),
            self.every(2.0, lambda n: self.listing(f"/api/v1/namespaces/{ns_of(n)}/pods")),
            self.every(10.0, lambda n: self.listing("/api/v1/pods")),
            self.every(10.0, lambda n: self.listing("/api/v1/nodes")),
            self.every(0.5, self.probe),
        ]
        time.sleep(self.seconds)
        self.stop.set()
        for t in threads:
            t.join(60)
        with self.lock:
            lost = len(self.sent)
        return lost


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--pods", type=int, required=True)
    ap.add_argument("--churn-seconds", type=float, default=120)
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--store-pids", default="")
    ap.add_argument("--store-dir", default="")
    a = ap.parse_args()
    api = Api(a.server, a.ca, a.token)
    pids = [int(p) for p in a.store_pids.split(",") if p]

    cpu0, t0 = m.cpu_seconds(pids), time.monotonic()
    ready, got = fill(api, a.nodes, a.pods, a.ready_timeout)
    fill_s, cpu_fill = time.monotonic() - t0, m.cpu_seconds(pids) - cpu0
    result = {"label": a.label, "nodes": a.nodes, "pods": a.pods, "ready": ready, "ready_pods": got,
              "fill_s": round(fill_s, 1), "cpu_fill_s": round(cpu_fill, 1)}
    if ready:
        before, cpu1, t1 = scrape(api), m.cpu_seconds(pids), time.monotonic()
        churn = Churn(api, a.pods // PER_DEPLOYMENT, a.churn_seconds)
        lost = churn.run()
        after = scrape(api)
        changed = m.delta(before, after)
        slo = m.slo_p99(changed)
        result.update({
            "churn_s": round(time.monotonic() - t1, 1),
            "cpu_churn_s": round(m.cpu_seconds(pids) - cpu1, 1),
            "slo": slo,
            "slo_ok": all(slo.get(c, {}).get("p99_s", 0) <= limit for c, limit in m.SLO.items()),
            "store": m.store_p99(changed),
            "answers": m.answers(changed),
            "watch_p50_s": pct(churn.delays, 0.5), "watch_p99_s": pct(churn.delays, 0.99),
            "watch_lost": lost, "load_errors": len(churn.errors), "load_error_sample": churn.errors[:3],
        })
        result["slo_ok"] = result["slo_ok"] and result["answers"]["5xx"] == 0
    result.update({"rss_mib": m.rss_mib(pids), "disk_mib": m.disk_mib(a.store_dir)})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
