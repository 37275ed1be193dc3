#!/usr/bin/env python3
"""Reads kine-rs-bench report lines (stdin) and prints markdown tables of the medians of the
rounds for each run kind (workload, shape, clients, keys, watchers) and system (label).

    summarize.py [--baseline LABEL]
        One row per run kind, a column per system, and each system's ratio against the
        baseline (default: the first label seen).
    summarize.py --baseline LABEL --pair A=B[,C=D...]
        One row per run kind and system, with its ratio against the baseline and, for A, its
        ratio against B (e.g. kine-rs and Go kine on the same backend); first an overview of
        ops/s and a table of the ratios of the A systems. Lines `idle label=X rss_mib=N anon_mib=N` (bench/compare.sh) add a table of
        idle memory.

Ratios are of ops/s (higher is better), except for `watch` and `replay` runs, where they are
of latency: the other system's p50 divided by this one's. For `watch` runs, ops/s is the
events delivered per second, fixed by the writer's rate times the watchers unless events were
missed (with slow clients, the latencies are those of the connections that kept reading). For
`replay` runs an operation is a whole replay of the history written first: the latency is a
replay's time."""
import argparse
import math
import statistics
import sys

FIELDS = (
    "ops_per_s",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "server_cpu_ms_per_op",
    "server_peak_rss_mib",
    "server_rss_anon_mib",
    "errors",
)
# Undefined in a run without a successful operation (the line shows 0).
PER_OP = ("p50_ms", "p99_ms", "p999_ms", "server_cpu_ms_per_op")


def parse(lines):
    """Returns ({run kind: {label: [fields per round]}}, labels in order seen, idle RSS by label)."""
    runs, labels, idle = {}, [], {}
    for line in lines:
        if line.startswith("idle "):
            f = dict(kv.split("=", 1) for kv in line.split()[1:])
            idle[f["label"]] = (float(f["rss_mib"]), float(f.get("anon_mib", "nan")))
            continue
        if not line.startswith("label="):
            continue
        f = dict(kv.split("=", 1) for kv in line.split())
        variant = ", ".join(
            v for v in ("own keys" if f.get("watch_on") == "key" else "",
                        f"{f['slow_clients']} slow connections" if int(f.get("slow_clients", 0)) else "") if v)
        kind = (f["workload"], f.get("shape", "flat"), int(f["clients"]), int(f["keys"]), int(f.get("watchers", 0)), variant)
        values = {k: float(f.get(k, "nan")) for k in FIELDS}
        if int(f["ops"]) == 0:
            values.update({k: math.nan for k in PER_OP})
        runs.setdefault(kind, {}).setdefault(f["label"], []).append(values)
        if f["label"] not in labels:
            labels.append(f["label"])
    return runs, labels, idle


def median(values):
    """The median of the values known (NaN: not measured in that round)."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def medians(rounds):
    """The median of each field over the rounds; errors are summed (any is worth seeing)."""
    return {k: sum(r[k] for r in rounds) if k == "errors" else median([r[k] for r in rounds]) for k in FIELDS}


def describe(kind):
    workload, shape, clients, keys, watchers, variant = kind
    what = f"{workload}, {watchers:,} watchers" if workload == "watch" else workload
    what += f" ({variant})" if variant else ""
    return f"{what} | {shape} | {clients} | {f'{keys:,}' if keys else '—'}"


def order(runs):
    return sorted(runs, key=lambda k: (k[0], k[1], k[3], k[4], k[2], k[5]))


# Throughput is fixed by the load for watch (rate × watchers) and replay (one history): those
# compare the other system's p50 latency to this one's.
BY_LATENCY = {"watch", "replay"}


def ratio_value(kind, m, label, other):
    """`label` against `other` in a run kind's medians `m` (higher is better); NaN if undefined."""
    if label not in m or other not in m:
        return math.nan
    if kind[0] in BY_LATENCY:
        a, b = m[label]["p50_ms"], m[other]["p50_ms"]
        return b / a if a and b and not math.isnan(a) and not math.isnan(b) else math.nan
    b = m[other]["ops_per_s"]
    return m[label]["ops_per_s"] / b if b else math.nan


def ratio(kind, m, label, other):
    r = ratio_value(kind, m, label, other)
    return "—" if math.isnan(r) else f"{r:.2f}×"


def wide(runs, labels, baseline):
    others = [l for l in labels if l != baseline]
    print(
        "| workload | shape | clients | keys | "
        + " | ".join(f"{l} ops/s (p50, p99 ms; server CPU ms/op)" for l in labels)
        + "".join(f" | {l} / {baseline}" for l in others)
        + " |"
    )
    print("|" + "---|" * (4 + len(labels) + len(others)))
    for kind in order(runs):
        m = {l: medians(rs) for l, rs in runs[kind].items()}
        cells = [
            f"{m[l]['ops_per_s']:,.0f} ({m[l]['p50_ms']:.2f}, {m[l]['p99_ms']:.2f}; {m[l]['server_cpu_ms_per_op']:.3f})"
            if l in m
            else "—"
            for l in labels
        ]
        print(f"| {describe(kind)} | " + " | ".join(cells) + "".join(f" | {ratio(kind, m, l, baseline)}" for l in others) + " |")


def long(runs, labels, baseline, pairs):
    print("ops/s, median of the rounds:\n")
    print("| workload | shape | clients | keys | " + " | ".join(labels) + " |")
    print("|" + "---|" * (4 + len(labels)))
    for kind in order(runs):
        m = {l: medians(rs) for l, rs in runs[kind].items()}
        print(f"| {describe(kind)} | " + " | ".join(f"{m[l]['ops_per_s']:,.0f}" if l in m else "—" for l in labels) + " |")
    print(f"\nRatios (of ops/s; of p50 latency for watch and replay): each paired system against {baseline} and against its pair:\n")
    print("| workload | shape | clients | keys | " + " | ".join(f"{a} / {baseline} | {a} / {b}" for a, b in pairs.items()) + " |")
    print("|" + "---|" * (4 + 2 * len(pairs)))
    for kind in order(runs):
        m = {l: medians(rs) for l, rs in runs[kind].items()}
        cells = [f"{ratio(kind, m, a, baseline)} | {ratio(kind, m, a, b)}" for a, b in pairs.items()]
        print(f"| {describe(kind)} | " + " | ".join(cells) + " |")
    print("\nEach system, medians of the rounds; the last column compares " + ", ".join(f"{a} with {b}" for a, b in pairs.items()) + ":\n")
    print(
        "| workload | shape | clients | keys | system | ops/s | p50 ms | p99 ms | p999 ms | server CPU ms/op "
        f"| server RSS MiB: peak (anon at end) | errors | vs {baseline} | vs pair |"
    )
    print("|" + "---|" * 14)
    for kind in order(runs):
        m = {l: medians(rs) for l, rs in runs[kind].items()}
        for l in labels:
            if l not in m:
                continue
            r = m[l]
            print(
                f"| {describe(kind)} | {l} | {r['ops_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['p999_ms']:.2f} "
                f"| {r['server_cpu_ms_per_op']:.3f} | {r['server_peak_rss_mib']:.0f} ({r['server_rss_anon_mib']:.0f}) "
                f"| {r['errors']:.0f} "
                f"| {ratio(kind, m, l, baseline) if l != baseline else ''} | {ratio(kind, m, l, pairs[l]) if l in pairs else ''} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline")
    parser.add_argument("--pair", help="A=B[,C=D...]: ratio of A against B in an extra column")
    args = parser.parse_args()
    runs, labels, idle = parse(sys.stdin)
    if not labels:
        sys.exit("summarize.py: no report lines on stdin")
    baseline = args.baseline or labels[0]
    if args.pair:
        pairs = dict(p.split("=", 1) for p in args.pair.split(","))
        long(runs, labels, baseline, pairs)
    else:
        wide(runs, labels, baseline)
    if idle:
        print("\nIdle memory after start-up and preload (the server process only):\n")
        print("| system | RSS MiB | of which anonymous (RssAnon) MiB |\n|---|---|---|")
        for label, (rss, anon) in idle.items():
            print(f"| {label} | {rss:.1f} | {anon:.1f} |")


if __name__ == "__main__":
    main()
