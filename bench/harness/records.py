"""Per-job start and end times, written by the handlers and read back by the harness.

The elastic benchmark measures when each job started and ended inside whichever process
ran it (a Lambda execution environment of the local service, a PgQueuer worker). Every
process appends one line per job to a file of its own in a directory the harness names
(``LEASEQ_BENCH_RECORDS``), with a single unbuffered ``write`` after the job: a line is
never torn, and nothing waits in a buffer when an environment is frozen or killed.

A line: ``<job number> <enqueued at> <started at> <ended at> <pid>`` with wall-clock
seconds (``time.time()``: every process, the harness and the server share one clock).
The enqueue time travels in the job's payload (``n``, ``t``), set by whoever enqueued it.

Everything after the writer is pure: given the records, when did the pool first run
``target`` jobs at once, and what were the enqueue-to-start latencies.
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORDS_VARIABLE = "LEASEQ_BENCH_RECORDS"


class RecordWriter:
    """Appends this process's job lines to ``<directory>/<pid>.log``."""

    def __init__(self, directory: str | None) -> None:
        self._directory = directory
        self._fd: int | None = None
        self._pid = 0

    @property
    def enabled(self) -> bool:
        return bool(self._directory)

    def write(self, n: int, enqueued: float, started: float, ended: float) -> None:
        if not self._directory:
            return
        pid = os.getpid()
        if self._fd is None or pid != self._pid:
            self._pid = pid
            self._fd = os.open(os.path.join(self._directory, f"{pid}.log"),
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, f"{n} {enqueued:.6f} {started:.6f} {ended:.6f} {pid}\n".encode())


def writer_from_env() -> RecordWriter:
    return RecordWriter(os.environ.get(RECORDS_VARIABLE))


@dataclass(frozen=True)
class Record:
    n: int
    enqueued: float
    started: float
    ended: float
    pid: int


def parse_line(line: str) -> Record | None:
    words = line.split()
    if len(words) != 5:
        return None
    return Record(int(words[0]), float(words[1]), float(words[2]), float(words[3]),
                  int(words[4]))


def read_records(directory: Path) -> list[Record]:
    records = []
    for path in sorted(directory.glob("*.log")):
        for line in path.read_text(encoding="ascii").splitlines():
            record = parse_line(line)
            if record is not None:
                records.append(record)
    return records


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def concurrency_reached(records: Iterable[Record],
                        target: int) -> tuple[float | None, int, float | None]:
    """(first moment at least ``target`` jobs ran at once or None, the most that ever
    ran at once, the first moment that most was reached). A job that ends at the very
    instant another starts is not counted twice: ends sort before starts."""
    events: list[tuple[float, int]] = []
    for r in records:
        events.append((r.started, 1))
        events.append((r.ended, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    running = peak = 0
    first_full: float | None = None
    peak_at: float | None = None
    for at, step in events:
        running += step
        if running > peak:
            peak, peak_at = running, at
        if first_full is None and running >= target:
            first_full = at
    return first_full, peak, peak_at


def concurrency_at(records: Sequence[Record], moments: Sequence[float]) -> list[int]:
    """How many jobs ran at each of ``moments`` (started at or before, ended after)."""
    starts = sorted(r.started for r in records)
    ends = sorted(r.ended for r in records)
    return [bisect.bisect_right(starts, m) - bisect.bisect_right(ends, m) for m in moments]


def latency_summary(records: Iterable[Record]) -> dict[str, Any]:
    """Enqueue-to-start seconds: count, mean, p50, p95, p99, max."""
    waits = [r.started - r.enqueued for r in records]
    if not waits:
        return {"jobs": 0}
    return {"jobs": len(waits), "mean": sum(waits) / len(waits),
            "p50": percentile(waits, 50), "p95": percentile(waits, 95),
            "p99": percentile(waits, 99), "max": max(waits)}


def duplicates(records: Iterable[Record]) -> list[int]:
    """Job numbers that ran more than once (at-least-once delivery made visible)."""
    seen: set[int] = set()
    twice: set[int] = set()
    for r in records:
        (twice if r.n in seen else seen).add(r.n)
    return sorted(twice)
