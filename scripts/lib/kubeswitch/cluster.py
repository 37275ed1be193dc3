"""kube-apiserver and kube-controller-manager on a store, driven over the Kubernetes API: the
objects of one namespace built and changed, frozen before a switch, checked after it."""

import concurrent.futures
import http.client
import json
import secrets
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse

from . import apiserver_files
from .proc import Abort, Proc, free_port

NS = "switch"
GROUP = "switch.example.com"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/{NS}/widgets"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
# Everything of the test namespace, listed and compared across a switch.
LISTS = [
    CONFIGMAPS,
    f"/api/v1/namespaces/{NS}/secrets",
    f"/api/v1/namespaces/{NS}/pods",
    f"/api/v1/namespaces/{NS}/serviceaccounts",
    f"/apis/apps/v1/namespaces/{NS}/deployments",
    f"/apis/apps/v1/namespaces/{NS}/replicasets",
    WIDGETS,
]
SINGLES = [f"/api/v1/namespaces/{NS}", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{GROUP}"]
WORKERS = 8


class Frozen:
    """The namespace's objects before a switch, and a watch opened at the newest resourceVersion."""

    def __init__(self, objects, rv, watch):
        self.objects = objects
        self.rv = rv
        self.watch = watch


class Watch(threading.Thread):
    """A watch of ConfigMaps from `rv`, its events kept; ends when the server closes it."""

    def __init__(self, cluster, rv):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.rv = rv
        self.last_rv = rv
        self.events = []
        self.status = None
        self.opened = threading.Event()
        self.conn = None

    def run(self):
        q = urllib.parse.urlencode({"watch": "1", "resourceVersion": self.rv, "allowWatchBookmarks": "true",
                                    "timeoutSeconds": "300"})
        try:
            self.conn = self.cluster.connection(timeout=310)
            self.conn.request("GET", f"{CONFIGMAPS}?{q}", headers=self.cluster.headers())
            resp = self.conn.getresponse()
            self.status = resp.status
            self.opened.set()
            if resp.status != 200:
                self.events.append({"type": "HTTP", "object": {"code": resp.status, "message": resp.read()[:500].decode()}})
                return
            while True:
                line = resp.readline()
                if not line:
                    return
                ev = json.loads(line)
                self.events.append(ev)
                rv = ev.get("object", {}).get("metadata", {}).get("resourceVersion")
                if rv and ev.get("type") != "ERROR":
                    self.last_rv = rv
        except (OSError, http.client.HTTPException, ValueError):
            return
        finally:
            self.opened.set()

    def close(self):
        """Disconnects (a shutdown wakes the reading thread), then waits for the thread to end."""
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.join(10)


class Cluster:
    def __init__(self, work, report, bins):
        self.work = work
        self.report = report
        self.bin = bins
        self.apiserver = None
        self.kcm = None
        self.local = threading.local()
        self.port = free_port()
        self.replicas = 3
        self.hop = 0
        self.watches = []
        self._certificates()

    # ------------------------------------------------------------------ processes

    def _certificates(self):
        self.token = apiserver_files.write(self.work, self.port, "kube-switch")
        self.tls = ssl.create_default_context(cafile=f"{self.work}/serving.crt")

    def start(self, store):
        """kube-apiserver on `store` (the same port, certificates and flags at every hop)."""
        w = self.work
        argv = [
            self.bin["kube-apiserver"], f"--etcd-servers={store.url}", "--etcd-compaction-interval=10s",
            # ConfigMaps are watched from the store itself: a watch resumed at an old
            # resourceVersion reads the store's history, not a cache filled at start.
            "--watch-cache-sizes=configmaps#0",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={w}/serving.crt", f"--tls-private-key-file={w}/serving.key",
            f"--cert-dir={w}/apiserver-certs", f"--token-auth-file={w}/tokens.csv", "--authorization-mode=AlwaysAllow",
            "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={w}/sa.key",
            f"--service-account-signing-key-file={w}/sa.key", "--service-cluster-ip-range=10.96.0.0/24",
            "--endpoint-reconciler-type=none", "--profiling=false",
        ]
        self.hop += 1
        started = time.monotonic()
        self.apiserver = Proc("kube-apiserver", argv, self.report.log(f"kube-apiserver-{self.hop}.log"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not self.apiserver.alive():
                raise Abort(f"kube-apiserver exited at start on {store.describe()}")
            try:
                if self.get("/readyz", raw=True) == "ok":
                    self.report.ok(f"kube-apiserver ready on {store.describe()} in {time.monotonic() - started:.0f} s")
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise Abort(f"kube-apiserver not ready within 120 s on {store.describe()}")

    def start_controllers(self):
        if self.kcm is not None:
            return
        argv = [self.bin["kube-controller-manager"], f"--kubeconfig={self.work}/kubeconfig", "--secure-port=0",
                "--leader-elect=false",
                "--controllers=namespace-controller,deployment-controller,replicaset-controller,"
                "serviceaccount-controller,garbage-collector-controller"]
        self.kcm = Proc("kube-controller-manager", argv, self.report.log(f"kube-controller-manager-{self.hop}.log"))

    def stop_controllers(self):
        if self.kcm is not None:
            self.kcm.stop()
            self.kcm = None

    def stop(self):
        """Stops the controllers, then kube-apiserver. Open watches are closed from the client side
        first (kube-apiserver waits for them to end before it exits): a client disconnected by the
        switch, as a stop would disconnect it."""
        self.stop_controllers()
        for w in self.watches:
            w.close()
        self.watches = []
        if self.apiserver is not None:
            started = time.monotonic()
            rc = self.apiserver.stop()
            self.report.note(f"kube-apiserver stopped in {time.monotonic() - started:.1f} s (exit {rc})")
            self.apiserver = None
        self.local = threading.local()

    # ------------------------------------------------------------------ the API

    def connection(self, timeout=60):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.tls, timeout=timeout)

    def headers(self, ctype="application/json"):
        return {"Authorization": f"Bearer {self.token}", "Content-Type": ctype, "Accept": "application/json"}

    def call(self, method, path, body=None, ctype="application/json", ok=(200, 201), raw=False):
        """One request; answers 429 (a cache still initializing after a start) are retried for 60 s."""
        deadline = time.monotonic() + 60
        while True:
            status, data = self._call(method, path, body, ctype)
            if status != 429 or time.monotonic() > deadline:
                break
            time.sleep(1)
        if raw:
            return data.decode()
        if status not in ok:
            raise Abort(f"{method} {path}: HTTP {status}: {data[:400].decode(errors='replace')}")
        return json.loads(data) if data else None

    def _call(self, method, path, body, ctype):
        conn = getattr(self.local, "conn", None)
        for attempt in range(2):
            if conn is None:
                conn = self.local.conn = self.connection()
            try:
                conn.request(method, path, body=json.dumps(body) if body is not None else None,
                             headers=self.headers(ctype))
                resp = conn.getresponse()
                data = resp.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = self.local.conn = None
                if attempt == 1:
                    raise
        return resp.status, data

    def get(self, path, raw=False):
        return self.call("GET", path, raw=raw)

    def parallel(self, what, fn, items):
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(fn, items))
        self.report.ok(f"{what} ({len(items)} requests, {time.monotonic() - started:.1f} s)")

    def wait(self, what, timeout, cond):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = cond()
                if last is True:
                    self.report.ok(what)
                    return True
            except Abort as e:
                last = str(e)
            time.sleep(0.5)
        self.report.fail(f"{what} (within {timeout} s; last: {last})")
        return False

    # ------------------------------------------------------------------ the workload

    def cm(self, name, value):
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"set": "switch"}},
                "data": {"v": value}}

    def build(self, objects):
        """The cluster of the first store: CRD and objects, a Deployment, ConfigMaps, Secrets."""
        self.start_controllers()
        self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
        }
        self.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        established = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{GROUP}"
        self.wait("the CustomResourceDefinition is established", 60, lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (self.get(established).get("status") or {}).get("conditions") or []))
        self.wait("the Widget API is served", 60, lambda: self.call("GET", WIDGETS, ok=(200,)) is not None)
        widget = lambda i: {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": f"w-{i:04d}"},
                            "spec": {"size": i}}
        self.parallel("create 100 Widgets", lambda i: self.call("POST", WIDGETS, widget(i)), range(100))
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": self.replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}}},
        }
        self.call("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", deployment)
        self.wait_pods(self.replicas)
        n = objects
        self.parallel(f"create {n} ConfigMaps", lambda i: self.call("POST", CONFIGMAPS, self.cm(f"cm-{i:05d}", "0")),
                      range(n))
        secret = lambda i: {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"s-{i:05d}"},
                            "stringData": {"token": secrets.token_hex(8)}}
        self.parallel(f"create {n // 5} Secrets", lambda i: self.call("POST", f"/api/v1/namespaces/{NS}/secrets",
                                                                      secret(i)), range(n // 5))
        self.update_cms("update", range(0, n // 2, 2), "1")
        self.parallel("patch 50 Widgets", lambda i: self.call(
            "PATCH", f"{WIDGETS}/w-{i:04d}", {"spec": {"size": i * 10}}, "application/merge-patch+json"), range(50))
        self.parallel("delete 20 Widgets", lambda i: self.call("DELETE", f"{WIDGETS}/w-{i:04d}"), range(80, 100))
        self.parallel(f"delete {n // 10} ConfigMaps",
                      lambda i: self.call("DELETE", f"{CONFIGMAPS}/cm-{i:05d}"), range(n - n // 10, n))
        self.made = n - n // 10

    def update_cms(self, what, names, value):
        self.parallel(f"{what} {len(names)} ConfigMaps", lambda i: self.call(
            "PATCH", f"{CONFIGMAPS}/cm-{i:05d}", {"data": {"v": value}}, "application/merge-patch+json"), names)

    def churn(self, where):
        """More writes on the store a hop reached, for the next hop to carry (and compact)."""
        base = 100000 * self.hop
        self.parallel(f"create 600 ConfigMaps on {where}",
                      lambda i: self.call("POST", CONFIGMAPS, self.cm(f"cm-{base + i:06d}", "0")), range(600))
        self.parallel(f"update 400 ConfigMaps on {where}", lambda i: self.call(
            "PATCH", f"{CONFIGMAPS}/cm-{base + i:06d}", {"data": {"v": "1"}}, "application/merge-patch+json"),
            range(400))
        self.parallel(f"delete 200 ConfigMaps on {where}",
                      lambda i: self.call("DELETE", f"{CONFIGMAPS}/cm-{base + 400 + i:06d}"), range(200))

    def wait_pods(self, n):
        def pods():
            items = self.get(f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dweb")["items"]
            live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
            return True if len(live) == n else f"{len(live)} pods"
        self.wait(f"the Deployment's ReplicaSet runs {n} Pods", 90, pods)

    def wait_for_compaction(self, store, rev):
        """Waits until kube-apiserver's compaction has passed `rev` (Go kine keeps the newest 1,000
        revisions whatever the apiserver asks)."""
        self.wait(f"kube-apiserver's compaction passes revision {rev} on {store.describe()}", 120,
                  lambda: store.compacted_at(rev) or "not compacted yet")

    # ------------------------------------------------------------------ across a switch

    def snapshot(self):
        objects = {}
        for path in LISTS:
            for item in self.get(path)["items"]:
                m = item["metadata"]
                objects[f"{path}/{m['name']}"] = (m["uid"], m["resourceVersion"])
        for path in SINGLES:
            m = self.get(path)["metadata"]
            objects[path] = (m["uid"], m["resourceVersion"])
        return objects

    def freeze(self):
        """Controllers stopped, the namespace listed, a watch opened at the list's resourceVersion."""
        self.stop_controllers()
        objects = self.snapshot()
        rv = self.get(CONFIGMAPS + "?limit=1")["metadata"]["resourceVersion"]
        watch = Watch(self, rv)
        self.watches.append(watch)
        watch.start()
        watch.opened.wait(10)
        self.report.check(f"a watch of ConfigMaps opened at resourceVersion {rv} before the switch",
                          watch.status == 200, f"status {watch.status}, events {watch.events[:2]}")
        self.report.note(f"{len(objects)} objects frozen, newest resourceVersion {rv}")
        return Frozen(objects, rv, watch)

    def check_same(self, before, where):
        after = self.snapshot()
        missing = sorted(set(before.objects) - set(after))
        extra = sorted(set(after) - set(before.objects))
        changed = sorted(k for k in before.objects if k in after and after[k] != before.objects[k])
        detail = "; ".join(f"{what} {len(keys)}: {keys[:5]}" for what, keys in
                           (("missing", missing), ("extra", extra), ("changed", changed)) if keys)
        self.report.check(f"{where} serves all {len(before.objects)} objects with the same uid and resourceVersion",
                          not detail, detail)

    def check_watch_resumes(self, before, where):
        old = before.watch
        old.join(30)
        old.close()
        self.report.check("the watch opened before the switch saw no change of ConfigMaps",
                          all(e.get("type") == "BOOKMARK" for e in old.events), f"{old.events[:3]}")
        watch = Watch(self, old.last_rv)
        watch.start()
        watch.opened.wait(10)
        name = f"after-switch-{self.hop}"
        self.call("POST", CONFIGMAPS, self.cm(name, "new"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                e.get("object", {}).get("metadata", {}).get("name") == name for e in watch.events):
            if any(e.get("type") in ("ERROR", "HTTP") for e in watch.events):
                break
            time.sleep(0.2)
        watch.close()
        kinds = [(e.get("type"), e.get("object", {}).get("metadata", {}).get("name") or e.get("object", {}).get("code"))
                 for e in watch.events if e.get("type") != "BOOKMARK"]
        self.report.check(f"on {where}, a watch at resourceVersion {old.last_rv} goes on (no 410) with the next change",
                          kinds == [("ADDED", name)], f"events: {kinds[:5]} {watch.events[:1]}")

    def check_controllers(self, where):
        self.start_controllers()
        self.replicas += 2
        self.call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/web", {"spec": {"replicas": self.replicas}},
                  "application/merge-patch+json")
        self.wait_pods(self.replicas)

