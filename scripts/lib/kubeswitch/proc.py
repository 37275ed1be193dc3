"""Processes the run starts, and what ends a run early."""

import shlex
import signal
import socket
import subprocess


class Abort(Exception):
    """What the rest of the run depends on failed."""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Proc:
    """A process whose output goes to a log; stopped with SIGTERM, then SIGKILL after `patience` s."""

    def __init__(self, name, argv, log, env=None):
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(shlex.quote(str(a)) for a in argv)}\n".encode())
            out.flush()
            self.p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def alive(self):
        return self.p.poll() is None

    def stop(self, patience=20):
        """SIGTERM; the exit status (None: it had to be killed)."""
        if self.p.poll() is not None:
            return self.p.returncode
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(patience)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None
