#!/usr/bin/env python3
"""Reads bench/apiserver-load.py report lines (stdin) and prints markdown tables of the
medians over rounds: per phase and system, throughput, latency, the datastore's CPU and memory,
and ratios against etcd and against Go kine on the same backend (higher is better: ops/s for
the phases run as fast as possible, the inverse of the p50 latency for the others)."""
import math
import statistics
import sys

PAIRS = {"kine-rs-sqlite": "kine-sqlite", "kine-rs-nats-embedded": "kine-nats-embedded"}
# Phases whose throughput is fixed by the load (a rate, one client, deliveries): compare latency.
BY_LATENCY = {"create-rate", "list", "list-rv0", "watch"}


def parse(lines):
    runs, labels, phases = {}, [], []
    for line in lines:
        if not line.startswith("label="):
            continue
        f = dict(kv.split("=", 1) for kv in line.split())
        key = (f["phase"], f["label"])
        runs.setdefault(key, []).append({k: float(v) for k, v in f.items() if k not in ("label", "phase")})
        if f["label"] not in labels:
            labels.append(f["label"])
        if f["phase"] not in phases:
            phases.append(f["phase"])
    return runs, labels, phases


def med(runs, phase, label, field):
    values = [r[field] for r in runs.get((phase, label), []) if not math.isnan(r.get(field, math.nan))]
    return statistics.median(values) if values else math.nan


def score(runs, phase, label):
    if phase in BY_LATENCY:
        p50 = med(runs, phase, label, "p50_ms")
        return 1 / p50 if p50 and not math.isnan(p50) else math.nan
    return med(runs, phase, label, "ops_per_s")


def fmt(x, digits=1):
    return "—" if math.isnan(x) else f"{x:,.{digits}f}"


def table(title, header, rows):
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def main():
    runs, labels, phases = parse(sys.stdin)
    if not runs:
        sys.exit("summarize-apiserver: no report lines")
    rounds = max(len(v) for v in runs.values())
    print(f"Medians of {rounds} round(s).")
    table("Operations per second (watch: events delivered per second)", ["phase"] + labels,
          [[p] + [fmt(med(runs, p, l, "ops_per_s")) for l in labels] for p in phases])
    table("Latency p50 / p99, ms (watch: delivery delay)", ["phase"] + labels,
          [[p] + [f"{fmt(med(runs, p, l, 'p50_ms'))} / {fmt(med(runs, p, l, 'p99_ms'))}" for l in labels] for p in phases])
    table("Errors (watch: events missing)", ["phase"] + labels,
          [[p] + [fmt(med(runs, p, l, "errors"), 0) for l in labels] for p in phases])
    table("Datastore CPU seconds in the phase / resident MiB at its end", ["phase"] + labels,
          [[p] + [f"{fmt(med(runs, p, l, 'cpu_s'), 2)} / {fmt(med(runs, p, l, 'rss_mib'), 0)}" for l in labels]
           for p in phases if p != "watch"])
    if any("apiserver_cpu_s" in r for rs in runs.values() for r in rs):
        table("kube-apiserver's own CPU seconds in the phase", ["phase"] + labels,
              [[p] + [fmt(med(runs, p, l, "apiserver_cpu_s"), 2) for l in labels] for p in phases if p != "watch"])
    if "etcd" in labels:
        others = [l for l in labels if l != "etcd"]
        table("Against etcd (× etcd; ops/s, or 1/p50 for " + ", ".join(sorted(BY_LATENCY)) + ")", ["phase"] + others,
              [[p] + [fmt(score(runs, p, l) / score(runs, p, "etcd"), 2) for l in others] for p in phases])
    pairs = [(a, b) for a, b in PAIRS.items() if a in labels and b in labels]
    if pairs:
        table("kine-rs against Go kine on the same backend (×)", ["phase"] + [f"{a} / {b}" for a, b in pairs],
              [[p] + [fmt(score(runs, p, a) / score(runs, p, b), 2) for a, b in pairs] for p in phases])


if __name__ == "__main__":
    main()
