"""The moving parts of a chaos run: worker processes, a reaper thread, and the chaos
itself (SIGKILL, SIGSTOP/SIGCONT freezes, pg_terminate_backend), all driven from the
test process by a :class:`ChaosRun`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leaseq import DatabaseUnavailableError, MonotonicDeadline, QueueClient, connect, reap_once

from tests.failure.audit import unfinished_jobs
from tests.support.postgres import Conn

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    stderr_path: Path
    frozen_until: float | None = None


@dataclass
class WorkerFleet:
    """``size`` worker processes, respawned whenever one dies."""

    dsn: str
    workdir: Path
    size: int
    budget: tuple[float, float] = (3.0, 5.0)
    lease_margin: float = 0.5
    #: Jobs at once per process, and whether the handlers are ``sync`` or ``async``.
    concurrency: int = 1
    handlers: str = "sync"
    workers: list[WorkerProcess] = field(default_factory=list)
    spawned: int = 0
    exits: Counter[int] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)

    @property
    def stop_file(self) -> Path:
        return self.workdir / "stop"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stop_file.unlink(missing_ok=True)
        for _ in range(self.size):
            self.workers.append(self._spawn())

    def _spawn(self) -> WorkerProcess:
        self.spawned += 1
        name = f"w{self.spawned}"
        stderr_path = self.workdir / f"{name}.stderr"
        command = [
            sys.executable, "-m", "tests.failure.chaos_worker",
            "--dsn", self.dsn, "--name", name,
            "--report", str(self.workdir / "reports.jsonl"), "--stop", str(self.stop_file),
            "--budget-min", str(self.budget[0]), "--budget-max", str(self.budget[1]),
            "--lease-margin", str(self.lease_margin),
            "--concurrency", str(self.concurrency), "--handlers", self.handlers,
        ]
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        return WorkerProcess(name, process, stderr_path)

    def respawn_dead(self) -> None:
        for index, worker in enumerate(self.workers):
            code = worker.process.poll()
            if code is None:
                continue
            self.exits[code] += 1
            if code != -signal.SIGKILL:
                self.crashes.append(f"{worker.name} exited with {code}: "
                                    f"{worker.stderr_path.read_text(errors='replace')[-3000:]}")
            self.workers[index] = self._spawn()

    def _running(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.process.poll() is None and w.frozen_until is None]

    def kill_one(self, rng: random.Random) -> bool:
        candidates = self._running()
        if not candidates:
            return False
        rng.choice(candidates).process.send_signal(signal.SIGKILL)
        return True

    def freeze_one(self, rng: random.Random, seconds: float) -> bool:
        """Stop a process like a frozen Lambda environment; it resumes after ``seconds``."""
        candidates = self._running()
        if len(candidates) < 2:
            return False
        worker = rng.choice(candidates)
        worker.process.send_signal(signal.SIGSTOP)
        worker.frozen_until = time.monotonic() + seconds
        return True

    def thaw_due(self, *, everyone: bool = False) -> None:
        for worker in self.workers:
            if worker.frozen_until is None:
                continue
            if everyone or time.monotonic() >= worker.frozen_until:
                if worker.process.poll() is None:
                    worker.process.send_signal(signal.SIGCONT)
                worker.frozen_until = None

    def stop(self) -> None:
        """Kill every worker: called once no job is left to run."""
        self.stop_file.touch()
        self.thaw_due(everyone=True)
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGKILL)
        for worker in self.workers:
            worker.process.wait(10)

    def reports(self) -> list[dict[str, Any]]:
        path = self.workdir / "reports.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


class ReaperLoop(threading.Thread):
    """The scheduled reaper: one bounded pass every ``interval`` seconds."""

    def __init__(self, dsn: str, interval: float = 0.5) -> None:
        super().__init__(name="chaos-reaper", daemon=True)
        self._client = QueueClient(lambda: connect(dsn, application_name="chaos-reaper"))
        self._interval = interval
        self._stopping = threading.Event()
        self.passes = 0
        self.released = 0
        self.failures = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._stopping.wait(self._interval):
                try:
                    self._client.check()
                    report = reap_once(self._client, MonotonicDeadline(10.0), limit=1000)
                except DatabaseUnavailableError:
                    self.failures += 1
                    continue
                self.passes += 1
                self.released += report.released
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
        finally:
            self._client.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(15)
        if self.error is not None:
            raise AssertionError(f"the reaper loop failed: {self.error!r}") from self.error


def terminate_a_backend(admin: Conn, rng: random.Random) -> bool:
    """pg_terminate_backend on one queue connection (a worker's or the reaper's)."""
    rows = admin.execute(
        "select pid from pg_stat_activity where datname = current_database()"
        " and (application_name like 'chaos-queue-%%' or application_name = 'chaos-reaper')"
    ).fetchall()
    if not rows:
        return False
    pid = rng.choice(rows)["pid"]
    row = admin.execute("select pg_terminate_backend(%s) as done", (pid,)).fetchone()
    return bool(row and row["done"])


@dataclass
class ChaosSettings:
    kill_every: tuple[float, float] = (1.0, 2.0)
    terminate_every: tuple[float, float] = (0.2, 0.6)
    freeze_every: tuple[float, float] = (5.0, 10.0)
    freeze_for: float = 6.0
    time_limit: float = 120.0


@dataclass
class ChaosRun:
    fleet: WorkerFleet
    admin: Conn
    settings: ChaosSettings
    rng: random.Random
    kills: int = 0
    terminations: int = 0
    freezes: int = 0
    elapsed: float = 0.0
    finished: bool = False

    def run(self) -> None:
        """Apply chaos until no job is left unfinished or the time limit passes."""
        s = self.settings
        started = time.monotonic()
        due = {"kill": started + self.rng.uniform(*s.kill_every),
               "terminate": started + self.rng.uniform(*s.terminate_every),
               "freeze": started + self.rng.uniform(*s.freeze_every),
               "check": started + 0.5}
        while True:
            now = time.monotonic()
            if now - started > s.time_limit:
                break
            self.fleet.thaw_due()
            self.fleet.respawn_dead()
            if now >= due["kill"]:
                self.kills += self.fleet.kill_one(self.rng)
                due["kill"] = now + self.rng.uniform(*s.kill_every)
            if now >= due["terminate"]:
                self.terminations += terminate_a_backend(self.admin, self.rng)
                due["terminate"] = now + self.rng.uniform(*s.terminate_every)
            if now >= due["freeze"]:
                self.freezes += self.fleet.freeze_one(self.rng, s.freeze_for)
                due["freeze"] = now + self.rng.uniform(*s.freeze_every)
            if now >= due["check"]:
                if unfinished_jobs(self.admin) == 0:
                    self.finished = True
                    break
                due["check"] = now + 0.5
            time.sleep(0.02)
        self.elapsed = time.monotonic() - started
