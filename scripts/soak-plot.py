#!/usr/bin/env python3
"""Plots a soak's samples (scripts/soak.sh) as one SVG, with the Python standard library only.

    soak-plot.py SAMPLES.csv OUT.svg

SAMPLES.csv has a header `minute,node,rss_kib,fds,tasks,revision,ops,errors,p50_ms,p99_ms,fault`;
one panel per measure (RSS, open files, tasks, latency), one line per node, faults as bars.
"""
import csv
import sys
from collections import defaultdict

W, H, PAD = 900, 180, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def panel(title, series, faults, top, unit):
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s if y is not None]
    if not xs or not ys:
        return f'<text x="{PAD}" y="{top + 20}">{title}: no data</text>'
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y1 = max(ys) * 1.1 or 1

    def px(x):
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def py(y):
        return top + H - (y / y1) * (H - 30)

    out = [f'<text x="{PAD}" y="{top + 14}" font-weight="bold">{title}</text>']
    out.append(f'<text x="{W - PAD}" y="{top + 14}" text-anchor="end">max {max(ys):,.1f} {unit}</text>')
    for m in faults:
        out.append(f'<rect x="{px(m):.1f}" y="{top + 20}" width="3" height="{H - 20}" fill="#fdd"/>')
    out.append(f'<line x1="{PAD}" y1="{top + H}" x2="{W - PAD}" y2="{top + H}" stroke="#999"/>')
    for i, (name, points) in enumerate(sorted(series.items())):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points if y is not None)
        color = COLORS[i % len(COLORS)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        out.append(f'<text x="{W - PAD + 4}" y="{top + 30 + 14 * i}" fill="{color}" font-size="11">{name}</text>')
    out.append(f'<text x="{PAD}" y="{top + H + 14}" font-size="11">minute {x0:g}</text>')
    out.append(f'<text x="{W - PAD}" y="{top + H + 14}" font-size="11" text-anchor="end">minute {x1:g}</text>')
    return "\n".join(out)


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    measures = [
        ("RSS (MiB)", "rss_kib", 1 / 1024, "MiB"),
        ("open files", "fds", 1, ""),
        ("async tasks (kine_runtime_alive_tasks)", "tasks", 1, ""),
        ("client latency p99 (ms)", "p99_ms", 1, "ms"),
    ]
    faults = sorted({float(r["minute"]) for r in rows if r.get("fault")})
    parts = []
    for i, (title, key, scale, unit) in enumerate(measures):
        series = defaultdict(list)
        for r in rows:
            v = r.get(key)
            name = "client" if key == "p99_ms" else f"node {r['node']}"
            if key == "p99_ms" and r["node"] != "0":
                continue
            series[name].append((float(r["minute"]), float(v) * scale if v not in ("", None) else None))
        parts.append(panel(title, series, faults, 10 + i * (H + 30), unit))
    height = 10 + len(measures) * (H + 30)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W + 60}" height="{height}" '
        f'font-family="sans-serif" font-size="12">\n' + "\n".join(parts) + "\n</svg>\n"
    )
    open(sys.argv[2], "w").write(svg)


if __name__ == "__main__":
    main()
