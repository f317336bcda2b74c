"""``python3 bench/run.py elastic``: fan-out and wake on the local Lambda service.

Three scenarios, each run ``--repeat`` times (interleaved: every line once, then again),
every run on a fresh database of one PostgreSQL server:

* **backlog**: ``--jobs`` jobs of an ``async def`` handler that waits ``--handler-ms``
  are enqueued first (``app.enqueue_jobs``); then the worker's schedule ticks once and
  the clock runs until the last job's outcome is committed. leaseq runs as the template
  deploys it on the local Lambda service (``--max-workers`` invocations of
  ``--concurrency`` jobs each: the tick's invocation fans out); PgQueuer 1.6.0 runs
  ``--max-workers`` processes of ``--concurrency`` jobs each on the same server.
* **latency**: Poisson arrivals at each of ``--rates`` for ``--duration`` seconds, one
  job per arrival; enqueue-to-start percentiles, for leaseq with fan-out and wake, for
  leaseq scheduled-only (the pool off: one scheduled worker polling, the template's
  schedule), and for PgQueuer (continuous mode, LISTEN/NOTIFY).
* **idle**: the deployment on an empty queue for ``--idle-minutes`` of schedule ticks:
  Lambda GB-seconds and database queries, scaled to an hour.

Everywhere: peak connections from ``pg_stat_activity`` against the configured budget,
and Lambda GB-seconds (invocation durations x the template's MemorySize).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import elastic_report, machine, meters, source
from harness.drain import send
from harness.elastic_stack import (
    AWS_ENV,
    ENQUEUE,
    WORKER,
    ConnectionSampler,
    LogCounter,
    Mode,
    Stack,
    expect,
    has_fanout,
    peak_of,
    processes,
)
from harness.pg import Conn, Server, analyze, as_url, run_database
from harness.records import (
    concurrency_at,
    concurrency_reached,
    duplicates,
    latency_summary,
    read_records,
)

BENCH_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
SCENARIOS = ("backlog", "latency", "idle")
LATENCY_LINES = ("fanout", "scheduled", "pgqueuer")
#: leaseq's backlog starts on cold execution environments (the first burst after a quiet
#: spell) and on warm ones (max workers environments used just before, as PgQueuer's
#: processes are running before its clock starts).
BACKLOG_LINES = ("fanout-cold", "fanout-warm", "pgqueuer")
IDLE_LINES = ("fanout", "scheduled")
BATCH = 10
TENANTS = 10


def connect(dsn: str) -> Conn:
    """The harness's own connections, named so the connection counts leave them out."""
    import psycopg
    from psycopg.rows import dict_row

    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row,
                           application_name="leaseq-bench-harness")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 bench/run.py elastic",
        description="Fan-out and wake on the local Lambda service against PostgreSQL, "
                    "beside PgQueuer at the same total concurrency.")
    p.add_argument("--dsn", default=DEFAULT_DSN,
                   help="superuser DSN of the server (default: %(default)s); every run "
                        "creates and drops a database of its own there")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset of %(default)s")
    p.add_argument("--jobs", type=int, default=20_000, help="backlog jobs (%(default)s)")
    p.add_argument("--max-workers", type=int, default=8,
                   help="MaxWorkers, and PgQueuer's processes (%(default)s)")
    p.add_argument("--concurrency", type=int, default=50,
                   help="jobs at once per invocation (WorkerConcurrency) and per PgQueuer "
                        "process (max_concurrent_tasks) (%(default)s)")
    p.add_argument("--handler-ms", type=float, default=100.0,
                   help="what every job's async handler waits (%(default)s ms)")
    p.add_argument("--repeat", type=int, default=3, help="runs per line (%(default)s)")
    p.add_argument("--rates", default="20,200", help="latency arrivals per second (%(default)s)")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of arrivals per latency run (%(default)s)")
    p.add_argument("--idle-minutes", type=int, default=5,
                   help="schedule ticks (minutes) of the idle measurement (%(default)s)")
    p.add_argument("--enqueue", choices=("library", "function"), default="library",
                   help="latency runs enqueue with the library in the producer's own "
                        "transaction and call wake_worker after the commit (library), or "
                        "through the enqueue function's Invoke API (function); default "
                        "%(default)s")
    p.add_argument("--lines", default=None,
                   help="lines to run: backlog fanout-cold, fanout-warm, pgqueuer; latency "
                        "fanout, scheduled, pgqueuer (default: all; fanout brings both "
                        "backlog fan-out lines)")
    p.add_argument("--parameter-overrides", nargs="+", default=[], metavar="NAME=VALUE",
                   help="template parameters for the local Lambda service")
    p.add_argument("--seed", type=int, default=13, help="of the arrivals (%(default)s)")
    p.add_argument("--settle", type=float, default=10.0,
                   help="before each run, wait up to this many seconds for the machine to "
                        "be quiet (< 0.3 cores busy); default %(default)s")
    p.add_argument("--nice", type=int, default=-10,
                   help="priority of the benchmark's processes and of the server backends "
                        "of its databases (needs root; 0 leaves them; default %(default)s)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the functions' logs next to the results file")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument("--report", type=Path, default=None, metavar="JSON",
                   help="print the tables of a saved results file and exit")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results file (default bench/results/elastic-<time>.json)")
    args = p.parse_args(argv)
    args.scenario_list = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(args.scenario_list) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    every = dict.fromkeys((*BACKLOG_LINES, *LATENCY_LINES))
    args.line_list = ([s.strip() for s in args.lines.split(",") if s.strip()]
                      if args.lines else list(every))
    if set(args.line_list) - set(every):
        p.error(f"--lines: choose from {', '.join(every)}")
    if "fanout" in args.line_list:  # fan-out's backlog lines come with it
        args.line_list += [x for x in ("fanout-cold", "fanout-warm") if x not in args.line_list]
    args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    overrides = {}
    for pair in args.parameter_overrides:
        name, sep, value = pair.partition("=")
        if not sep:
            p.error(f"--parameter-overrides takes NAME=VALUE, not {pair!r}")
        overrides[name] = value
    args.overrides = overrides
    return args


def environment_pids(stats: dict[str, Any]) -> list[int]:
    """The process of every execution environment the local service has now."""
    return [int(e["pid"]) for f in stats["functions"].values() for e in f["environments"]
            if e.get("pid")]


class CpuWindow:
    """CPU seconds over one timed window: the server's backends of the run's database,
    the client processes (Lambda execution environments, PgQueuer workers), this
    orchestrator (which hosts the local Lambda service), and the whole machine."""

    def __init__(self, postmaster: int | None, dbname: str, nice: int) -> None:
        self._server = (meters.ServerCpuMeter(postmaster, dbname, nice=nice)
                        if meters.ServerCpuMeter.available(postmaster) else None)
        self._clients: dict[int, float] = {}

    def start(self, client_pids: list[int]) -> None:
        self._clients = {pid: machine.process_cpu_s(pid) for pid in client_pids}
        self._own = machine.self_cpu_s()
        self._busy = machine.machine_busy_s()
        self._at = time.perf_counter()
        if self._server is not None:
            self._server.start()

    def stop(self, client_pids: list[int]) -> dict[str, Any]:
        """``client_pids``: the clients now (a process started in the window counts whole,
        its start-up included)."""
        seconds = time.perf_counter() - self._at
        clients = sum(machine.process_cpu_s(pid) - self._clients.get(pid, 0.0)
                      for pid in client_pids)
        server = self._server.stop() if self._server is not None else None
        return {"seconds": seconds, "clients_s": clients,
                "orchestrator_s": machine.self_cpu_s() - self._own,
                "server_s": None if server is None else server.attributed_s,
                "server_foreign_s": None if server is None else server.foreign_s,
                "machine_busy_s": machine.machine_busy_s() - self._busy}


class Elastic:
    """One benchmark run: the server, the code under test, the results so far."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.server = Server(args.dsn)
        self.out = out
        self.logs = out.with_suffix("") if args.keep_logs else None
        if self.logs is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
        self.fanout_available = has_fanout()
        self.target = args.max_workers * args.concurrency
        with connect(args.dsn) as conn:
            self.postmaster = meters.postmaster_pid(conn)

    def _cpu(self, dbname: str) -> CpuWindow:
        return CpuWindow(self.postmaster, dbname, self.args.nice)

    # Shared pieces ---------------------------------------------------------------------

    def _mode(self, name: str) -> Mode:
        return Mode(name, self.args.max_workers, self.args.concurrency)

    def _settle(self) -> dict[str, float] | None:
        if self.args.settle <= 0:
            return None
        waited, load = machine.wait_until_quiet(self.args.settle)
        return {"waited_s": waited, "load_before": load}

    def _drop_records(self, records_dir: Path) -> None:
        """Remove a run's job records, or move them next to its logs (--keep-logs)."""
        if self.logs is not None and records_dir.exists():
            shutil.move(str(records_dir), self.logs / f"records-{len(list(self.logs.iterdir()))}")
        shutil.rmtree(records_dir, ignore_errors=True)

    def _log(self, tag: str) -> LogCounter:
        return LogCounter(self.logs / f"{tag}.log" if self.logs is not None else None)

    def _install_leaseq(self, dsn: str) -> None:
        from harness.systems import leaseq_install

        leaseq_install(dsn)

    def _pool_function(self, dsn: str) -> bool:
        with connect(dsn) as conn:
            row = conn.execute(
                "select to_regproc('app.worker_pool_size') is not null as ok").fetchone()
        return bool(row and row["ok"])

    def _leaseq_done(self, dsn: str) -> dict[str, Any]:
        with connect(dsn) as conn:
            row = conn.execute(
                "select count(*) as jobs,"
                " count(*) filter (where state = 'succeeded') as succeeded,"
                " extract(epoch from max(completed_at))::float8 as last_completed,"
                " (select count(*) from app.job_events where event_type = 'succeeded')"
                "   as succeeded_events"
                " from app.jobs").fetchone()
        assert row is not None
        return dict(row)

    def _wait_leaseq(self, dsn: str, jobs: int, timeout: float) -> dict[str, Any]:
        give_up = time.monotonic() + timeout
        with connect(dsn) as conn:
            while True:
                row = conn.execute("select count(*) filter (where state = 'succeeded') as n"
                                   " from app.jobs").fetchone()
                if row is not None and row["n"] >= jobs:
                    break
                if time.monotonic() > give_up:
                    raise RuntimeError(f"{row['n'] if row else 0} of {jobs} jobs succeeded "
                                       f"after {timeout:.0f} s")
                time.sleep(0.2)
        return self._leaseq_done(dsn)

    @staticmethod
    def _wait_records(records: Path, jobs: int, timeout: float) -> None:
        give_up = time.monotonic() + timeout
        while True:
            lines = 0
            for path in records.glob("*.log"):
                with path.open("rb") as f:
                    lines += sum(1 for _ in f)
            if lines >= jobs:
                return
            if time.monotonic() > give_up:
                raise RuntimeError(f"{lines} of {jobs} jobs ran after {timeout:.0f} s")
            time.sleep(0.25)

    @staticmethod
    def _lambda_figures(stats: dict[str, Any]) -> dict[str, Any]:
        functions = {}
        for name, f in stats["functions"].items():
            if not f["invocations"] and not f["async_accepted"]:
                continue
            functions[name] = {k: f[k] for k in (
                "invocations", "cold_starts", "timeouts", "function_errors", "throttles",
                "peak_concurrency", "async_accepted", "async_dropped_age",
                "async_dropped_retries", "scheduled", "duration_ms_total", "gb_seconds")}
        return functions

    def _after_leaseq(self, stack: Stack, sampler: ConnectionSampler, pool: Any, t0: float, *,
                      idle_timeout: float) -> dict[str, Any]:
        """What every leaseq run reads once its jobs are done, before the stack closes: the
        stack left idle, its schedules stopped, the functions' Lambda figures, the
        connections against the budget of the functions that ran, the pool's samples."""
        idle = stack.wait_idle(timeout=idle_timeout)
        stack.stop_schedules()
        lam = self._lambda_figures(stack.stats())
        connections = sampler.stop()
        return {"idle_after": idle, "lambda": lam, "pool": self._pool_result(pool, t0),
                "stack": stack.describe(),
                "connections": {**connections, "system_peak": connections["peak"],
                                "worker_peak": peak_of(connections, "leaseq WorkerFunction"),
                                "budget": stack.connection_budget(tuple(lam)),
                                "budget_of": "reserved concurrency of " + ", ".join(lam)}}

    def _pool_sampler(self, dsn: str) -> Any:
        """Samples app.worker_pool_size() every 0.1 s when the schema has it."""
        import threading

        if not self._pool_function(dsn):
            return None
        state: dict[str, Any] = {"peak_live": 0, "peak_reserved": 0, "peak_places": 0,
                                 "stop": threading.Event(), "timeline": []}

        def run() -> None:
            with connect(dsn) as conn:
                while not state["stop"].wait(0.1):
                    row = conn.execute("select * from app.worker_pool_size()").fetchone()
                    if row is None:
                        continue
                    live, reserved = int(row["live"]), int(row["reserved"])
                    state["peak_live"] = max(state["peak_live"], live)
                    state["peak_reserved"] = max(state["peak_reserved"], reserved)
                    state["peak_places"] = max(state["peak_places"], live + reserved)
                    timeline = state["timeline"]
                    if not timeline or timeline[-1][1:] != [live, reserved]:
                        timeline.append([time.time(), live, reserved])

        thread = threading.Thread(target=run, name="pool-sampler", daemon=True)
        thread.start()
        state["thread"] = thread
        return state

    @staticmethod
    def _pool_result(state: Any, t0: float) -> dict[str, Any] | None:
        if state is None:
            return None
        state["stop"].set()
        state["thread"].join(timeout=5)
        return {"peak_live": state["peak_live"], "peak_reserved": state["peak_reserved"],
                "peak_places": state["peak_places"],
                "timeline": [[round(at - t0, 3), live, reserved]
                             for at, live, reserved in state["timeline"]]}

    # Backlog ---------------------------------------------------------------------------

    def backlog(self, line: str, run: int) -> dict[str, Any]:
        if line == "pgqueuer":
            return self._backlog_pgqueuer(run)
        return self._backlog_leaseq(run, warm=line == "fanout-warm")

    def _backlog_figures(self, records_dir: Path, t0: float, t_done: float,
                         jobs: int) -> dict[str, Any]:
        args = self.args
        records = read_records(records_dir)
        ideal = jobs * args.handler_ms / 1000 / self.target
        full_at, peak, peak_at = concurrency_reached(records, self.target)
        ninety_at, _, _ = concurrency_reached(records, int(self.target * 0.9))
        drain = t_done - t0
        moments = [t0 + 0.25 * k for k in range(int(drain / 0.25) + 2)]
        return {
            "jobs": jobs, "ran": len(records), "ran_twice": len(duplicates(records)),
            "drain_s": drain, "ideal_s": ideal, "efficiency": ideal / drain if drain else None,
            "first_start_s": min(r.started for r in records) - t0 if records else None,
            "last_end_s": max(r.ended for r in records) - t0 if records else None,
            "full_concurrency_s": None if full_at is None else full_at - t0,
            "ninety_percent_s": None if ninety_at is None else ninety_at - t0,
            "peak_concurrency": peak,
            "peak_concurrency_s": None if peak_at is None else peak_at - t0,
            "concurrency_every_0_25_s": concurrency_at(records, moments),
        }

    def _backlog_leaseq(self, run: int, *, warm: bool) -> dict[str, Any]:
        from harness.systems import leaseq_enqueue

        args = self.args
        tag = "warm" if warm else "cold"
        dbname = run_database(f"leaseq_bench_elastic_backlog_{tag}_r{run}")
        records_dir = Path(tempfile.mkdtemp(prefix="leaseq-bench-records-"))
        log = self._log(f"backlog-fanout-{tag}-r{run}")
        warmed: dict[str, Any] | None = None
        try:
            with self.server.database(dbname, keep=args.keep_databases) as dsn:
                self._install_leaseq(dsn)
                stack = Stack(dsn, self._mode("fanout"), records=records_dir,
                              handler_ms=args.handler_ms, log=log, overrides=args.overrides)
                try:
                    if warm:
                        warmed = stack.warm(args.max_workers)
                    leaseq_enqueue(dsn, args.jobs, TENANTS, kind="sleep")
                    analyze(dsn, ["app.jobs", "app.job_events"])
                    settled = self._settle()
                    sampler = ConnectionSampler(args.dsn, dbname, nice=args.nice).start()
                    pool = self._pool_sampler(dsn)
                    cpu = self._cpu(dbname)
                    cpu.start(environment_pids(stack.stats()))
                    t0 = stack.start()  # the worker's schedule ticks now
                    done = self._wait_leaseq(dsn, args.jobs,
                                             timeout=max(300.0, 40 * args.jobs / self.target))
                    cpu_figures = cpu.stop(environment_pids(stack.stats()))
                    after = self._after_leaseq(stack, sampler, pool, t0, idle_timeout=180)
                finally:
                    stack.close()
                if done["succeeded_events"] != args.jobs:
                    raise RuntimeError(f"{done['succeeded_events']} succeeded events for "
                                       f"{args.jobs} jobs")
                figures = self._backlog_figures(records_dir, t0, done["last_completed"],
                                                args.jobs)
        finally:
            log.close()
            self._drop_records(records_dir)
        worker = after["lambda"].get(WORKER, {})
        worker_gb_s = worker.get("gb_seconds", 0) - (warmed or {}).get("gb_seconds", 0)
        return {**figures, **after, "settle": settled, "cpu": cpu_figures, "warm_up": warmed,
                "log": {"lines": log.lines, **log.counts},
                "gb_s_per_1000_jobs": worker_gb_s / args.jobs * 1000}

    def _pgqueuer_commands(self, dsn: str, continuous: bool) -> list[list[str]]:
        flags = ["--per-worker"] + (["--continuous"] if continuous else [])
        return [["-m", "harness.workers.pgqueuer_drain", as_url(dsn), str(BATCH),
                 f"{self.args.handler_ms:g}", str(self.args.concurrency), *flags]
                for _ in range(self.args.max_workers)]

    def _backlog_pgqueuer(self, run: int) -> dict[str, Any]:
        from harness.systems import PgQueuerSystem

        args = self.args
        system = PgQueuerSystem()
        dbname = run_database(f"leaseq_bench_elastic_backlog_pgq_r{run}")
        records_dir = Path(tempfile.mkdtemp(prefix="leaseq-bench-records-"))
        try:
            with self.server.database(dbname, keep=args.keep_databases) as dsn:
                system.install(dsn)
                system.enqueue(dsn, args.jobs, TENANTS, 0)
                analyze(dsn, list(system.tables))
                env = {"LEASEQ_BENCH_RECORDS": str(records_dir)}
                with processes(self._pgqueuer_commands(dsn, continuous=False), env) as procs:
                    for proc in procs:
                        expect(proc, "ready")
                        if args.nice:
                            meters.renice(proc.pid, args.nice)
                    settled = self._settle()
                    sampler = ConnectionSampler(args.dsn, dbname, nice=args.nice).start()
                    cpu = self._cpu(dbname)
                    pids = [proc.pid for proc in procs]
                    cpu.start(pids)
                    t0 = time.time()
                    for proc in procs:
                        send(proc, "go")
                    jobs = sum(int(expect(proc, "done")[1]) for proc in procs)
                    t_done = time.time()
                    cpu_figures = cpu.stop(pids)
                    connections = sampler.stop()
                    for proc in procs:
                        send(proc, "quit")
                    for proc in procs:
                        proc.wait(timeout=60)
                finished = system.finished(dsn)
                if finished != args.jobs or jobs != args.jobs:
                    raise RuntimeError(f"PgQueuer: {finished} logged, {jobs} reported of "
                                       f"{args.jobs}")
                figures = self._backlog_figures(records_dir, t0, t_done, args.jobs)
        finally:
            self._drop_records(records_dir)
        return {**figures, "settle": settled, "cpu": cpu_figures,
                "connections": {**connections, "system_peak": connections["peak"],
                                "budget": args.max_workers,
                                "budget_of": "worker processes, one connection each"}}

    # Latency ---------------------------------------------------------------------------

    def latency(self, line: str, rate: float, run: int) -> dict[str, Any]:
        if line == "pgqueuer":
            return self._latency_pgqueuer(rate, run)
        return self._latency_leaseq(line, rate, run)

    def _producer(self, system: str, dsn: str, rate: float, extra: list[str]) -> list[str]:
        return ["-m", "harness.workers.elastic_producer", system, dsn, f"{rate:g}",
                f"{self.args.duration:g}", str(self.args.seed), *extra]

    def _latency_leaseq(self, line: str, rate: float, run: int) -> dict[str, Any]:
        args = self.args
        mode = self._mode(line)
        tag = f"latency_{line}_{rate:g}_r{run}".replace(".", "_")
        dbname = run_database(f"leaseq_bench_elastic_{tag}")
        records_dir = Path(tempfile.mkdtemp(prefix="leaseq-bench-records-"))
        log = self._log(tag)
        if mode.fanout and not self.fanout_available:
            extra: list[str] = []
            how = "library (no wake_worker in this checkout)"
        elif args.enqueue == "function":
            extra = ["--via-function", ENQUEUE]
            how = "enqueue function (Invoke API)"
        elif mode.fanout:
            extra = ["--wake", "<worker>"]
            how = "library in the producer's transaction, then wake_worker"
        else:
            extra = []
            how = "library in the producer's transaction"
        try:
            with self.server.database(dbname, keep=args.keep_databases) as dsn:
                self._install_leaseq(dsn)
                stack = Stack(dsn, mode, records=records_dir, handler_ms=args.handler_ms,
                              log=log, overrides=args.overrides)
                try:
                    env = {**AWS_ENV, "AWS_ENDPOINT_URL_LAMBDA": stack.url}
                    extra = [stack.worker_function if word == "<worker>" else word
                             for word in extra]
                    with processes([self._producer("leaseq", dsn, rate, extra)], env) as (
                            producer,):
                        expect(producer, "ready")
                        if args.nice:
                            meters.renice(producer.pid, args.nice)
                        settled = self._settle()
                        sampler = ConnectionSampler(args.dsn, dbname, nice=args.nice).start()
                        pool = self._pool_sampler(dsn)
                        t0 = stack.start()  # the schedule's tick, then every period
                        send(producer, "go")
                        words = expect(producer, "done")
                        jobs, wakes, wake_errors, lag = (int(words[1]), int(words[2]),
                                                         int(words[3]), float(words[4]))
                        send(producer, "quit")
                        producer.wait(timeout=30)
                    period = max([s.period_seconds or 0 for s in stack.spec(WORKER).schedules]
                                 or [60.0])
                    done = self._wait_leaseq(dsn, jobs, timeout=3 * period + 120)
                    after = self._after_leaseq(stack, sampler, pool, t0,
                                               idle_timeout=period + 30)
                finally:
                    stack.close()
                if done["succeeded_events"] != jobs:
                    raise RuntimeError(f"{done['succeeded_events']} succeeded events for "
                                       f"{jobs} jobs")
            records = read_records(records_dir)
        finally:
            log.close()
            self._drop_records(records_dir)
        gb_s = sum(f["gb_seconds"] for f in after["lambda"].values())
        return {**after, "rate": rate, "duration_s": args.duration, "jobs": jobs,
                "ran": len(records), "ran_twice": len(duplicates(records)),
                "latency": latency_summary(records), "enqueue": how, "wakes_started": wakes,
                "wake_errors": wake_errors, "producer_max_lag_s": lag, "settle": settled,
                "log": {"lines": log.lines, **log.counts},
                "gb_s_per_1000_jobs": gb_s / jobs * 1000 if jobs else None,
                "last_completed_s": done["last_completed"] - t0}

    def _latency_pgqueuer(self, rate: float, run: int) -> dict[str, Any]:
        from harness.systems import PgQueuerSystem

        args = self.args
        system = PgQueuerSystem()
        dbname = run_database(f"leaseq_bench_elastic_latency_pgq_{rate:g}_r{run}".replace(
            ".", "_"))
        records_dir = Path(tempfile.mkdtemp(prefix="leaseq-bench-records-"))
        try:
            with self.server.database(dbname, keep=args.keep_databases) as dsn:
                system.install(dsn)
                env = {"LEASEQ_BENCH_RECORDS": str(records_dir)}
                commands = [*self._pgqueuer_commands(dsn, continuous=True),
                            self._producer("pgqueuer", as_url(dsn), rate, [])]
                with processes(commands, env) as procs:
                    *workers, producer = procs
                    for proc in procs:
                        expect(proc, "ready")
                        if args.nice:
                            meters.renice(proc.pid, args.nice)
                    settled = self._settle()
                    sampler = ConnectionSampler(args.dsn, dbname, nice=args.nice).start()
                    for proc in workers:
                        send(proc, "go")
                    send(producer, "go")
                    words = expect(producer, "done")
                    jobs, lag = int(words[1]), float(words[4])
                    send(producer, "quit")
                    self._wait_records(records_dir, jobs, timeout=120)
                    for proc in workers:
                        send(proc, "stop")
                    ran = sum(int(expect(proc, "done")[1]) for proc in workers)
                    connections = sampler.stop()
                    for proc in workers:
                        send(proc, "quit")
                    for proc in procs:
                        proc.wait(timeout=60)
                if ran != jobs:
                    raise RuntimeError(f"PgQueuer ran {ran} of {jobs} jobs")
            records = read_records(records_dir)
        finally:
            self._drop_records(records_dir)
        return {"rate": rate, "duration_s": args.duration, "jobs": jobs, "ran": len(records),
                "ran_twice": len(duplicates(records)), "latency": latency_summary(records),
                "enqueue": "Queries.enqueue, one job per call", "producer_max_lag_s": lag,
                "settle": settled,
                "connections": {**connections, "system_peak": connections["peak"],
                                "budget": args.max_workers,
                                "budget_of": "worker processes, one connection each"}}

    # Idle ------------------------------------------------------------------------------

    def idle(self, line: str, run: int) -> dict[str, Any]:
        args = self.args
        dbname = run_database(f"leaseq_bench_elastic_idle_{line}_r{run}")
        records_dir = Path(tempfile.mkdtemp(prefix="leaseq-bench-records-"))
        log = self._log(f"idle-{line}-r{run}")
        try:
            with self.server.database(dbname, keep=args.keep_databases) as dsn:
                self._install_leaseq(dsn)
                statements = self._statements_available()
                stack = Stack(dsn, self._mode(line), records=records_dir,
                              handler_ms=args.handler_ms, log=log, overrides=args.overrides)
                try:
                    period = max([s.period_seconds or 0 for s in stack.spec(WORKER).schedules]
                                 or [60.0])
                    sampler = ConnectionSampler(args.dsn, dbname, nice=args.nice).start()
                    before = self._settled_queries(dbname, statements)
                    t0 = stack.start()
                    window = args.idle_minutes * period
                    time.sleep(max(0.0, t0 + window - 0.5 - time.time()))
                    stack.stop_schedules()  # exactly idle_minutes ticks of each schedule
                    idle = stack.wait_idle(timeout=period + 60)
                    elapsed = time.time() - t0
                    # Backends report their counters when they go idle (at most every
                    # second in PostgreSQL 15): give the last ones time to arrive.
                    time.sleep(2.0)
                    after = self._queries(dbname, statements)
                    stats = stack.stats()
                    connections = sampler.stop()
                finally:
                    stack.close()
        finally:
            log.close()
            self._drop_records(records_dir)
        lam = self._lambda_figures(stats)
        ticks = args.idle_minutes
        per_hour = 3600 / (ticks * period)
        queries = after["count"] - before["count"]
        return {"ticks": ticks, "period_s": period, "elapsed_s": elapsed, "idle_after": idle,
                "lambda": lam,
                "gb_s_per_hour": sum(f["gb_seconds"] for f in lam.values()) * per_hour,
                "worker_gb_s_per_hour": lam.get(WORKER, {}).get("gb_seconds", 0) * per_hour,
                "invocations_per_hour": sum(f["invocations"] for f in lam.values()) * per_hour,
                "queries": queries, "queries_per_hour": queries * per_hour,
                "queries_counted_by": after["method"], "log": {"lines": log.lines, **log.counts},
                "connections": {**connections,
                                "system_peak": connections["peak"]}}

    def _statements_available(self) -> bool:
        with connect(self.args.dsn) as conn:
            row = conn.execute("select count(*) as n from pg_extension"
                               " where extname = 'pg_stat_statements'").fetchone()
            loaded = conn.execute("select current_setting('shared_preload_libraries') as s"
                                  ).fetchone()
        return bool(row and row["n"]) and bool(loaded and "pg_stat_statements" in loaded["s"])

    def _settled_queries(self, dbname: str, statements: bool) -> dict[str, Any]:
        """The count once it has stopped moving: the migrations' backend reports its
        transactions when it exits, which may be after the next read."""
        last = self._queries(dbname, statements)
        for _ in range(30):
            time.sleep(1.0)
            now = self._queries(dbname, statements)
            if now["count"] == last["count"]:
                return now
            last = now
        return last

    def _queries(self, dbname: str, statements: bool) -> dict[str, Any]:
        """Statements run in ``dbname`` so far, read from the admin database."""
        with connect(self.args.dsn) as conn:
            if statements:
                row = conn.execute(
                    "select coalesce(sum(calls), 0)::bigint as n from pg_stat_statements s"
                    " join pg_database d on d.oid = s.dbid where d.datname = %s",
                    (dbname,)).fetchone()
                return {"count": int(row["n"]) if row else 0, "method": "pg_stat_statements"}
            row = conn.execute("select xact_commit + xact_rollback as n from pg_stat_database"
                               " where datname = %s", (dbname,)).fetchone()
            return {"count": int(row["n"]) if row else 0,
                    "method": "pg_stat_database xact_commit + xact_rollback delta "
                              "(pg_stat_statements not loaded): transactions, each "
                              "autocommit statement one"}


def _facts(server: Server, dsn: str) -> dict[str, Any]:
    facts = server.facts()
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with connect(dsn) as conn:
        row = conn.execute("select host(inet_server_addr()) as host,"
                           " inet_server_port() as port").fetchone()
    facts["cpu_model"] = model
    facts["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                / 2**30, 1)
    facts["address"] = f"{row['host']}:{row['port']}" if row else "?"
    facts["load_average"] = os.getloadavg()
    return facts


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.report is not None:
        saved = json.loads(args.report.read_text(encoding="utf-8"))
        print(elastic_report.render(saved))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    revision = source.revision()
    source.freeze(stack=True)
    if args.nice:
        meters.renice(os.getpid(), args.nice)
    from harness.systems import pin_migrations

    migrations = pin_migrations()
    out = args.out or BENCH_DIR / "results" / (
        "elastic-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    bench = Elastic(args, out)
    facts = _facts(bench.server, args.dsn)
    started = time.time()
    print(f"server: {facts['version'].split(',')[0]} at {facts['address']} (--dsn), a fresh "
          f"database per run; {facts['cpus']} CPUs ({facts['cpu_model']}), "
          f"{facts['memory_gib']} GiB")
    print(f"source {revision}; fan-out in this checkout: "
          f"{'yes' if bench.fanout_available else 'NO (fan-out lines run scheduled-only)'}")
    print(f"MaxWorkers {args.max_workers} x concurrency {args.concurrency} = {bench.target} "
          f"jobs at once; handler waits {args.handler_ms:g} ms; {args.repeat} runs per line",
          flush=True)
    setup = {"args": {k: v for k, v in vars(args).items()
                      if k not in ("report", "out") and not callable(v)},
             "server": facts, "source": revision, "fanout_available": bench.fanout_available,
             "leaseq_migrations": migrations, "target_concurrency": bench.target}
    results: dict[str, Any] = {"setup": setup, "backlog": {}, "latency": {}, "idle": {}}

    def save(partial: bool) -> None:
        results["started"] = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
        results["duration_s"] = time.time() - started
        results["partial"] = partial
        out.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")

    lines = args.line_list
    for run in range(args.repeat):
        if "backlog" in args.scenario_list:
            for line in [x for x in BACKLOG_LINES if x in lines]:
                result = bench.backlog(line, run)
                results["backlog"].setdefault(line, []).append(result)
                print(f"  run {run + 1} backlog {line:<11} drain {result['drain_s']:.2f} s "
                      f"(ideal {result['ideal_s']:.2f}, efficiency "
                      f"{result['efficiency']:.0%}); full concurrency "
                      f"{elastic_report.seconds(result['full_concurrency_s'])}, peak "
                      f"{result['peak_concurrency']}; connections "
                      f"{result['connections']['system_peak']} of "
                      f"{result['connections']['budget']}", flush=True)
                save(partial=True)
        if "latency" in args.scenario_list:
            for rate in args.rate_list:
                for line in [x for x in LATENCY_LINES if x in lines]:
                    result = bench.latency(line, rate, run)
                    results["latency"].setdefault(f"{line}@{rate:g}", []).append(result)
                    lat = result["latency"]
                    print(f"  run {run + 1} latency {line:<10} {rate:>5g}/s  {result['jobs']} "
                          f"jobs  p50 {elastic_report.seconds(lat.get('p50'))}  p95 "
                          f"{elastic_report.seconds(lat.get('p95'))}  p99 "
                          f"{elastic_report.seconds(lat.get('p99'))}; connections "
                          f"{result['connections']['system_peak']} of "
                          f"{result['connections']['budget']}", flush=True)
                    save(partial=True)
    if "idle" in args.scenario_list:
        for line in IDLE_LINES:
            if line not in lines:
                continue
            result = bench.idle(line, 0)
            results["idle"][line] = result
            print(f"  idle {line:<10} {result['gb_s_per_hour']:.1f} GB-s/h, "
                  f"{result['queries_per_hour']:.0f} queries/h "
                  f"({result['invocations_per_hour']:.0f} invocations/h)", flush=True)
            save(partial=True)
    save(partial=False)
    print()
    print(elastic_report.render(results))
    print(f"\nresults: {out}")
    return 0

