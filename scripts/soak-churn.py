#!/usr/bin/env python3
"""The soak's client (scripts/soak.sh): churns ConfigMaps through kube-apiserver's REST API as
controllers do, and keeps a watch open as an informer does, with the Python standard library only.

    soak-churn.py --server https://127.0.0.1:PORT --ca CA.crt --token TOKEN --namespace NS
                  --rate OPS_PER_S --objects N --stats FILE --stop FILE

Every operation (create, get, update with the resourceVersion read, list, delete) is timed; each
second the counts, errors and latencies of the second are appended to FILE as one JSON line. The
watch resumes from the last resourceVersion it saw after an error (a 410 Gone starts it again
from a fresh list, as a reflector does); its gaps are counted. Runs until the file STOP exists.
"""
import argparse
import json
import os
import random
import ssl
import threading
import time
import urllib.error
import urllib.request

LOCK = threading.Lock()
STATS = {"ops": 0, "errors": {}, "latencies": [], "watch_events": 0, "watch_restarts": 0, "watch_gone": 0}


def record(latency, error=None):
    with LOCK:
        STATS["ops"] += 1
        STATS["latencies"].append(latency)
        if error:
            STATS["errors"][error] = STATS["errors"].get(error, 0) + 1


class Api:
    def __init__(self, server, ca, token):
        self.server = server
        self.ctx = ssl.create_default_context(cafile=ca)
        self.headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}

    def call(self, method, path, body=None, timeout=30):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=self.headers)
        start = time.monotonic()
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                answer = json.loads(r.read() or b"{}")
            record(time.monotonic() - start)
            return answer
        except urllib.error.HTTPError as e:
            # A conflict or a missing object is an answer (another writer came first), not a failure.
            if e.code in (404, 409):
                record(time.monotonic() - start)
                return None
            record(time.monotonic() - start, f"http {e.code}")
        except Exception as e:  # noqa: BLE001 - any failure to get an answer counts
            record(time.monotonic() - start, type(e).__name__)
        return None


def churn(api, ns, rate, objects, stop):
    base = f"/api/v1/namespaces/{ns}/configmaps"
    interval = 1.0 / rate
    next_at = time.monotonic()
    n = 0
    while not os.path.exists(stop):
        n += 1
        name = f"cm-{random.randrange(objects)}"
        roll = random.random()
        if roll < 0.35:
            api.call("POST", base, {"metadata": {"name": name}, "data": {"n": str(n), "pad": "x" * 512}})
        elif roll < 0.65:
            cm = api.call("GET", f"{base}/{name}")
            if cm:
                cm["data"] = {"n": str(n), "pad": "y" * 512}
                api.call("PUT", f"{base}/{name}", cm)
        elif roll < 0.80:
            api.call("GET", f"{base}/{name}")
        elif roll < 0.90:
            api.call("GET", f"{base}?limit=100")
        else:
            api.call("DELETE", f"{base}/{name}")
        next_at += interval
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.monotonic()


def watch(api, ns, stop):
    base = f"/api/v1/namespaces/{ns}/configmaps"
    rv = None
    while not os.path.exists(stop):
        if rv is None:
            listed = api.call("GET", base)
            if not listed:
                time.sleep(1)
                continue
            rv = listed["metadata"]["resourceVersion"]
        req = urllib.request.Request(
            f"{api.server}{base}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=60",
            headers=api.headers,
        )
        try:
            with urllib.request.urlopen(req, context=api.ctx, timeout=90) as r:
                for line in r:
                    if os.path.exists(stop):
                        return
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":
                        if ev.get("object", {}).get("code") == 410:
                            with LOCK:
                                STATS["watch_gone"] += 1
                            rv = None
                        break
                    rv = ev["object"]["metadata"]["resourceVersion"]
                    with LOCK:
                        STATS["watch_events"] += 1
        except Exception:  # noqa: BLE001 - a broken watch is resumed
            time.sleep(1)
        with LOCK:
            STATS["watch_restarts"] += 1


def report(stats_file, stop):
    with open(stats_file, "a") as out:
        while not os.path.exists(stop):
            time.sleep(1)
            with LOCK:
                lat = sorted(STATS["latencies"])
                line = {
                    "t": round(time.time(), 3),
                    "ops": STATS["ops"],
                    "errors": STATS["errors"],
                    "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
                    "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2) if lat else None,
                    "watch_events": STATS["watch_events"],
                    "watch_restarts": STATS["watch_restarts"],
                    "watch_gone": STATS["watch_gone"],
                }
                STATS.update(ops=0, errors={}, latencies=[], watch_events=0, watch_restarts=0, watch_gone=0)
            out.write(json.dumps(line) + "\n")
            out.flush()


def main():
    p = argparse.ArgumentParser()
    for flag in ("--server", "--ca", "--token", "--namespace", "--stats", "--stop"):
        p.add_argument(flag, required=True)
    p.add_argument("--rate", type=float, default=20)
    p.add_argument("--objects", type=int, default=200)
    a = p.parse_args()
    api = Api(a.server, a.ca, a.token)
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": a.namespace}})
    threads = [
        threading.Thread(target=churn, args=(api, a.namespace, a.rate, a.objects, a.stop), daemon=True),
        threading.Thread(target=watch, args=(api, a.namespace, a.stop), daemon=True),
    ]
    for t in threads:
        t.start()
    report(a.stats, a.stop)


if __name__ == "__main__":
    main()
