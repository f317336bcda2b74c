"""Kills the service's runtime processes if the service itself dies without closing them.

An idle execution environment is frozen (SIGSTOP), so it would never notice that the
service is gone: a service killed with SIGKILL, or a crashed test run, would leave
stopped processes behind for good. This helper is a separate process that the service
starts first. It reads process-group ids on its stdin (``+PGID`` when an environment
starts, ``-PGID`` when it is closed); when its stdin reaches end of file, it sends
SIGKILL to every group still listed, and exits. That happens when the service closes the
pipe, or when the kernel closes it because the service died.

Run as ``python -m leaseq_lambda_local.watchdog``; it ignores SIGINT, so a Ctrl-C that
reaches the whole terminal group leaves it to do its job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading


def main() -> int:
    """Track groups until end of input, then kill those left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        text = line.strip()
        if text[:1] in ("+", "-") and text[1:].isdigit():
            (groups.add if text[0] == "+" else groups.discard)(int(text[1:]))
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    return 0


class Watchdog:
    """The service's side: start the helper, tell it about each group, close it."""

    def __init__(self, python: str) -> None:
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [python, "-m", "leaseq_lambda_local.watchdog"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)

    def _send(self, line: str) -> None:
        with self._lock:
            stdin = self._process.stdin
            if stdin is None or stdin.closed:
                return
            with contextlib.suppress(BrokenPipeError, OSError):
                stdin.write(line + "\n")
                stdin.flush()

    def watch(self, group: int) -> None:
        """An environment started in process group ``group``."""
        self._send(f"+{group}")

    def forget(self, group: int) -> None:
        """That environment was closed by the service itself."""
        self._send(f"-{group}")

    def close(self) -> None:
        """End the helper (it kills any group still listed)."""
        with self._lock:
            if self._process.stdin is not None and not self._process.stdin.closed:
                with contextlib.suppress(BrokenPipeError, OSError):
                    self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
