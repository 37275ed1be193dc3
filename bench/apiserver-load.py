#!/usr/bin/env python3
"""The kube-apiserver-level load of bench/apiserver.sh: what a cluster's clients do, through
kube-apiserver's REST API, timed per call. Standard library only.

    apiserver-load.py --server https://127.0.0.1:PORT --ca CA --token TOKEN --label NAME
                      [--namespaces 10] [--objects 500] [--clients 16] [--rate 100]
                      [--rate-seconds 10] [--watchers 10] [--lists 5] [--pids PID,...]

Phases, in order (every object a ConfigMap of about 1 KiB, `--namespaces` × `--objects` of them):
  create      as fast as `--clients` threads go
  create-rate `--rate` creates per second for `--rate-seconds` (latency at a steady load)
  get         every object read once
  update      every object replaced with the resourceVersion it has (an optimistic update)
  list        `--lists` times all ConfigMaps of all namespaces in pages of 500, consistent
              (resourceVersion unset)
  list-rv0    the same from kube-apiserver's cache (resourceVersion=0, one page)
  delete      every object
`--watchers` watches on all ConfigMaps stay open throughout; each created or updated object
carries its send time, so every ADDED/MODIFIED event yields a delivery delay (client →
apiserver → datastore → apiserver's watch cache → watcher).

One line per phase, key=value (bench/summarize-apiserver.py reads them):
  label=… phase=… ops=… seconds=… ops_per_s=… p50_ms=… p99_ms=… errors=… cpu_s=… rss_mib=…
and a line phase=watch with the delivery delays (ops: events delivered; errors: events
missing, of watchers × (creates + updates)). cpu_s is the CPU time the datastore's
processes (`--pids` and their children: kine-rs, Go kine, etcd, nats-server, PostgreSQL,
MariaDB) used during the phase, rss_mib their resident memory at its end; with
--apiserver-pid, apiserver_cpu_s is kube-apiserver's own CPU time in the phase.
"""
import argparse
import http.client
import json
import os
import queue
import ssl
import sys
import threading
import time

PAD = "x" * 900
END = object()  # the end of a phase's queue (items may be None)


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--objects", type=int, default=500)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rate", type=int, default=100)
    p.add_argument("--rate-seconds", type=float, default=10)
    p.add_argument("--watchers", type=int, default=10)
    p.add_argument("--lists", type=int, default=5)
    p.add_argument("--pids", default="")
    p.add_argument("--apiserver-pid", type=int, help="kube-apiserver's process: its CPU per phase is reported too")
    a = p.parse_args()
    for name in ("namespaces", "objects", "clients", "rate", "lists"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.watchers < 0 or a.rate_seconds <= 0:
        p.error("--watchers must be 0 or more and --rate-seconds more than 0")
    return a


class Api:
    """One keep-alive HTTPS connection to kube-apiserver."""

    def __init__(self, args):
        host = args.server.split("://", 1)[1]
        self.host, self.port = host.rsplit(":", 1)
        self.ctx = ssl.create_default_context(cafile=args.ca)
        self.headers = {"Authorization": "Bearer " + args.token, "Content-Type": "application/json"}
        self.conn = None

    def call(self, method, path, body=None, timeout=60):
        """(status, parsed JSON body); a broken connection is opened again once."""
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, int(self.port), context=self.ctx, timeout=timeout)
            try:
                self.conn.request(method, path, body=data, headers=self.headers)
                r = self.conn.getresponse()
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[max(0, min(len(values) - 1, int(len(values) * p + 0.999999) - 1))]


def children(pids):
    """The processes `pids` and all their descendants."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    found, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(c for c, pp in parent.items() if pp == pid)
    return found


def usage(pids):
    """(CPU seconds, resident MiB) of `pids` and their children."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = rss = 0.0
    for pid in children(pids):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
            rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 1048576
        except OSError:
            pass
    return cpu, rss


def configmap(ns, name, rv=None):
    meta = {"name": name, "namespace": ns}
    if rv:
        meta["resourceVersion"] = rv
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"sent": repr(time.time()), "pad": PAD}}


class Phase:
    """Runs `work(api, item)` for every item of `items` on `clients` threads, optionally
    releasing items at `rate` per second; collects latencies and failures."""

    def __init__(self, args, name):
        self.args, self.name = args, name
        self.latencies, self.errors, self.lock = [], 0, threading.Lock()

    def run(self, items, work, rate=None):
        pids = [int(p) for p in self.args.pids.split(",") if p]
        cpu0, _ = usage(pids)
        api0 = usage([self.args.apiserver_pid])[0] if self.args.apiserver_pid else 0.0
        q = queue.Queue()
        started = time.monotonic()

        def feed():
            for i, item in enumerate(items):
                if rate:
                    delay = started + i / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                q.put(item)
            for _ in range(self.args.clients):
                q.put(END)

        def worker():
            api = Api(self.args)
            while (item := q.get()) is not END:
                t = time.monotonic()
                try:
                    ok = work(api, item)
                except Exception:  # a failed call is counted, the run goes on
                    ok = False
                with self.lock:
                    if ok:
                        self.latencies.append(time.monotonic() - t)
                    else:
                        self.errors += 1

        threads = [threading.Thread(target=feed)] + [threading.Thread(target=worker) for _ in range(self.args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - started
        cpu1, rss = usage(pids)
        api = usage([self.args.apiserver_pid])[0] - api0 if self.args.apiserver_pid else None
        report(self.args, self.name, self.latencies, self.errors, seconds, cpu1 - cpu0, rss, api)


def report(args, phase, latencies, errors, seconds, cpu, rss, apiserver_cpu=None):
    ms = [x * 1000 for x in latencies]
    print(
        f"label={args.label} phase={phase} ops={len(ms)} seconds={seconds:.2f} ops_per_s={len(ms) / seconds:.1f} "
        f"p50_ms={percentile(ms, 0.5):.2f} p99_ms={percentile(ms, 0.99):.2f} errors={errors} "
        f"cpu_s={cpu:.2f} rss_mib={rss:.1f}" + ("" if apiserver_cpu is None else f" apiserver_cpu_s={apiserver_cpu:.2f}"),
        flush=True,
    )


def watch(args, rv, delays, stop, lock):
    """One watch on every ConfigMap from `rv`, recording each ADDED/MODIFIED event's delay."""
    api = Api(args)
    api.conn = http.client.HTTPSConnection(api.host, int(api.port), context=api.ctx, timeout=3600)
    api.conn.request("GET", f"/api/v1/configmaps?watch=1&resourceVersion={rv}", headers=api.headers)
    r = api.conn.getresponse()
    while not stop.is_set():
        line = r.readline()
        if not line:
            break
        event = json.loads(line)
        if event.get("type") in ("ADDED", "MODIFIED"):
            sent = (event["object"].get("data") or {}).get("sent")
            if sent:
                with lock:
                    delays.append(time.time() - float(sent))


def main():
    args = parse()
    api = Api(args)
    namespaces = [f"bench-{i}" for i in range(args.namespaces)]
    for ns in namespaces:
        status, _ = api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        if status not in (201, 409):
            sys.exit(f"apiserver-load: creating namespace {ns}: HTTP {status}")
    status, listed = api.call("GET", "/api/v1/configmaps?limit=1")
    if status != 200:
        sys.exit(f"apiserver-load: listing ConfigMaps: HTTP {status}")
    delays, stop, lock = [], threading.Event(), threading.Lock()
    watchers = [
        threading.Thread(target=watch, args=(args, listed["metadata"]["resourceVersion"], delays, stop, lock), daemon=True)
        for _ in range(args.watchers)
    ]
    for t in watchers:
        t.start()
    watch_started = time.monotonic()
    time.sleep(1)

    objects = [(ns, f"cm-{i}") for ns in namespaces for i in range(args.objects)]
    versions = {}

    def create(api, item):
        ns, name = item
        status, body = api.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap(ns, name))
        if status == 201:
            versions[item] = body["metadata"]["resourceVersion"]
        return status == 201

    Phase(args, "create").run(objects, create)
    steady = [(namespaces[i % len(namespaces)], f"rate-{i}") for i in range(int(args.rate * args.rate_seconds))]
    Phase(args, "create-rate").run(steady, create, rate=args.rate)
    Phase(args, "get").run(objects, lambda api, o: api.call("GET", f"/api/v1/namespaces/{o[0]}/configmaps/{o[1]}")[0] == 200)

    def update(api, item):
        ns, name = item
        status, body = api.call("PUT", f"/api/v1/namespaces/{ns}/configmaps/{name}", configmap(ns, name, versions.get(item)))
        return status == 200

    updated = Phase(args, "update")
    updated.run(objects, update)
    total = len(objects) + len(steady)

    def list_all(api, rv):
        path, seen = "/api/v1/configmaps?limit=500" + (f"&resourceVersion={rv}" if rv else ""), 0
        cont = None
        while True:
            status, body = api.call("GET", path + (f"&continue={cont}" if cont else ""))
            if status != 200:
                return False
            seen += len(body["items"])
            cont = body["metadata"].get("continue")
            if not cont:
                return seen >= total
            if rv == "0":
                return False  # served from the cache: one page is the whole list

    saved = args.clients
    args.clients = 1
    Phase(args, "list").run([None] * args.lists, lambda api, _: list_all(api, None))
    Phase(args, "list-rv0").run([None] * args.lists, lambda api, _: list_all(api, "0"))
    args.clients = saved
    time.sleep(2)
    stop.set()
    with lock:
        # Every watcher should have seen every create and update (missing ones: errors).
        expected = args.watchers * (len(versions) + len(updated.latencies))
        report(args, "watch", list(delays), max(0, expected - len(delays)), time.monotonic() - watch_started, 0.0, 0.0)
    all_objects = objects + steady
    Phase(args, "delete").run(all_objects, lambda api, o: api.call("DELETE", f"/api/v1/namespaces/{o[0]}/configmaps/{o[1]}")[0] == 200)


if __name__ == "__main__":
    main()
