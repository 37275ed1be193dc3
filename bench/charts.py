#!/usr/bin/env python3
"""Draws a benchmark run's charts as SVG files, from the run's own report lines, with the
Python standard library only.

    charts.py etcd-api RUNS.log OUTDIR     (bench/compare.sh's runs.log)
    charts.py apiserver RUNS.log OUTDIR    (bench/apiserver.sh's runs.log)
    charts.py kwok RUNS.log OUTDIR         (bench/kwok.sh's runs.log)
    charts.py compaction RUNS.log OUTDIR   (bench/compaction.sh's runs.log)
    charts.py store-size RUNS.log OUTDIR   (bench/store-size.sh's runs.log)

Writes into OUTDIR:
    <level>-ratios.svg   every workload (rows) and system (columns) as a ratio against etcd:
                         ops/s for the etcd API (a watch's or a replay's latency instead: their
                         throughput is fixed by the load), and for kube-apiserver the phases'
                         ops/s or 1/p50 (summarize-apiserver.py's score); green ahead of etcd,
                         red behind.
    etcd-api-vs-kine.svg the same for each kine-rs system against Go kine on its backend
                         (kine-rs-X against kine-X).
    <level>-latency.svg  p50 and p99 latency per system for a few representative workloads
                         (log scale).
    <level>-memory.svg   the server's memory per system: idle and peak under load (etcd API),
                         resident at the end of each phase (kube-apiserver).
    compaction-stall.svg the writes' p99.9 and longest wait while a compaction ran, a bar pair
                         per system (compaction.sh).
    kwok-p99.svg         the worst mutating API call's p99 against the cluster's size, a line
                         per system (kwok.sh); kwok-store-p99.svg the datastore writes' p99.
    store-size-<w>.svg   the p99 of gets, updates (cas) and list pages against the store's
                         size, a line per system (store-size.sh).
Medians over the rounds, as in the tables of summarize.py and summarize-apiserver.py."""
import importlib.util
import math
import os
import statistics
import sys
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FONT = 'font-family="sans-serif" font-size="11"'
BLUE, ORANGE = "#1f77b4", "#ff7f0e"


def svg(width, height, body, title):
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" {FONT}>\n'
        f'<rect width="{width}" height="{height}" fill="white"/>\n'
        f'<text x="10" y="18" font-size="13" font-weight="bold">{escape(title)}</text>\n' + "\n".join(body) + "\n</svg>\n"
    )


def color(r):
    """Green for a ratio above 1, red below, white at 1; saturated at 4× either way."""
    if r is None or math.isnan(r):
        return "#eee"
    # 0: the system did nothing (every request failed); infinite: the other one did nothing.
    t = -1.0 if r <= 0 else 1.0 if math.isinf(r) else max(-1.0, min(1.0, math.log(r, 4)))
    if t >= 0:
        return f"rgb({int(255 - 155 * t)},{int(255 - 55 * t)},{int(255 - 155 * t)})"
    return f"rgb(255,{int(255 + 155 * t)},{int(255 + 155 * t)})"


def heatmap(rows, columns, cell, title, subtitle):
    """rows/columns: names; cell(row, column) -> ratio or NaN."""
    left, top, cw, ch = 250, 130, 70, 20
    width, height = left + cw * len(columns) + 110, top + ch * len(rows) + 10
    width = max(width, 7 * max(len(title), len(subtitle)) + 20)
    body = [f'<text x="10" y="34" fill="#555">{escape(subtitle)}</text>']
    for j, c in enumerate(columns):
        x = left + j * cw + cw / 2
        body.append(f'<text x="{x}" y="{top - 6}" transform="rotate(-40 {x} {top - 6})">{escape(c)}</text>')
    for i, r in enumerate(rows):
        y = top + i * ch
        body.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(r)}</text>')
        for j, c in enumerate(columns):
            v = cell(r, c)
            x = left + j * cw
            body.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{color(v)}"/>')
            text = "—" if v is None or math.isnan(v) else f"{v:.2f}×"
            body.append(f'<text x="{x + cw / 2 - 1}" y="{y + 14}" text-anchor="middle">{text}</text>')
    return svg(width, height, body, title)


def bars(groups, series, value, title, unit, log=False):
    """Horizontal bars: for each group, one bar per series (value(group, series) or NaN)."""
    left, top, bar, gap, plot = 250, 50, 9, 10, 480
    present = [(g, [s for s in series if not math.isnan(value(g, s))]) for g in groups]
    present = [(g, ss) for g, ss in present if ss]
    values = [value(g, s) for g, ss in present for s in ss]
    if not values:
        return svg(400, 60, ['<text x="10" y="40">no data</text>'], title)
    hi = max(values)
    lo = min(v for v in values if v > 0) if log else 0

    def length(v):
        if log:
            return plot * (math.log10(max(v, lo)) - math.log10(lo) + 0.3) / (math.log10(hi) - math.log10(lo) + 0.3)
        return plot * v / hi if hi else 0

    body, y = [], top
    for g, ss in present:
        body.append(f'<text x="10" y="{y + 10}" font-weight="bold">{escape(g)}</text>')
        y += 14
        for s in ss:
            v = value(g, s)
            body.append(f'<text x="{left - 6}" y="{y + bar - 1}" text-anchor="end">{escape(s)}</text>')
            fill = ORANGE if s.startswith("kine-rs") else "#999" if s == "etcd" else BLUE
            body.append(f'<rect x="{left}" y="{y}" width="{length(v):.1f}" height="{bar}" fill="{fill}"/>')
            body.append(f'<text x="{left + length(v) + 4:.1f}" y="{y + bar - 1}">{v:,.2f} {unit}</text>')
            y += bar + 3
        y += gap
    legend = "orange: kine-rs; blue: Go kine; grey: etcd" + ("; log scale" if log else "")
    body.append(f'<text x="10" y="36" fill="#555">{legend}</text>')
    return svg(left + plot + 120, y + 10, body, title)


def paired_bars(groups, series, values, title, unit, names):
    """Like bars, with two values per bar (values(group, series) -> (a, b)), a drawn over b."""
    left, top, bar, plot = 250, 50, 9, 480
    hi = max((v for g in groups for s in series for v in values(g, s) if not math.isnan(v)), default=0)
    body, y = [f'<text x="10" y="36" fill="#555">dark: {names[0]}; light: {names[1]}; log scale</text>'], top
    lo = min((v for g in groups for s in series for v in values(g, s) if not math.isnan(v) and v > 0), default=1)

    def length(v):
        return plot * (math.log10(max(v, lo)) - math.log10(lo) + 0.3) / (math.log10(max(hi, lo * 1.01)) - math.log10(lo) + 0.3)

    for g in groups:
        ss = [s for s in series if not all(math.isnan(v) for v in values(g, s))]
        if not ss:
            continue
        body.append(f'<text x="10" y="{y + 10}" font-weight="bold">{escape(g)}</text>')
        y += 14
        for s in ss:
            a, b = values(g, s)
            fill = ORANGE if s.startswith("kine-rs") else "#999" if s == "etcd" else BLUE
            body.append(f'<text x="{left - 6}" y="{y + bar - 1}" text-anchor="end">{escape(s)}</text>')
            if not math.isnan(b):
                body.append(f'<rect x="{left}" y="{y}" width="{length(b):.1f}" height="{bar}" fill="{fill}" opacity="0.35"/>')
            if not math.isnan(a):
                body.append(f'<rect x="{left}" y="{y}" width="{length(a):.1f}" height="{bar}" fill="{fill}"/>')
            end = max(length(v) for v in (a, b) if not math.isnan(v))
            label = " / ".join("—" if math.isnan(v) else f"{v:,.2f}" for v in (a, b))
            body.append(f'<text x="{left + end + 4:.1f}" y="{y + bar - 1}">{label} {unit}</text>')
            y += bar + 3
        y += 10
    return svg(left + plot + 160, y + 10, body, title)


def etcd_api(path, outdir):
    summarize = load("summarize")
    with open(path) as f:
        runs, labels, idle = summarize.parse(f)
    kinds = summarize.order(runs)
    med = {k: {l: summarize.medians(rs) for l, rs in runs[k].items()} for k in kinds}
    name = {k: summarize.describe(k).replace(" | ", ", ").replace(", —", "").replace(", flat", "") for k in kinds}
    def ratio(kind, label, base="etcd"):
        return summarize.ratio_value(kind, med[kind], label, base)

    columns = [l for l in labels if l != "etcd"]
    by_name = {name[k]: k for k in kinds}
    write(outdir, "etcd-api-ratios.svg", heatmap(
        [name[k] for k in kinds], columns, lambda r, c: ratio(by_name[r], c),
        "etcd API: each system against etcd (×, higher is better)",
        "ops/s ÷ etcd's (watch and replay: etcd's p50 latency ÷ the system's); medians of the rounds"))
    # kine-rs-X against Go kine's kine-X (bench/compare.sh's labels).
    pairs = {l: l.replace("kine-rs-", "kine-", 1) for l in labels if l.startswith("kine-rs-")}
    pairs = {a: b for a, b in pairs.items() if b in labels}
    if pairs:
        write(outdir, "etcd-api-vs-kine.svg", heatmap(
            [name[k] for k in kinds], [f"{a} / {b}" for a, b in pairs.items()],
            lambda r, c: ratio(by_name[r], *c.split(" / ")),
            "etcd API: kine-rs against Go kine on the same backend (×, higher is better)",
            "ops/s ÷ Go kine's (watch and replay: Go kine's p50 latency ÷ kine-rs's); medians of the rounds"))
    picks = [k for k in kinds if (k[0], k[2]) in {("get", 16), ("put", 16), ("create", 64), ("cas", 16), ("watch", 10)}]
    write(outdir, "etcd-api-latency.svg", paired_bars(
        [name[k] for k in picks], labels,
        lambda g, s: tuple(med[by_name[g]].get(s, {}).get(f, math.nan) for f in ("p50_ms", "p99_ms")),
        "etcd API: latency p50 and p99", "ms", ("p50", "p99")))
    peak = {l: statistics.median([med[k][l]["server_peak_rss_mib"] for k in kinds if l in med[k]]) for l in labels}
    write(outdir, "etcd-api-memory.svg", paired_bars(
        ["server RSS, MiB"], labels, lambda g, s: (idle.get(s, (math.nan,))[0], peak.get(s, math.nan)),
        "etcd API: the server's memory (idle after the preload / median peak of the runs)", "MiB",
        ("idle", "peak under load")))


def apiserver(path, outdir):
    sa = load("summarize-apiserver")
    with open(path) as f:
        runs, labels, phases = sa.parse(f)
    if "etcd" in labels:
        write(outdir, "apiserver-ratios.svg", heatmap(
            phases, [l for l in labels if l != "etcd"],
            lambda p, l: sa.score(runs, p, l) / sa.score(runs, p, "etcd"),
            "kube-apiserver on each datastore against etcd (×, higher is better)",
            "ops/s ÷ etcd's; " + ", ".join(sorted(sa.BY_LATENCY)) + ": etcd's p50 ÷ the system's; medians"))
    write(outdir, "apiserver-latency.svg", paired_bars(
        phases, labels, lambda p, l: (sa.med(runs, p, l, "p50_ms"), sa.med(runs, p, l, "p99_ms")),
        "kube-apiserver: API latency p50 and p99 per phase (watch: delivery delay)", "ms", ("p50", "p99")))
    write(outdir, "apiserver-memory.svg", bars(
        [p for p in phases if p != "watch"], labels, lambda p, l: sa.med(runs, p, l, "rss_mib"),
        "kube-apiserver: the datastore's resident memory at the end of each phase", "MiB"))


PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]


def lines(series, title, xlabel, unit, logx=False):
    """A line chart: series is {name: [(x, y), ...]}; log-scaled y, linear x (log-scaled with
    `logx`)."""
    points = [pt for pts in series.values() for pt in pts if pt[1] and pt[1] > 0]
    if not points:
        return svg(400, 60, ['<text x="10" y="40">no data</text>'], title)
    width, height, left, top, plot_w, plot_h = 640, 360, 60, 40, 430, 260
    xmax = max(x for x, _ in points)
    xmin = min(x for x, _ in points)
    ylo = 10 ** math.floor(math.log10(min(y for _, y in points)))
    yhi = 10 ** math.ceil(math.log10(max(y for _, y in points)))
    if yhi <= ylo:
        yhi = ylo * 10

    def px(x):
        if logx:
            span = math.log10(xmax) - math.log10(xmin) or 1
            return left + plot_w * (math.log10(x) - math.log10(xmin)) / span
        return left + plot_w * x / xmax

    def py(y):
        return top + plot_h * (1 - (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)))
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
            f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>',
            f'<text x="12" y="{top + plot_h / 2}" transform="rotate(-90 12 {top + plot_h / 2})" text-anchor="middle">{escape(unit)}</text>']
    decade = ylo
    while decade <= yhi:
        y = py(decade)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        body.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{decade:g}</text>')
        decade *= 10
    for x in sorted({x for x, _ in points}):
        body.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 14}" text-anchor="middle">{x:g}</text>')
    for k, (name, pts) in enumerate(series.items()):
        pts = sorted(pt for pt in pts if pt[1] and pt[1] > 0)
        c = PALETTE[k % len(PALETTE)]
        if len(pts) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            body.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts:
            body.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>')
        ly = top + 14 * k
        body.append(f'<rect x="{left + plot_w + 12}" y="{ly}" width="10" height="10" fill="{c}"/>')
        body.append(f'<text x="{left + plot_w + 26}" y="{ly + 9}">{escape(name)}</text>')
    return svg(width, height, body, title)


def kwok(path, outdir):
    import json
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    ready = [r for r in runs if r.get("ready")]
    mutating, store = {}, {}
    for r in ready:
        mutating.setdefault(r["label"], []).append((r["nodes"], 1000 * r["slo"].get("mutating", {}).get("p99_s", 0)))
        store.setdefault(r["label"], []).append((r["nodes"], 1000 * (r["store"].get("writes", {}).get("p99_s") or 0)))
    write(outdir, "kwok-p99.svg", lines(mutating, "Worst mutating API call p99 during churn (SLO: 1 s)", "nodes", "ms"))
    write(outdir, "kwok-store-p99.svg", lines(store, "kube-apiserver's datastore writes p99 during churn", "nodes", "ms"))


def compaction(path, outdir):
    rows = []
    for line in open(path):
        if line.startswith("label=") and "workload=compaction" in line:
            f = dict(kv.split("=", 1) for kv in line.split())
            if f.get("compaction_ms", "").replace(".", "").isdigit():
                rows.append(f)
    systems = [r["label"] for r in rows]
    by = {r["label"]: r for r in rows}
    group = f"{int(rows[0]['superseded']):,} superseded versions, {rows[0]['clients']} writers" if rows else ""
    values = lambda g, s: (float(by[s]["during_p999_ms"]), float(by[s]["during_max_ms"]))
    title = "Writes while a compaction runs: p99.9 / longest wait"
    write(outdir, "compaction-stall.svg", paired_bars([group], systems, values, title, "ms", ("p99.9", "max")))


def store_size(path, outdir):
    summarize = load("summarize-store-size")
    with open(path) as f:
        systems = summarize.parse(f)[0]
    for workload, name in (("get", "gets"), ("cas", "updates"), ("list", "list pages of 500")):
        series = {s: [(k, float(step[workload]["p99_ms"])) for k, step in steps.items() if workload in step]
                  for s, steps in systems.items()}
        write(outdir, f"store-size-{workload}.svg",
              lines(series, f"p99 of {name} (16 clients) against the store's size", "keys", "ms", logx=True))


def write(outdir, name, text):
    with open(os.path.join(outdir, name), "w") as f:
        f.write(text)
    print(f"charts.py: {os.path.join(outdir, name)}")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("etcd-api", "apiserver", "kwok", "compaction", "store-size"):
        sys.exit(__doc__)
    os.makedirs(sys.argv[3], exist_ok=True)
    {"etcd-api": etcd_api, "apiserver": apiserver, "kwok": kwok, "compaction": compaction,
     "store-size": store_size}[sys.argv[1]](sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
