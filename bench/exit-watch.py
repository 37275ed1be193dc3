#!/usr/bin/env python3
"""Watches a process die (bench/s3-takeover.sh: the writer it kills with SIGKILL).

    bench/exit-watch.py PID

Polls /proc every 10 ms until death begins, then every 2 ms. Death begins when a thread of PID has SIGKILL pending or is exiting
(PF_EXITING); it ends when the process is a zombie or gone. Prints one line: how long that took,
the threads and memory the process had just before, and each thread that held it up (its state,
wait channel and, for a thread in uninterruptible sleep, its kernel stack when readable).
"""
import glob
import sys
import time

PF_EXITING = 0x4
SIGKILL_BIT = 1 << 8


def threads(pid):
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            stat = open(t + "/stat").read()
            status = open(t + "/status").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        state, flags = fields[0], int(fields[6])
        pending = 0
        for line in status.splitlines():
            if line.startswith(("SigPnd:", "ShdPnd:")):
                pending |= int(line.split()[1], 16)
        try:
            wchan = open(t + "/wchan").read().strip() or "-"
        except OSError:
            wchan = "?"
        dying = bool(flags & PF_EXITING) or bool(pending & SIGKILL_BIT)
        out[t.rsplit("/", 1)[1]] = (comm, state, wchan, dying)
    return out


def process_state(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


def memory(pid):
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
    except OSError:
        return ""
    keep = ("VmRSS", "VmPTE", "Threads")
    return " ".join(l.split(":")[0] + "=" + "".join(l.split(":")[1].split()) for l in lines if l.startswith(keep))


def main():
    pid = int(sys.argv[1])
    last_memory = memory(pid)
    while True:
        ts = threads(pid)
        if any(d for (_, _, _, d) in ts.values()) or process_state(pid) in ("Z", "gone"):
            break
        last_memory = memory(pid) or last_memory
        time.sleep(0.01)
    began = time.monotonic()
    held = {}
    while process_state(pid) not in ("Z", "gone"):
        for tid, (comm, state, wchan, _) in threads(pid).items():
            if state != "Z":
                stack = ""
                if state == "D":
                    try:
                        stack = " <- ".join(l.split(" ", 1)[1].split("+")[0] for l in open(f"/proc/{pid}/task/{tid}/stack"))
                    except (OSError, IndexError):
                        stack = ""
                seen = held.setdefault(tid, [comm, set(), 0.0])
                seen[1].add(f"{state}:{wchan}" + (f" [{stack}]" if stack else ""))
                seen[2] = (time.monotonic() - began) * 1000
        time.sleep(0.002)
    took = (time.monotonic() - began) * 1000
    holders = sorted(held.items(), key=lambda kv: -kv[1][2])[:4]
    detail = "; ".join(f"{c} {'/'.join(sorted(s))} until {at:.0f} ms" for _, (c, s, at) in holders)
    print(f"exit after SIGKILL: {took:.0f} ms ({last_memory}){'; held by: ' + detail if detail else ''}")


if __name__ == "__main__":
    main()
