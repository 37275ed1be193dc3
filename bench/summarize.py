#!/usr/bin/env python3
"""Reads kine-rs-bench report lines (stdin) and prints a markdown table: the median of the
rounds for each (workload, clients, keys) and system, and each system's ratio against the
first system named by --baseline (default: the first label seen)."""
import statistics
import sys


def main() -> None:
    baseline = None
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--baseline":
        baseline = args[1]
    runs: dict = {}
    labels: list = []
    for line in sys.stdin:
        if not line.startswith("label="):
            continue
        f = dict(kv.split("=", 1) for kv in line.split())
        key = (f["workload"], int(f["clients"]), int(f["keys"]))
        runs.setdefault(key, {}).setdefault(f["label"], []).append(
            (float(f["ops_per_s"]), float(f["p50_ms"]), float(f["p99_ms"]), float(f.get("server_cpu_ms_per_op", "nan")))
        )
        if f["label"] not in labels:
            labels.append(f["label"])
    baseline = baseline or labels[0]
    others = [l for l in labels if l != baseline]
    head = "| workload | clients | keys | " + " | ".join(
        f"{l} ops/s (p50, p99 ms; server CPU ms/op)" for l in labels
    ) + "".join(f" | {l} / {baseline}" for l in others) + " |"
    print(head)
    print("|" + "---|" * (3 + len(labels) + len(others)))
    for key in sorted(runs, key=lambda k: (k[0], k[2], k[1])):
        cells, medians = [], {}
        for label in labels:
            rs = runs[key].get(label)
            if not rs:
                cells.append("—")
                continue
            ops, p50, p99, cpu = (statistics.median(x) for x in zip(*rs))
            medians[label] = ops
            cells.append(f"{ops:,.0f} ({p50:.2f}, {p99:.2f}; {cpu:.3f})")
        ratios = [
            f"{medians[l] / medians[baseline]:.2f}×" if l in medians and baseline in medians else "—" for l in others
        ]
        print(f"| {key[0]} | {key[1]} | {key[2]:,} | " + " | ".join(cells) + "".join(f" | {r}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
