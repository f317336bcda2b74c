"""Time one drain: start the worker processes, let them connect, then measure.

The clock starts when ``go`` is sent to every connected worker and stops when the last
one reports ``done``; process start-up, imports and connecting are excluded, as is
the enqueue. WAL, server CPU, client CPU and round trips are read over exactly that
window, and the workers keep their connections open until all are read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import machine, meters
from harness.pg import Conn, connect

BENCH_DIR = Path(__file__).resolve().parent.parent


@dataclass
class DrainResult:
    jobs: int
    seconds: float
    wal: meters.WalReading | None = None
    cpu: meters.CpuReading | None = None
    host: machine.MachineReading | None = None
    round_trips: int | None = None
    peak_rss_kib: list[int] = field(default_factory=list)
    settle: dict[str, float] | None = None
    #: The enqueue before the drain: its server CPU and WAL (see main.Bench.run_cell).
    enqueue: dict[str, Any] | None = None
    #: pg_stat_user_tables counters the drain added, per table (see harness.tablestats).
    tables: dict[str, dict[str, int]] | None = None

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "seconds": self.seconds,
            "jobs_per_s": self.jobs_per_s,
            "wal": None if self.wal is None else {
                "lsn_bytes": self.wal.lsn_bytes, "records": self.wal.records,
                "fpi": self.wal.fpi, "checkpoints": self.wal.checkpoints,
                "breakdown": self.wal.breakdown,
            },
            "server_cpu": None if self.cpu is None else {
                "total_s": self.cpu.total_s, "foreign_s": self.cpu.foreign_s,
                "attributed_s": self.cpu.attributed_s,
            },
            "client_cpu_s": None if self.host is None else self.host.client_cpu_s,
            "other_machine_cpu_s": None if self.host is None else self.host.other_cpu_s,
            "round_trips": self.round_trips,
            "peak_rss_kib": self.peak_rss_kib,
            "settle": self.settle,
            "enqueue": self.enqueue,
            "tables": self.tables,
        }


@dataclass
class Window:
    """The meters of one timed window; filled in by :func:`measured`."""

    seconds: float = 0.0
    wal: meters.WalReading | None = None
    cpu: meters.CpuReading | None = None
    host: machine.MachineReading | None = None
    round_trips: int | None = None
    client_pids: list[int] = field(default_factory=list)
    client_cpu_s: float | None = None  # when known only afterwards (pgbench's rusage)
    _stop: Callable[[], None] | None = None

    def stop(self) -> None:
        """End the window now (the rest of the ``with`` body is not measured)."""
        if self._stop is not None:
            self._stop()
            self._stop = None


@contextmanager
def measured(
    probe: Conn,
    *,
    cpu_meter: meters.ServerCpuMeter | None,
    walinspect: bool,
    relay_count: Callable[[], int] | None = None,
    client_pids: list[int] | None = None,
) -> Iterator[Window]:
    window = Window(client_pids=list(client_pids or []))
    wal_start = meters.wal_mark(probe)
    rt_start = relay_count() if relay_count else None
    host_start = machine.mark(window.client_pids)
    if cpu_meter is not None:
        cpu_meter.start()
    t0 = time.perf_counter()
    ends: dict[str, Any] = {}

    def stop() -> None:
        ends["seconds"] = time.perf_counter() - t0
        ends["cpu"] = cpu_meter.stop() if cpu_meter is not None else None
        ends["host"] = machine.mark(window.client_pids)
        ends["rt"] = relay_count() if relay_count else None
        ends["wal"] = meters.wal_mark(probe)

    window._stop = stop
    yield window
    window.stop()
    window.seconds = ends["seconds"]
    window.cpu = ends["cpu"]
    server_s = window.cpu.total_s if window.cpu is not None else 0.0
    window.host = machine.between(host_start, ends["host"], server_s, window.client_cpu_s)
    if rt_start is not None and ends["rt"] is not None:
        window.round_trips = ends["rt"] - rt_start
    wal_end = ends["wal"]
    window.wal = meters.wal_between(probe, wal_start, wal_end)
    if walinspect:
        try:
            window.wal.breakdown = meters.wal_breakdown(probe, wal_start, wal_end)
        except Exception as exc:  # WAL already recycled, extension missing...
            window.wal.breakdown = {"error": str(exc)}


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def read_line(proc: subprocess.Popen[str], expected: str) -> str:
    """The next line a benchmark process says, which must start with ``expected``."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(expected):
        rest = proc.stdout.read() if proc.poll() is not None else ""
        raise RuntimeError(f"{proc.args!r} said {line!r}, expected {expected!r}\n{rest}")
    return line


def send(proc: subprocess.Popen[str], word: str) -> None:
    """Tell a benchmark process ``word`` (one line on its stdin)."""
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


def run_drain(
    commands: list[list[str]],
    dsn: str,
    *,
    cpu_meter: meters.ServerCpuMeter | None,
    walinspect: bool,
    relay_count: Callable[[], int] | None = None,
    nice: int = 0,
) -> DrainResult:
    """Run one drain with one worker process per command."""
    procs = [
        subprocess.Popen(
            [sys.executable, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=worker_env(), cwd=BENCH_DIR)
        for cmd in commands
    ]
    try:
        for proc in procs:
            read_line(proc, "ready")
            if nice:
                meters.renice(proc.pid, nice)
        with connect(dsn) as probe, measured(
            probe, cpu_meter=cpu_meter, walinspect=walinspect, relay_count=relay_count,
            client_pids=[p.pid for p in procs],
        ) as window:
            for proc in procs:
                send(proc, "go")
            jobs = 0
            rss = []
            for proc in procs:
                words = read_line(proc, "done").split()
                jobs += int(words[1])
                rss.append(int(words[2]))
            window.stop()
        for proc in procs:
            send(proc, "quit")
        for proc in procs:
            if proc.wait(timeout=60) != 0:
                raise RuntimeError(f"worker {proc.args!r} exited with {proc.returncode}")
        return DrainResult(
            jobs=jobs, seconds=window.seconds, wal=window.wal, cpu=window.cpu,
            host=window.host, round_trips=window.round_trips, peak_rss_kib=rss,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
