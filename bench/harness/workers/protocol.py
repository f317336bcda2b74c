"""The worker side of the orchestrator's line protocol (see the package docstring)."""

from __future__ import annotations

import sys


def _expect(word: str) -> None:
    line = sys.stdin.readline()
    if line.strip() != word:
        raise SystemExit(f"expected {word!r} from the orchestrator, got {line!r}")


def ready_then_wait_for_go() -> None:
    print("ready", flush=True)
    _expect("go")


def peak_rss_kib() -> int:
    """This process's resident-set high-water mark (VmHWM).

    Not ``ru_maxrss``: Linux carries the parent's high-water mark across fork and
    exec into it, which would report the orchestrator's size instead of the worker's.
    """
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def done(jobs: int) -> None:
    print(f"done {jobs} {peak_rss_kib()}", flush=True)


def wait_for_quit() -> None:
    _expect("quit")


def wait_for(word: str) -> None:
    """Block until the orchestrator sends ``word`` (``stop`` ends a continuous run)."""
    _expect(word)
