"""Client-side CPU and the rest of the machine, read around a timed window.

The benchmark shares its cores with whatever else runs on the machine. Each window
records how much CPU the workers used (a proxy for Lambda seconds per job) and how
much the machine used besides the server, the workers and this orchestrator, so a
noisy run can be recognised in the results instead of being mistaken for a slow queue.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot."""
    with open("/proc/stat", encoding="ascii") as stat:
        words = stat.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(w) for w in words[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def process_cpu_s(pid: int) -> float:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def self_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class MachineMark:
    busy: float
    own: float
    clients: float


def mark(client_pids: list[int]) -> MachineMark:
    return MachineMark(
        busy=machine_busy_s(),
        own=self_cpu_s(),
        clients=sum(process_cpu_s(p) for p in client_pids),
    )


@dataclass
class MachineReading:
    client_cpu_s: float
    other_cpu_s: float


def between(start: MachineMark, end: MachineMark, server_cpu_s: float,
            client_cpu_s: float | None = None) -> MachineReading:
    clients = end.clients - start.clients if client_cpu_s is None else client_cpu_s
    other = (end.busy - start.busy) - server_cpu_s - clients - (end.own - start.own)
    return MachineReading(client_cpu_s=clients, other_cpu_s=max(other, 0.0))


def wait_until_quiet(max_wait: float, *, threshold: float = 0.3,
                     sample: float = 1.0) -> tuple[float, float]:
    """Wait (at most ``max_wait`` s) for the machine to use < ``threshold`` cores.

    Called between drains, when the benchmark itself is idle, so any load seen is
    someone else's. Returns (seconds waited, cores busy in the last sample).
    """
    waited = 0.0
    while True:
        start = machine_busy_s()
        time.sleep(sample)
        load = (machine_busy_s() - start) / sample
        if load < threshold or waited >= max_wait:
            return waited + sample, load
        waited += sample
