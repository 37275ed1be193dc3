#!/usr/bin/env python3
"""A real kube-apiserver and kube-controller-manager moved between datastores.

    scripts/kube-switch.py [--keep] [--objects N] CHAIN

CHAIN is the path a cluster takes, one hop at a time:
  gokine-sqlite    Go kine v0.17.5 on SQLite (k3s's URL) -> kine-rs on SQLite -> kine-rs on its
                   embedded NATS server -> Go kine on SQLite again (migrate --to-go-kine)
  gokine-postgres  Go kine on PostgreSQL -> kine-rs on PostgreSQL (another database) -> Go kine
                   on PostgreSQL (a third database)
  etcd             etcd 3.7 -> kine-rs on SQLite (migrate from live etcd) -> etcd again (etcdctl
                   snapshot save against kine-rs, etcdutl snapshot restore)

On the first store kube-apiserver 1.37 and kube-controller-manager build a cluster: a
CustomResourceDefinition and objects of it, a Deployment with its ReplicaSet and Pods,
ConfigMaps and Secrets (--objects, default 2000, with updates and deletes), until a compaction
has passed. Then, at every hop: the controller manager stops, every object of the test
namespace is listed (name, uid, resourceVersion), a watch is opened at the list's
resourceVersion, kube-apiserver and the store stop, the store is converted, the new store
starts, the same kube-apiserver starts on it, and:
  - every object is there with the same uid and resourceVersion, nothing more;
  - the watch, opened again at the last resourceVersion it saw, goes on without 410 Gone and
    delivers the next change (ConfigMaps are watched from the datastore itself: their watch cache
    is off, --watch-cache-sizes=configmaps#0, so the watch reads the store's history);
  - the controllers carry on: the Deployment scaled up gets its Pods;
  - more creates, updates and deletes, a compaction, for the next hop.

A missing binary or server is a failure (the message names what installs it), never a skip.
Prints `ok - ...` / `not ok - ...` and a last line `kube-switch CHAIN: PASS|FAIL (...)`; on
failure the ends of the logs are printed and the work directory is kept.

Environment: KINE_RS_BIN (default target/debug/kine-rs), GO_KINE_BIN (~/go/bin/kine),
KUBE_APISERVER_BIN, KUBE_CONTROLLER_MANAGER_BIN (~/go/bin/NAME-1.37.2), ETCD_BIN and ETCDUTL_BIN
(~/go/bin/etcd-3.7, etcdutl-3.7), ETCDCTL_BIN (etcdctl on PATH), PG_BIN (scripts/pg-throwaway.sh).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from kubeswitch import cluster, stores  # noqa: E402
from kubeswitch.proc import Abort  # noqa: E402
from kubeswitch.report import Report  # noqa: E402

CHAINS = {
    "gokine-sqlite": ["gokine-sqlite", "kiners-sqlite", "kiners-nats", "gokine-sqlite-back"],
    "gokine-postgres": ["gokine-postgres", "kiners-postgres", "gokine-postgres-back"],
    "etcd": ["etcd", "kiners-sqlite", "etcd-back"],
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("chain", choices=sorted(CHAINS))
    p.add_argument("--objects", type=int, default=2000, help="ConfigMaps and Secrets created on the first store")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix=f"kine-rs-kube-switch-{args.chain}.")
    report = Report(args.chain, work)
    env = stores.Env(work, report)
    api = None
    current = None
    try:
        env.check_binaries(CHAINS[args.chain])
        api = cluster.Cluster(work, report, env.bin)
        current = env.start(CHAINS[args.chain][0])
        api.start(current)
        api.build(args.objects)
        api.wait_for_compaction(current, 2)
        for target in CHAINS[args.chain][1:]:
            before = api.freeze()
            api.stop()
            started = time.monotonic()
            current = env.convert(current, target)
            report.note(f"{current.describe()}: converted and started in {time.monotonic() - started:.1f} s")
            first = current.revision() + 1
            api.start(current)
            api.check_same(before, current.describe())
            api.check_watch_resumes(before, current.describe())
            api.check_controllers(current.describe())
            api.churn(current.describe())
            api.wait_for_compaction(current, first)
    except Abort as e:
        report.fail(str(e))
    except subprocess.CalledProcessError as e:
        report.fail(f"{' '.join(map(str, e.cmd))}: exit {e.returncode}: {(e.stderr or e.output or '')[-2000:]}")
    except Exception:  # a bug of this script: reported as a failure, with where it happened
        report.fail(traceback.format_exc())
    finally:
        if api is not None:
            api.stop()
        if current is not None:
            current.stop()
        env.cleanup()
    sys.exit(report.finish(keep=args.keep))


if __name__ == "__main__":
    main()
