"""`ok - ...` / `not ok - ...` lines, notes, and the closing line of scripts/kube-switch.py."""

import glob
import os
import shutil
import time


class Report:
    def __init__(self, chain, work):
        self.chain = chain
        self.work = work
        self.logs = os.path.join(work, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.passed = 0
        self.failed = 0
        self.started = time.monotonic()

    def ok(self, what):
        self.passed += 1
        print(f"ok - [{self.chain}] {what}", flush=True)

    def fail(self, what):
        self.failed += 1
        print(f"not ok - [{self.chain}] {what}", flush=True)

    def check(self, what, good, detail=""):
        if good:
            self.ok(what)
        else:
            self.fail(f"{what}{': ' + detail if detail else ''}")
        return good

    def note(self, what):
        print(f"# {what}", flush=True)

    def log(self, name):
        return os.path.join(self.logs, name)

    def finish(self, keep=False):
        secs = time.monotonic() - self.started
        good = self.failed == 0 and self.passed > 0
        if not good:
            for f in sorted(glob.glob(os.path.join(self.logs, "*.log"))):
                with open(f, errors="replace") as fh:
                    lines = fh.readlines()[-40:]
                if lines:
                    print(f"--- last {len(lines)} lines of {os.path.basename(f)}")
                    print("".join(lines), end="")
        if keep or not good:
            print(f"kube-switch: work directory kept: {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        verdict = "PASS" if good else "FAIL"
        print(f"kube-switch {self.chain}: {verdict} ({self.passed} passed, {self.failed} failed, {secs:.0f} s)")
        return 0 if good else 1
