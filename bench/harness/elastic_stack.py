"""The elastic benchmark's moving parts: the local Lambda service on a benchmark
database, the connection sampler, and the worker processes of PgQueuer.

``Stack`` runs the template's functions (the frozen copy's template.yaml, see
source.freeze) on the local Lambda service, every runtime function logging in to one
fresh database with the benchmark's DSN. The worker's settings come in as function
variables (``--env-vars`` in the local service's terms), so the same checkout runs

* **fan-out**: ``LEASEQ_MAX_WORKERS`` = max workers, ``LEASEQ_WORKER_FUNCTION`` = the
  worker function, and the worker's reserved concurrency raised to max workers + 1 (the
  tick), as the template's ``MaxWorkers`` asks;
* **scheduled-only**: ``LEASEQ_MAX_WORKERS`` = 0 (no pool, no fan-out, no wake), the
  template's reserved concurrency;

both with ``LEASEQ_WORKER_CONCURRENCY`` = the concurrency and the template's schedule.
Every schedule's first fire is moved to the moment the service starts (then every period,
as the template says), so a run starts with the tick a steady deployment would have had.

``ConnectionSampler`` reads ``pg_stat_activity`` from the admin database every 0.1 s (so
it never adds a connection or a transaction to the benchmark's own database), keeps the
peak per application name, and gives the benchmark database's backends the priority
the rest of the run has.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from harness import meters, source
from harness.drain import BENCH_DIR, read_line, worker_env

WORKER = "WorkerFunction"
ENQUEUE = "EnqueueFunction"
#: Application names of the benchmark's own connections (probe, sampler, producer).
OWN_PREFIX = "leaseq-bench"
#: What the functions sign their requests with, and the region (no IAM locally).
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def has_fanout() -> bool:
    """Whether the code under test has the worker pool (fan-out and wake)."""
    import importlib.util

    return importlib.util.find_spec("leaseq_lambda.scaling") is not None


def set_owner_pool_maximum(dsn: str, max_workers: int) -> None:
    """Make ``max_workers`` the database's own maximum, as a deploy writes ``MaxWorkers``
    (the functions' LEASEQ_MAX_WORKERS only narrows it). A checkout whose schema predates
    the owner's limits has nothing to set. ``dsn`` is the benchmark's, the owner's."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("select to_regprocedure("
                             "'app.set_worker_pool_limits(integer, interval, interval)')"
                             " is not null").fetchone()
        if found and found[0]:
            conn.execute("select app.set_worker_pool_limits(%s)", (max_workers,))


def template_parameters(path: Path) -> dict[str, Any]:
    from leaseq_lambda_local.template import load_yaml

    document = load_yaml(path.read_text(encoding="utf-8"))
    return dict(document.get("Parameters") or {})


@dataclass(frozen=True)
class Mode:
    """How the worker is configured for one run."""

    name: str  # "fanout" or "scheduled"
    max_workers: int
    concurrency: int

    @property
    def fanout(self) -> bool:
        return self.name == "fanout"


class LogCounter:
    """The functions' log sink: lines to a file, and a count of the lines that matter."""

    PATTERNS = {
        "pool_full": '"pool_full"',
        "timeouts": "Task timed out after",
        "errors": '"level":"ERROR"',
        "start_failures": "WorkerStartError",
        "drain_finished": '"drain finished"',
    }

    def __init__(self, path: Path | None) -> None:
        self._file = path.open("a", encoding="utf-8") if path is not None else None
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(self.PATTERNS, 0)
        self.lines = 0

    def __call__(self, function: str, line: str) -> None:
        with self._lock:
            self.lines += 1
            for key, pattern in self.PATTERNS.items():
                if pattern in line:
                    self.counts[key] += 1
            if self._file is not None:
                self._file.write(f"[{function}] {line}\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Stack:
    """The template's functions on the local Lambda service, on one database."""

    def __init__(self, dsn: str, mode: Mode, *, records: Path, handler_ms: float,
                 log: LogCounter, overrides: dict[str, str] | None = None) -> None:
        from leaseq_lambda_local import LocalConfig, LocalLambda

        template = source.template_path()
        known = template_parameters(template)
        parameters = {k: v for k, v in (overrides or {}).items()}
        # The worker's own variables; the pool's go to the worker and the enqueue function
        # only, as the template sets them (the reaper has no pool settings to satisfy).
        variables = {
            "LEASEQ_WORKER_CONCURRENCY": str(mode.concurrency),
            "LEASEQ_BENCH_RECORDS": str(records),
            "LEASEQ_BENCH_HANDLER_MS": f"{handler_ms:g}",
        }
        pool: dict[str, str] = {}
        if "WorkerConcurrency" in known:
            parameters.setdefault("WorkerConcurrency", str(mode.concurrency))
        if "MaxWorkers" in known:
            # The template passes LEASEQ_MAX_WORKERS and LEASEQ_WORKER_FUNCTION itself.
            parameters.setdefault("MaxWorkers", str(mode.max_workers if mode.fanout else 0))
        else:
            pool["LEASEQ_MAX_WORKERS"] = str(mode.max_workers if mode.fanout else 0)
            if mode.fanout:
                pool["LEASEQ_WORKER_FUNCTION"] = WORKER
        if mode.fanout:
            set_owner_pool_maximum(dsn, mode.max_workers)
            reserved = known.get("WorkerReservedConcurrency", {})
            if reserved:
                default = int(reserved.get("Default", 0))
                parameters.setdefault("WorkerReservedConcurrency",
                                      str(max(default, mode.max_workers + 1)))
        unknown = sorted(set(parameters) - set(known))
        if unknown:
            raise SystemExit(f"the template has no parameters {unknown}")
        self.mode = mode
        self.parameters = parameters
        self.variables = {**variables, **pool}
        self.log = log
        self.service = LocalLambda(LocalConfig(
            template=template, parameter_overrides=parameters, database_url=dsn,
            owner_database_url=dsn, handlers="elastic_handlers",
            env_vars={WORKER: {**variables, **pool}, ENQUEUE: pool},
            python_path=(BENCH_DIR,), port=0,
            async_retry_delays=(60.0, 120.0), log=log))
        self.started_at: float | None = None

    @property
    def url(self) -> str:
        return self.service.url

    def spec(self, function: str) -> Any:
        return self.service.template.functions[function]

    @property
    def worker_function(self) -> str:
        """The name the worker is invoked by (its FunctionName, as the template tells the
        worker and the enqueue function), else its logical id."""
        return str(self.spec(WORKER).environment.get("LEASEQ_WORKER_FUNCTION")
                   or self.variables.get("LEASEQ_WORKER_FUNCTION") or WORKER)

    def start(self) -> float:
        """Start serving, every schedule's first fire due now; the wall-clock start."""
        now = time.monotonic()
        for timer in self.service.scheduler.timers:
            timer.next_at = now
        self.started_at = time.time()
        self.service.start()
        return self.started_at

    def warm(self, count: int) -> dict[str, Any]:
        """Make ``count`` worker environments warm before the clock: as many manual
        invocations at once on the empty queue (each joins the pool, polls for the idle
        period, leaves), as a burst that came just before would have left them. Returns
        their figures, which the run's GB-seconds leave out."""
        service = self.service.service
        outcomes: list[Any] = []

        def invoke() -> None:
            outcomes.append(service.invoke(WORKER, b"{}"))

        threads = [threading.Thread(target=invoke, daemon=True) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=self.spec(WORKER).timeout_seconds + 30)
        stats = service.stats()["functions"][WORKER]
        errors = [o for o in outcomes if o.function_error]
        if errors or len(outcomes) != count:
            raise RuntimeError(f"warming {count} workers: {len(outcomes)} answered, "
                               f"{len(errors)} failed")
        return {"invocations": count, "warm_environments": stats["warm_environments"],
                "gb_seconds": stats["gb_seconds"]}

    def stop_schedules(self) -> None:
        self.service.scheduler.stop()

    def stats(self) -> dict[str, Any]:
        return self.service.service.stats()

    def wait_idle(self, timeout: float) -> bool:
        """Until nothing runs and nothing is queued (True), or ``timeout`` (False)."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if self.service.service.idle():
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        self.service.close()

    def describe(self) -> dict[str, Any]:
        functions = {}
        for name, spec in self.service.template.functions.items():
            functions[name] = {"timeout_s": spec.timeout_seconds, "memory_mb": spec.memory_mb,
                               "reserved_concurrency": spec.reserved_concurrency,
                               "schedules": [s.expression for s in spec.schedules
                                             if s.enabled]}
        return {"parameters": self.parameters, "variables": {
            k: v for k, v in self.variables.items() if not k.startswith("LEASEQ_BENCH_RECORDS")},
            "functions": functions}

    def connection_budget(self, functions: tuple[str, ...]) -> int | None:
        """The most connections these functions can open: one per concurrent
        execution, so the sum of their reserved concurrency (None if one is unreserved)."""
        total = 0
        for name in functions:
            reserved = self.spec(name).reserved_concurrency
            if reserved is None:
                return None
            total += reserved
        return total


def lambda_client(url: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("lambda", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 0}))


@dataclass
class Sample:
    at: float
    by_app: dict[str, int]


@dataclass
class ConnectionSampler:
    """Peak connections to one database, by application name, every ``interval`` s."""

    admin_dsn: str
    dbname: str
    nice: int = 0
    interval: float = 0.1
    peak_total: int = 0
    peak_by_app: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _reniced: set[int] = field(default_factory=set)

    def _run(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True, row_factory=dict_row,
                             application_name="leaseq-bench-sampler") as conn:
            while not self._stop.wait(self.interval):
                rows = conn.execute(
                    "select pid, coalesce(application_name, '') as app from pg_stat_activity"
                    " where datname = %s", (self.dbname,)).fetchall()
                by_app: dict[str, int] = {}
                for row in rows:
                    app = row["app"]
                    by_app[app] = by_app.get(app, 0) + 1
                    if self.nice and row["pid"] not in self._reniced:
                        self._reniced.add(row["pid"])
                        meters.renice(int(row["pid"]), self.nice)
                theirs = sum(n for app, n in by_app.items() if not app.startswith(OWN_PREFIX))
                self.samples += 1
                if not self.timeline or self.timeline[-1][1] != theirs:
                    self.timeline.append((time.time(), theirs))
                self.peak_total = max(self.peak_total, theirs)
                for app, n in by_app.items():
                    self.peak_by_app[app] = max(self.peak_by_app.get(app, 0), n)

    def start(self) -> ConnectionSampler:
        self._thread = threading.Thread(target=self._run, name="pg-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return {"peak": self.peak_total, "peak_by_application": self.peak_by_app,
                "samples": self.samples, "interval_s": self.interval}


def peak_of(sampled: dict[str, Any], prefix: str) -> int:
    """The peak of the connections whose application name starts with ``prefix``."""
    return sum(n for app, n in sampled["peak_by_application"].items() if app.startswith(prefix))


# Worker processes (PgQueuer) and the producer ----------------------------------------


def expect(proc: subprocess.Popen[str], word: str) -> list[str]:
    return read_line(proc, word).split()


@contextmanager
def processes(commands: list[list[str]], env: dict[str, str]) -> Iterator[
        list[subprocess.Popen[str]]]:
    """Start one Python process per command (bench/ on the path), all killed at the end."""
    full = {**worker_env(), **env}
    procs = [subprocess.Popen([sys.executable, *cmd], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=full, cwd=BENCH_DIR)
             for cmd in commands]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def schedule_input(function: str = "worker") -> bytes:
    """A tick as the template's schedule sends it (for a manual start)."""
    from datetime import UTC, datetime

    return json.dumps({"source": "leaseq.schedule", "task": function,
                       "scheduled_time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                       }).encode()
