"""The datastores a cluster moves between, started as servers, and the conversions between them.

A store serves etcd's API on a loopback port (`url`): Go kine, kine-rs or etcd on a datastore
(`endpoint`). `Env.convert` stops the store a hop leaves (etcd and kine-rs after they were read,
when the conversion reads them live), converts its data with the command a user runs, and
starts the next one.
"""

import json
import os
import shlex
import subprocess
import time

from .proc import Abort, Proc, free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GOBIN = os.path.join(
    (subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip().split(":")[0]
     or os.path.expanduser("~/go")),
    "bin",
)
KUBE_VERSION = "1.37.2"
INSTALL = "scripts/install-test-deps"


def run(report, name, argv):
    """Runs a conversion step, its output in the log `name`; fails naming the command."""
    log = report.log(f"{name}.log")
    started = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(shlex.quote(str(a)) for a in argv)}\n".encode())
        out.flush()
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    secs = time.monotonic() - started
    if rc != 0:
        with open(log, errors="replace") as fh:
            tail = fh.read()[-1500:]
        raise Abort(f"{' '.join(map(str, argv))}: exit {rc}:\n{tail}")
    report.ok(f"{name}: {' '.join(os.path.basename(str(a)) if i == 0 else str(a) for i, a in enumerate(argv))} ({secs:.1f} s)")
    return secs


class Store:
    """A server on a datastore, answering etcd's API at `url`."""

    def __init__(self, env, kind, server, endpoint):
        self.env = env
        self.kind = kind
        self.server = server  # "Go kine", "kine-rs", "etcd"
        self.endpoint = endpoint
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.peer_port = None
        self.data_dir = None

    def describe(self):
        return f"{self.server} on {self.kind}"

    def start(self):
        env, log = self.env, self.env.report.log(f"{self.kind}-{self.server.replace(' ', '')}.log")
        if self.server == "Go kine":
            argv = [env.bin["kine"], "--endpoint", self.endpoint, "--listen-address", f"127.0.0.1:{self.port}",
                    "--metrics-bind-address", "0"]
        elif self.server == "kine-rs":
            argv = [env.bin["kine-rs"], "--endpoint", self.endpoint, "--listen-address", f"127.0.0.1:{self.port}",
                    "--metrics-bind-address", "127.0.0.1:0"]
        else:
            self.peer_port = self.peer_port or free_port()
            peer = f"http://127.0.0.1:{self.peer_port}"
            argv = [env.bin["etcd"], "--name", "switch", "--data-dir", self.data_dir,
                    "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"switch={peer}"]
        self.proc = Proc(self.describe(), argv, log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise Abort(f"{self.describe()} exited at start (log {log})")
            if self.etcdctl("get", "/kube-switch/ready").returncode == 0:
                self.env.report.ok(f"{self.describe()} serves at {self.url}")
                return self
            time.sleep(0.3)
        raise Abort(f"{self.describe()} does not answer within 60 s (log {log})")

    def stop(self):
        if self.proc is not None:
            rc = self.proc.stop()
            self.proc = None
            if self.server == "kine-rs":
                self.env.report.check(f"{self.describe()} exits 0 on SIGTERM", rc == 0, f"exit {rc}")

    def etcdctl(self, *args):
        return subprocess.run([self.env.bin["etcdctl"], "--endpoints", self.url, "--command-timeout=10s", *args],
                              capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})

    def revision(self):
        out = self.etcdctl("get", "/kube-switch/revision", "-w", "json")
        if out.returncode != 0:
            raise Abort(f"{self.describe()}: etcdctl get: {out.stderr.strip()}")
        return int(json.loads(out.stdout)["header"]["revision"])

    def compacted_at(self, rev):
        """Whether a read at `rev` answers "compacted"."""
        out = self.etcdctl("get", "/kube-switch/revision", f"--rev={rev}")
        return "compacted" in out.stderr


class Env:
    """The binaries, the throwaway PostgreSQL server when a chain needs one, the work directory."""

    def __init__(self, work, report):
        self.work = work
        self.report = report
        self.pg = None
        self.bin = {
            "kine-rs": os.environ.get("KINE_RS_BIN", os.path.join(REPO, "target/debug/kine-rs")),
            "kine": os.environ.get("GO_KINE_BIN", os.path.join(GOBIN, "kine")),
            "kube-apiserver": os.environ.get("KUBE_APISERVER_BIN", os.path.join(GOBIN, f"kube-apiserver-{KUBE_VERSION}")),
            "kube-controller-manager": os.environ.get(
                "KUBE_CONTROLLER_MANAGER_BIN", os.path.join(GOBIN, f"kube-controller-manager-{KUBE_VERSION}")),
            "etcd": os.environ.get("ETCD_BIN", os.path.join(GOBIN, "etcd-3.7")),
            "etcdutl": os.environ.get("ETCDUTL_BIN", os.path.join(GOBIN, "etcdutl-3.7")),
            "etcdctl": os.environ.get("ETCDCTL_BIN", "etcdctl"),
        }

    def check_binaries(self, chain):
        need = ["kine-rs", "kube-apiserver", "kube-controller-manager", "etcdctl", "openssl"]
        if any(k.startswith("gokine") for k in chain):
            need.append("kine")
        if any(k.startswith("etcd") for k in chain):
            need += ["etcd", "etcdutl"]
        hints = {"kine-rs": "cargo build -p kine-rs, or set KINE_RS_BIN", "etcdctl": "apt-get install etcd-client",
                 "openssl": "apt-get install openssl"}
        for name in need:
            path = self.bin.get(name, name)
            found = os.access(path, os.X_OK) if os.sep in path else any(
                os.access(os.path.join(d, path), os.X_OK) for d in os.environ.get("PATH", "").split(":"))
            if not found:
                raise Abort(f"{name} missing at {path} ({hints.get(name, INSTALL)})")
        if "gokine-postgres" in chain:
            self.start_postgres()

    def start_postgres(self):
        script = (f"source {shlex.quote(os.path.join(REPO, 'scripts/pg-throwaway.sh'))} && pg_throwaway_start >&2 && "
                  'echo "$PG_THROWAWAY_URL"; echo "$PG_THROWAWAY_DIR"; echo "$PG_THROWAWAY_BIN"')
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        if out.returncode != 0:
            raise Abort(f"cannot start PostgreSQL (apt-get install postgresql, run by {INSTALL}): {out.stderr[-800:]}")
        self.pg = out.stdout.split("\n")[:3]
        self.report.ok(f"PostgreSQL at {self.pg[0]}")

    def cleanup(self):
        if self.pg:
            as_pg = "PG_THROWAWAY_AS=(runuser -u postgres --)" if os.getuid() == 0 else "PG_THROWAWAY_AS=()"
            script = (f"source {shlex.quote(os.path.join(REPO, 'scripts/pg-throwaway.sh'))} && "
                      f"PG_THROWAWAY_DIR={shlex.quote(self.pg[1])} PG_THROWAWAY_BIN={shlex.quote(self.pg[2])} && "
                      f"{as_pg} && pg_throwaway_stop")
            subprocess.run(["bash", "-c", script], capture_output=True)

    def pg_url(self, db):
        return f"{self.pg[0]}/{db}?sslmode=disable"

    def store(self, kind):
        w = self.work
        if kind == "gokine-sqlite":
            # The URL k3s gives Go kine for its embedded SQLite.
            return Store(self, kind, "Go kine", f"sqlite://{w}/state.db?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate")
        if kind == "gokine-sqlite-back":
            return Store(self, kind, "Go kine", f"sqlite://{w}/back.db?_journal=WAL&cache=shared&_busy_timeout=30000&_txlock=immediate")
        if kind == "kiners-sqlite":
            return Store(self, kind, "kine-rs", f"sqlite://{w}/kiners.db")
        if kind == "kiners-nats":
            return Store(self, kind, "kine-rs", f"nats://?dataDir={w}/nats")
        if kind == "gokine-postgres":
            return Store(self, kind, "Go kine", self.pg_url("gokine"))
        if kind == "kiners-postgres":
            return Store(self, kind, "kine-rs", self.pg_url("kiners"))
        if kind == "gokine-postgres-back":
            return Store(self, kind, "Go kine", self.pg_url("back"))
        if kind in ("etcd", "etcd-back"):
            s = Store(self, kind, "etcd", None)
            s.data_dir = os.path.join(w, kind)
            return s
        raise Abort(f"unknown store {kind}")

    def start(self, kind):
        return self.store(kind).start()

    def convert(self, source, kind):
        """Moves `source`'s data into a new store `kind` and starts it; `source` is stopped."""
        target = self.store(kind)
        migrate = [self.bin["kine-rs"], "migrate", "--from", source.endpoint or source.url, "--to"]
        if target.server == "etcd":
            # kine-rs -> etcd: etcd's own snapshot of the running kine-rs, restored by etcdutl.
            snap = os.path.join(self.work, f"{source.kind}.snapshot.db")
            run(self.report, "snapshot save", [self.bin["etcdctl"], "--endpoints", source.url, "snapshot", "save", snap])
            source.stop()
            target.peer_port = free_port()
            peer = f"http://127.0.0.1:{target.peer_port}"
            run(self.report, "snapshot restore", [self.bin["etcdutl"], "snapshot", "restore", snap, "--data-dir",
                                                  target.data_dir, "--name", "switch", "--initial-cluster",
                                                  f"switch={peer}", "--initial-advertise-peer-urls", peer])
        elif source.server == "etcd":
            # Live etcd -> kine-rs: read over etcd's API while it runs (kube-apiserver stopped).
            run(self.report, "migrate", migrate + [target.endpoint])
            source.stop()
        else:
            source.stop()
            back = ["--to-go-kine"] if target.server == "Go kine" else []
            run(self.report, "migrate", migrate + [target.endpoint] + back)
        return target.start()
