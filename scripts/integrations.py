#!/usr/bin/env python3
"""The guides in docs/integrations.md, run as written.

Every block marked `*tested: NAME*` there is taken from the file and run: the shell blocks
with bash (-euo pipefail; the functions and a few variables a block defines are kept for the
next ones, as in one terminal session), the `*-apiserver` blocks (kube-apiserver's etcd flags,
one per line) as the etcd flags of a real kube-apiserver 1.37, with this test's own serving
certificate, token and service-account keys. Each kube-apiserver must become ready, create and
read back a namespace and a ConfigMap, and put the ConfigMap's key where that product's prefix
puts it (checked with etcdctl). Kamaji's DataStore is applied after Kamaji's CRD, from the Go
module proxy. With etcd's auth enabled (the Kamaji section), the tenant must not read outside
its prefix.

    scripts/integrations.py [--keep]

Environment: KINE_RS_BIN (default target/debug/kine-rs), KUBE_APISERVER_BIN and KUBECTL_BIN
(~/go/bin/NAME-1.37.2), etcdctl on PATH. Prints `integrations: PASS (N checks)` or FAIL.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from kubeswitch import apiserver_files  # noqa: E402
from kubeswitch.proc import Proc, free_port  # noqa: E402

GUIDE = os.path.join(ROOT, "docs", "integrations.md")
KUBE_VERSION = "1.37.2"
KAMAJI = "github.com/clastix/kamaji@v1.0.0"
# The block order of a run, and the prefix each kube-apiserver block puts its keys under.
ORDER = ["certs", "kine-rs", "check", "k3s-bootstrap", "k3s-apiserver", "k0s-apiserver", "vcluster-members",
         "vcluster-apiserver", "kamaji-datastore", "kamaji-auth", "kamaji-tenant", "kamaji-apiserver"]
PREFIX = {"k3s-apiserver": "/registry", "k0s-apiserver": "/k0s-tenant", "vcluster-apiserver": "/registry",
          "kamaji-apiserver": "/$TENANT"}
# Variables a block may set that later blocks use.
KEPT_VARIABLES = ["TENANT", "ec"]


class Fail(Exception):
    pass


def blocks():
    """{name: (language, text)} of the tested blocks: a `*tested: NAME…*` line, then a fence."""
    text = open(GUIDE).read()
    found = {}
    for m in re.finditer(r"^\*tested: ([a-z0-9-]+)[^*\n]*\*\n```(\w+)\n(.*?)^```", text, re.S | re.M):
        name, lang, body = m.group(1), m.group(2), m.group(3)
        if name in found:
            raise Fail(f"docs/integrations.md: two blocks named {name}")
        found[name] = (lang, body)
    missing = [n for n in ORDER if n not in found]
    extra = [n for n in found if n not in ORDER]
    if missing or extra:
        raise Fail(f"docs/integrations.md: tested blocks missing {missing}, not run by this script {extra}")
    return found


class Run:
    def __init__(self, work):
        self.work = work
        self.checks = 0
        self.procs = []
        self.port = free_port()
        gobin = os.path.expanduser("~/go/bin")
        self.bin = {
            "kine-rs": os.environ.get("KINE_RS_BIN", os.path.join(ROOT, "target", "debug", "kine-rs")),
            "kube-apiserver": os.environ.get("KUBE_APISERVER_BIN", f"{gobin}/kube-apiserver-{KUBE_VERSION}"),
            "kubectl": os.environ.get("KUBECTL_BIN", f"{gobin}/kubectl-{KUBE_VERSION}"),
        }
        for name, path in self.bin.items():
            if not os.access(path, os.X_OK):
                raise Fail(f"{name} missing at {path} (scripts/install-test-deps builds it)")
        if shutil.which("etcdctl") is None:
            raise Fail("etcdctl missing (apt-get install etcd-client)")
        # kine-rs and kubectl by their plain names, as the guide calls them.
        self.path_dir = os.path.join(work, "bin")
        os.makedirs(self.path_dir)
        os.symlink(os.path.abspath(self.bin["kine-rs"]), os.path.join(self.path_dir, "kine-rs"))
        os.symlink(self.bin["kubectl"], os.path.join(self.path_dir, "kubectl"))
        self.env = dict(os.environ)
        self.env.update({
            "PATH": f"{self.path_dir}:{os.environ['PATH']}",
            "PKI": os.path.join(work, "pki"), "DATA": os.path.join(work, "data"),
            "KINE_RS_HOST": "localhost", "KINE_RS_IP": "127.0.0.1", "KINE_RS_PORT": str(self.port),
            # Not the default metrics port: other suites run beside this one.
            "KINE_METRICS_BIND_ADDRESS": "0",
            "KUBECONFIG": os.path.join(work, "kubeconfig"),
        })
        os.makedirs(self.env["DATA"])
        self.state = os.path.join(work, "session.sh")
        open(self.state, "w").close()
        self.api_port = free_port()
        self.apiserver_certificates()

    def ok(self, what):
        self.checks += 1
        print(f"ok {self.checks} - {what}", flush=True)

    def log(self, name):
        return os.path.join(self.work, f"{name}.log")

    # ------------------------------------------------------------------ shell blocks

    def shell(self, name, body, background=False):
        """Runs a shell block after the session so far; keeps its functions and variables."""
        keep = " ".join(KEPT_VARIABLES)
        script = (f"set -euo pipefail\nsource {self.state}\ncd {self.work}\n{body}\n"
                  f"{{ declare -f; declare -p {keep} 2>/dev/null || true; }} > {self.state}.new\n"
                  f"mv {self.state}.new {self.state}\n")
        if background:
            proc = Proc(name, ["bash", "-c", f"set -euo pipefail\nsource {self.state}\ncd {self.work}\nexec {body}"],
                        self.log(name), env=self.env)
            self.procs.append(proc)
            return proc
        out = subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=120)
        with open(self.log(name), "w") as f:
            f.write(out.stdout + out.stderr)
        if out.returncode != 0:
            raise Fail(f"block {name} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        self.ok(f"block {name} ran")
        return out.stdout

    def session_value(self, variable):
        out = subprocess.run(["bash", "-c", f"source {self.state}; printf %s \"${variable}\""], capture_output=True,
                             text=True)
        return out.stdout

    def expand(self, text):
        def value(m):
            name = m.group(1)
            v = self.env.get(name) or self.session_value(name)
            if not v:
                raise Fail(f"${name} is not set where the guide uses it")
            return v
        return re.sub(r"\$([A-Z_][A-Z0-9_]*)", value, text)

    def etcdctl(self, cert, *args):
        pki = self.env["PKI"]
        argv = ["etcdctl", f"--endpoints=https://127.0.0.1:{self.port}", f"--cacert={pki}/ca.crt",
                f"--cert={pki}/{cert}.crt", f"--key={pki}/{cert}.key", "--dial-timeout=5s", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    # ------------------------------------------------------------------ kine-rs

    def start_kine_rs(self, body):
        proc = self.shell("kine-rs", body.replace("\\\n", " ").strip(), background=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            log = open(proc.log).read()
            if "kine-rs ready" in log:
                pki = self.env["PKI"]
                expected = f"tls=certificate {pki}/server.crt, client certificates signed by {pki}/ca.crt"
                if expected not in log:
                    raise Fail(f"kine-rs's ready line does not name its TLS files ({expected}):\n{log}")
                self.ok("kine-rs ready with client-certificate TLS, its files named")
                return
            if not proc.alive():
                raise Fail(f"kine-rs exited at start:\n{log}")
            time.sleep(0.2)
        raise Fail("kine-rs not ready within 60 s")

    # ------------------------------------------------------------------ kube-apiserver

    def apiserver_certificates(self):
        apiserver_files.write(self.work, self.api_port, "integrations")

    def kubectl(self, *args, check=True):
        out = subprocess.run([self.bin["kubectl"], *args], env=self.env, capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise Fail(f"kubectl {' '.join(args)}: {out.stdout}{out.stderr}")
        return out

    def start_apiserver(self, name, body):
        flags = [self.expand(line.strip()) for line in body.splitlines() if line.strip()]
        w = self.work
        argv = [self.bin["kube-apiserver"], *flags,
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
                f"--tls-cert-file={w}/serving.crt", f"--tls-private-key-file={w}/serving.key",
                f"--cert-dir={w}/apiserver-certs", f"--token-auth-file={w}/tokens.csv",
                "--authorization-mode=AlwaysAllow", "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={w}/sa.key", f"--service-account-signing-key-file={w}/sa.key",
                "--service-cluster-ip-range=10.96.0.0/24", "--endpoint-reconciler-type=none", "--profiling=false"]
        proc = Proc(name, argv, self.log(name))
        self.procs.append(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not proc.alive():
                raise Fail(f"kube-apiserver ({name}) exited at start; its log: {proc.log}\n{tail(proc.log)}")
            if self.kubectl("get", "--raw=/readyz", check=False).stdout.strip() == "ok":
                self.ok(f"kube-apiserver ready with the etcd flags of {name}")
                return proc
            time.sleep(0.5)
        raise Fail(f"kube-apiserver ({name}) not ready within 120 s; its log: {proc.log}\n{tail(proc.log)}")

    def check_apiserver(self, name, cert):
        ns = f"guide-{name.split('-')[0]}"
        self.kubectl("create", "namespace", ns)
        self.kubectl("-n", ns, "create", "configmap", "probe", "--from-literal=written=by-kube-apiserver")
        got = self.kubectl("-n", ns, "get", "configmap", "probe", "-o", "jsonpath={.data.written}").stdout
        if got != "by-kube-apiserver":
            raise Fail(f"{name}: the ConfigMap read back {got!r}")
        self.ok(f"{name}: kube-apiserver created and read a namespace and a ConfigMap")
        key = f"{self.expand(PREFIX[name])}/configmaps/{ns}/probe"
        out = self.etcdctl(cert, "get", key, "--keys-only")
        if out.returncode != 0 or out.stdout.strip() != key:
            raise Fail(f"{name}: the ConfigMap's key {key} is not in kine-rs: {out.stdout}{out.stderr}")
        self.ok(f"{name}: the ConfigMap is at {key}")

    def kamaji_crd(self):
        """Kamaji's DataStore CRD from the Go module proxy, applied and established."""
        out = subprocess.run(["go", "mod", "download", "-json", KAMAJI], capture_output=True, text=True, timeout=300,
                             cwd=self.work, env={**os.environ, "GOFLAGS": "-mod=mod"})
        m = re.search(r'"Dir": "([^"]+)"', out.stdout)
        if out.returncode != 0 or not m:
            raise Fail(f"go mod download {KAMAJI}: {out.stdout}{out.stderr}")
        crd = os.path.join(m.group(1), "charts", "kamaji", "crds", "datastore.yaml")
        self.kubectl("apply", "-f", crd)
        self.kubectl("wait", "--for=condition=Established", "crd/datastores.kamaji.clastix.io", "--timeout=60s")
        self.ok(f"Kamaji's DataStore CRD ({KAMAJI}) established")

    # ------------------------------------------------------------------ the run

    def run(self):
        guide = blocks()
        apiserver = None
        for name in ORDER:
            lang, body = guide[name]
            if name == "kine-rs":
                self.start_kine_rs(body)
            elif name.endswith("-apiserver"):
                if apiserver is not None:
                    apiserver.stop()
                apiserver = self.start_apiserver(name, body)
                cert = "tenant" if name.startswith("kamaji") else "apiserver"
                self.check_apiserver(name, cert)
            elif name == "kamaji-datastore":
                self.kamaji_crd()
                self.shell(name, body)
                got = self.kubectl("get", "datastore", "kine-rs", "-o", "jsonpath={.spec.driver} {.spec.endpoints[0]}")
                expected = f"etcd localhost:{self.port}"
                if got.stdout != expected:
                    raise Fail(f"the DataStore reads back {got.stdout!r}, not {expected!r}")
                self.ok("the Kamaji DataStore was accepted by kube-apiserver with Kamaji's CRD")
                apiserver.stop()
                apiserver = None
            else:
                self.shell(name, body)
        # With auth on: the tenant stays in its prefix, and the guide's other client has no user.
        out = self.etcdctl("tenant", "get", "/registry/", "--prefix", "--keys-only")
        if out.returncode == 0 or "permission denied" not in out.stderr:
            raise Fail(f"the tenant read outside its prefix: {out.stdout}{out.stderr}")
        self.ok("the Kamaji tenant cannot read outside its prefix (etcdserver: permission denied)")
        out = self.etcdctl("apiserver", "get", "/registry/", "--prefix", "--keys-only")
        if out.returncode == 0:
            raise Fail("with auth enabled, a certificate without a user still reads")
        self.ok("with auth enabled, a certificate whose CommonName has no user is refused")
        if apiserver is not None:
            apiserver.stop()

    def stop(self):
        for p in reversed(self.procs):
            p.stop()


def tail(path, lines=30):
    try:
        return "".join(open(path, errors="replace").readlines()[-lines:])
    except OSError:
        return ""


def main():
    keep = "--keep" in sys.argv[1:]
    work = tempfile.mkdtemp(prefix="kine-rs-integrations.")
    run = None
    started = time.monotonic()
    try:
        run = Run(work)
        run.run()
    except Fail as e:
        print(f"not ok - {e}", flush=True)
        print(f"integrations: FAIL ({run.checks if run else 0} checks passed, {time.monotonic() - started:.0f} s; "
              f"logs in {work})")
        if run:
            run.stop()
        return 1
    finally:
        if run:
            run.stop()
    print(f"integrations: PASS ({run.checks} checks, {time.monotonic() - started:.0f} s)")
    if keep:
        print(f"integrations: kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
