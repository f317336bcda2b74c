"""The set-based SQL ceiling: bench/ceiling.sql driven by pgbench, no client code.

pgbench runs a fixed number of transactions per client, enough to drain the queue
with a little slack; a transaction that finds the queue empty does nothing. Jobs/s is
pgbench's own tps (initial connections excluded) times the jobs each transaction
completed on average, taken from the database afterwards.
"""

from __future__ import annotations

import math
import re
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness import meters
from harness.drain import DrainResult, measured
from harness.pg import connect

SCRIPT = Path(__file__).resolve().parent.parent / "ceiling.sql"
#: The same on the reference schema, whose one job table every transition updates.
REFERENCE_SCRIPT = Path(__file__).resolve().parent.parent / "ceiling_reference.sql"
BATCH = 10

_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")


def transactions_per_client(jobs: int, clients: int) -> int:
    return math.ceil(jobs / BATCH / clients) + 2


def run_ceiling(
    pgbench: str,
    dsn: str,
    jobs: int,
    clients: int,
    *,
    cpu_meter: meters.ServerCpuMeter | None,
    walinspect: bool,
    relay: Callable[[], int] | None = None,
    relay_dsn: str | None = None,
    nice: int = 0,
    script: Path = SCRIPT,
) -> DrainResult:
    """Run pgbench once over a database holding ``jobs`` enqueued jobs."""
    threads = max(1, min(clients, 2))
    command = [
        pgbench, "-n", "-M", "simple", "-c", str(clients), "-j", str(threads),
        "-t", str(transactions_per_client(jobs, clients)), "-f", str(script),
        relay_dsn or dsn,
    ]
    with connect(dsn) as probe:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with measured(probe, cpu_meter=cpu_meter, walinspect=walinspect,
                      relay_count=relay) as window:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            if nice:
                meters.renice(proc.pid, nice)
            out, err = proc.communicate()
            window.stop()
            # pgbench has exited: its whole life is the window, and rusage has its CPU.
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            window.client_cpu_s = (after.ru_utime + after.ru_stime
                                   - before.ru_utime - before.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{err}{out}")
        row = probe.execute(
            "select count(*) filter (where state = 'succeeded') as done from app.jobs"
        ).fetchone()
    done = int(row["done"]) if row else 0
    tps_match = _TPS.search(out)
    processed_match = _PROCESSED.search(out)
    if tps_match is None or processed_match is None:
        raise RuntimeError(f"cannot read pgbench's output:\n{out}")
    tps = float(tps_match.group(1))
    processed = int(processed_match.group(1))
    seconds = processed / tps if tps > 0 else window.seconds
    return DrainResult(jobs=done, seconds=seconds, wal=window.wal, cpu=window.cpu,
                       host=window.host, round_trips=window.round_trips)
