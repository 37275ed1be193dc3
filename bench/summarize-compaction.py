#!/usr/bin/env python3
"""Reads the run log of bench/compaction.sh (RUNLOG, or stdin) and prints a markdown table, a
row per `workload=compaction` report line of kine-rs-bench: the compaction's time, the writes
that started or were in flight while it ran and their latency, the same of the 2 s before it
(the baseline), and the store's size on disk after it (the `disk label=… bytes=…` line that
follows the report line). Systems whose run failed before a report line are listed below.

    summarize-compaction.py [RUNLOG]"""
import math
import sys

COLUMNS = ("system", "superseded", "compaction s", "writes during", "p99 ms during", "p99.9 ms during",
           "max ms during", "baseline p99 ms", "baseline max ms", "disk MiB", "errors")


def fields(line):
    """The key=value fields of a line (after its first word if that has no `=`, as `disk`)."""
    words = line.split()
    return dict(kv.split("=", 1) for kv in (words if "=" in words[0] else words[1:]))


def parse(lines):
    """Returns (report lines as dicts, each with its disk bytes if known; failure comments)."""
    rows, failures = [], []
    for line in lines:
        line = line.strip()
        if line.startswith("# FAILED"):
            failures.append(line[2:])
        elif line.startswith("label=") and "workload=compaction" in line.split():
            rows.append(fields(line))
        elif line.startswith("disk "):
            f = fields(line)
            for row in reversed(rows):
                if row["label"] == f["label"]:
                    row.setdefault("disk_bytes", f["bytes"])
                    break
    return rows, failures


def ms(row, field):
    v = float(row.get(field, "nan"))
    return "-" if math.isnan(v) else f"{v:.1f}"


def compaction_s(row):
    v = row.get("compaction_ms", "-")
    try:
        s = float(v) / 1000
    except ValueError:
        return v  # "unfinished", "failed"
    return f"{s:.3f}" if s < 1 else f"{s:.2f}" if s < 10 else f"{s:.1f}"


def table(rows):
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" if c == "system" else "--:" for c in COLUMNS) + "|"]
    for r in rows:
        disk = f"{int(r['disk_bytes']) / 2**20:.1f}" if "disk_bytes" in r else "-"
        cells = (r["label"], f"{int(r['superseded']):,}", compaction_s(r), r.get("during_ops", "-"),
                 ms(r, "during_p99_ms"), ms(r, "during_p999_ms"), ms(r, "during_max_ms"), ms(r, "before_p99_ms"),
                 ms(r, "before_max_ms"), disk, r.get("errors", "-"))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    with (open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin) as f:
        rows, failures = parse(f)
    if not rows and not failures:
        sys.exit("summarize-compaction.py: no compaction report line")
    print("Compaction stall: a physical compaction of the superseded versions while writers put new keys;")
    print("writes during = those that started or were in flight while it ran; baseline = the 2 s before it.")
    print()
    print(table(rows))
    for failure in failures:
        print(f"\n{failure}")


if __name__ == "__main__":
    main()
