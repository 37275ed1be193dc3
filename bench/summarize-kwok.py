#!/usr/bin/env python3
"""Tables of bench/kwok.sh's runs.log (read on stdin): the largest step each system carried
within Kubernetes' scalability SLOs, then per step every system's numbers with ratios against
etcd (for latencies and costs a ratio below 1 is better: etcd's value over the system's is
shown, so above 1 is ahead of etcd, as in the other summaries)."""
import json
import sys

SLO_NAMES = [("mutating", "mutating", 1), ("get", "get", 1), ("list_namespace", "ns list", 5),
             ("list_cluster", "cluster list", 30)]


def ms(v):
    return "–" if v is None else f"{v * 1000:.0f}"


def ratio(base, v):
    if base is None or v is None or v <= 0:
        return ""
    return f" ({base / v:.2f}×)"


def main():
    runs = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    if not runs:
        print("no runs")
        return
    systems = list(dict.fromkeys(r["label"] for r in runs))
    steps = sorted({(r["nodes"], r["pods"]) for r in runs})
    at = {(r["label"], r["nodes"], r["pods"]): r for r in runs}

    print("| system | largest step within the SLOs (nodes / pods) |")
    print("|---|---|")
    for s in systems:
        ok = [(n, p) for (n, p) in steps if at.get((s, n, p), {}).get("slo_ok")]
        print(f"| {s} | {'%d / %d' % ok[-1] if ok else 'none'} |")
    print()
    for n, p in steps:
        base = at.get(("etcd", n, p))
        print(f"### {n} nodes, {p} pods")
        print()
        print("| system | fill s | " + " | ".join(f"{name} p99 ms (≤{limit} s)" for _, name, limit in SLO_NAMES)
              + " | store writes p99 ms | watch p99 ms | 429 / 5xx | datastore CPU s fill / churn | RSS MiB | disk MiB |")
        print("|---|" + "---|" * (len(SLO_NAMES) + 7))
        for s in systems:
            r = at.get((s, n, p))
            if r is None:
                continue
            if not r.get("ready"):
                print(f"| {s} | not ready ({r.get('ready_pods')} of {p} pods in {r['fill_s']:.0f} s) |" + " |" * (len(SLO_NAMES) + 6))
                continue
            b = base or {}
            cells = [f"{r['fill_s']:.0f}{ratio(b.get('fill_s'), r['fill_s'])}"]
            for key, _, _ in SLO_NAMES:
                v = r["slo"].get(key, {}).get("p99_s")
                bv = b.get("slo", {}).get(key, {}).get("p99_s")
                worst = r["slo"].get(key, {}).get("worst", "")
                cells.append(f"{ms(v)}{ratio(bv, v)}" + (f" {worst}" if key == "mutating" else ""))
            w = r["store"].get("writes", {}).get("p99_s")
            cells.append(f"{ms(w)}{ratio(b.get('store', {}).get('writes', {}).get('p99_s'), w)}")
            cells.append(ms(r.get("watch_p99_s")))
            cells.append(f"{r['answers']['429']} / {r['answers']['5xx']}")
            cells.append(f"{r['cpu_fill_s']:.0f} / {r['cpu_churn_s']:.0f}{ratio(b.get('cpu_fill_s'), r['cpu_fill_s'])}")
            cells.append(str(r.get("rss_mib")))
            cells.append(str(r.get("disk_mib")))
            print(f"| {s} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
