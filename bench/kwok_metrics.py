"""kube-apiserver's /metrics as bench/kwok-load.py reads them (the SLO classes' p99 from
histogram deltas, the datastore calls' p99, the answers' codes) and the datastore's cost from
/proc (CPU, memory of a process tree, disk)."""
import os
import re
import subprocess

SLO = {"mutating": 1.0, "get": 1.0, "list_namespace": 5.0, "list_cluster": 30.0}

# ---------------------------------------------------------------------- metrics

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+([0-9.eE+-]+|NaN|\+Inf)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
WANTED = ("apiserver_request_duration_seconds_bucket", "etcd_request_duration_seconds_bucket",
          "apiserver_request_total")


def parse(text):
    """The samples of the wanted metrics in a /metrics page: {(name, labels): value}."""
    samples = {}
    for line in text.splitlines():
        if not line.startswith(WANTED):
            continue
        m = LINE.match(line)
        if m:
            labels = tuple(sorted(LABEL.findall(m.group(2))))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def delta(before, after):
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def quantile(buckets, q):
    """Prometheus's histogram_quantile over {le: cumulative count}."""
    les = sorted(buckets, key=lambda le: float("inf") if le == "+Inf" else float(le))
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank, prev_le, prev_count = q * total, 0.0, 0.0
    for le in les:
        count = buckets[le]
        if count >= rank:
            if le == "+Inf":
                return prev_le
            upper = float(le)
            return prev_le + (upper - prev_le) * ((rank - prev_count) / (count - prev_count) if count > prev_count else 1)
        prev_le, prev_count = (0.0 if le == "+Inf" else float(le)), count
    return prev_le


def histograms(samples, name, key):
    """{group: {le: count}} of a histogram's buckets, grouped by key(labels) (None: skipped)."""
    groups = {}
    for (metric, labels), v in samples.items():
        if metric != name:
            continue
        d = dict(labels)
        g = key(d)
        if g is None:
            continue
        groups.setdefault(g, {})
        groups[g][d["le"]] = groups[g].get(d["le"], 0.0) + v
    return groups


def slo_class(d):
    verb, scope = d.get("verb"), d.get("scope")
    if verb in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
        return "mutating"
    if verb == "GET" and scope == "resource":
        return "get"
    if verb == "LIST" and scope == "namespace":
        return "list_namespace"
    if verb == "LIST" and scope == "cluster":
        return "list_cluster"
    return None


def slo_p99(samples):
    per_group = histograms(samples, "apiserver_request_duration_seconds_bucket",
                           lambda d: (slo_class(d), d.get("verb"), d.get("resource"), d.get("subresource", ""))
                           if slo_class(d) else None)
    worst = {}
    for (cls, verb, resource, sub), buckets in per_group.items():
        p = quantile(buckets, 0.99)
        if p is None:
            continue
        what = f"{verb} {resource}{'/' + sub if sub else ''}"
        if cls not in worst or p > worst[cls][0]:
            worst[cls] = (p, what, int(buckets["+Inf"]))
    return {c: {"p99_s": round(v[0], 4), "worst": v[1], "count": v[2]} for c, v in worst.items()}


def store_p99(samples):
    writes = ("create", "update", "delete", "GuaranteedUpdate")
    groups = histograms(samples, "etcd_request_duration_seconds_bucket",
                        lambda d: "writes" if d.get("operation") in writes else "reads")
    out = {}
    for g, buckets in groups.items():
        p = quantile(buckets, 0.99)
        out[g] = {"p99_s": round(p, 4) if p is not None else None, "count": int(buckets.get("+Inf", 0))}
    return out


def answers(samples):
    out = {"429": 0, "5xx": 0, "total": 0}
    for (metric, labels), v in samples.items():
        if metric != "apiserver_request_total":
            continue
        code = dict(labels).get("code", "")
        out["total"] += int(v)
        if code == "429":
            out["429"] += int(v)
        elif code.startswith("5"):
            out["5xx"] += int(v)
    return out


# ---------------------------------------------------------------------- the datastore's cost

def tree(pids):
    """The processes and their descendants."""
    seen, todo = set(), [p for p in pids if p]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return seen


def cpu_seconds(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in tree(pids):
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def rss_mib(pids):
    total = 0
    for p in tree(pids):
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024)


def disk_mib(path):
    if not path:
        return None
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    return round(int(out.stdout.split()[0]) / 1048576) if out.returncode == 0 else None
