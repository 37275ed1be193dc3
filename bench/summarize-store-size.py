#!/usr/bin/env python3
"""Reads the run log of bench/store-size.sh (RUNLOG, or stdin) and prints markdown tables: per
system and store size, the p99 latency of each workload with the memory and disk; how much each
p99 grew from the smallest size to the largest each system reached (the goal: within 1.5x);
the restart and compaction at the largest size; and the failures (etcd's quota).

    summarize-store-size.py [RUNLOG]"""
import sys

WORKLOADS = (("get", "get"), ("list", "list page"), ("create", "create"), ("cas", "update"),
             ("list-all", "paginated list all"), ("stream-all", "RangeStream all"), ("replay", "catch-up 10k"))
# One operation each (a whole list, a whole catch-up): their p50 is the time of one.
WHOLE = ("list-all", "stream-all", "replay")


def fields(line):
    """The key=value fields of a line (after its first word if that has no `=`, as `size`)."""
    words = line.split()
    return dict(kv.split("=", 1) for kv in (words if "=" in words[0] else words[1:]))


def parse(lines):
    """Returns ({system: {keys: {"size": fields, workload: fields}}}, restarts, compactions,
    failures). A report line belongs to the last size its system reached (the catch-up's
    own `keys` are its 1,000 keys, not the store's)."""
    systems, restarts, compactions, failures, current = {}, [], [], [], {}
    for line in lines:
        line = line.strip()
        if line.startswith("# FAILED"):
            failures.append(line[2:])
        elif line.startswith("size "):
            f = fields(line)
            current[f["label"]] = int(f["keys"])
            systems.setdefault(f["label"], {})[int(f["keys"])] = {"size": f}
        elif line.startswith("label=") and "workload=" in line:
            f = fields(line)
            if f["label"] in current:
                systems[f["label"]][current[f["label"]]][f["workload"]] = f
        elif line.startswith("restart "):
            restarts.append(fields(line))
        elif line.startswith("compact "):
            compactions.append(fields(line))
    return systems, restarts, compactions, failures


def ms(f, field):
    try:
        v = float(f[field])
    except (KeyError, ValueError, TypeError):
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}"


def mib(v):
    try:
        return f"{int(v) / 2**20:,.0f}"
    except (TypeError, ValueError):
        return "-"


def memory(f):
    """The store's resident memory with its own (anonymous) in parentheses, and kine-rs's on a
    database server after a `+`."""
    def one(name):
        rss, anon = f.get(f"{name}_rss_mib"), f.get(f"{name}_anon_mib")
        return "-" if rss is None else f"{float(rss):,.0f}" + (f" ({float(anon):,.0f})" if anon else "")
    return one("store") + (f" + {one('kine_rs')}" if "kine_rs_rss_mib" in f else "")


def per_size(systems):
    cols = (["system", "keys", "load keys/s"]
            + [f"{name} {'' if w in WHOLE else 'p99 '}ms" for w, name in WORKLOADS]
            + ["RSS (own) MiB", "disk MiB"])
    out = ["| " + " | ".join(cols) + " |", "|---|" + "--:|" * (len(cols) - 1)]
    for system, steps in systems.items():
        previous = 0
        for keys in sorted(steps):
            step = steps[keys]
            size = step["size"]
            load = (keys - previous) / max(float(size["load_s"]), 1e-9)
            previous = keys
            # The whole list and the catch-up are one operation each: their p50 is the time of one.
            cells = [system, f"{keys:,}", f"{load:,.0f}"]
            for w, _ in WORKLOADS:
                cells.append(ms(step.get(w, {}), "p50_ms" if w in WHOLE else "p99_ms"))
            cells += [memory(size), mib(size.get("disk_bytes"))]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def growth(systems):
    cols = ["system", "from keys", "to keys"] + [name for w, name in WORKLOADS if w not in ("list-all", "stream-all")]
    out = ["| " + " | ".join(cols) + " |", "|---|" + "--:|" * (len(cols) - 1)]
    for system, steps in systems.items():
        done = [k for k in sorted(steps) if all(w in steps[k] for w in ("get", "list", "create", "cas", "replay"))]
        if len(done) < 2:
            continue
        lo, hi = steps[done[0]], steps[done[-1]]
        cells = [system, f"{done[0]:,}", f"{done[-1]:,}"]
        for w, _ in WORKLOADS:
            if w in ("list-all", "stream-all"):
                continue
            field = "p50_ms" if w == "replay" else "p99_ms"
            try:
                cells.append(f"{float(hi[w][field]) / float(lo[w][field]):.2f}x")
            except (KeyError, ValueError, ZeroDivisionError):
                cells.append("-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def after(restarts, compactions):
    by = {r["label"]: r for r in restarts}
    out = ["| system | keys | restart to serving s | RSS (own) after restart MiB | compaction s | defrag s | disk MiB before | after compaction | after defrag |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for c in compactions:
        r = by.get(c["label"], {})
        rss = memory(r) if r else "-"
        out.append(f"| {c['label']} | {int(c['keys']):,} | {r.get('serving_s', '-')} | {rss} | {c['compact_s']} | "
                   f"{c['defrag_s']} | {mib(c['disk_before_bytes'])} | {mib(c['disk_compacted_bytes'])} | "
                   f"{mib(c['disk_defragmented_bytes'])} |")
    return "\n".join(out)


def main():
    with (open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin) as f:
        systems, restarts, compactions, failures = parse(f)
    if not systems:
        sys.exit("summarize-store-size.py: no `size` line")
    print("Store size: p99 latency at 16 clients per store size (whole lists and the catch-up of")
    print("10,000 events: the time of one, p50); resident memory of the store's process, its own (without")
    print("mapped files' pages) in parentheses (+ kine-rs's on a database server).")
    print()
    print(per_size(systems))
    print()
    print("Growth of each latency from the smallest size to the largest reached (goal: within 1.5x):")
    print()
    print(growth(systems))
    if compactions:
        print()
        print("At the largest size: restart, then a physical compaction at the current revision and a defragmentation:")
        print()
        print(after(restarts, compactions))
    for failure in failures:
        print(f"\n{failure}")


if __name__ == "__main__":
    main()
