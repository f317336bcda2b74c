"""The secondary measurements: claim latency against table size, and import time.

(Round trips, WAL, CPU and peak memory are read by the drains themselves.)
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import source
from harness.meters import renice
from harness.pg import Server, as_url, connect, run_database
from harness.systems import SYSTEMS, leaseq_enqueue, leaseq_install, tenant_ids

# Finished jobs are written in one set-based statement (no functions, no events): the
# claim never reads them, so what matters is that they sit in the same table and its
# full indexes, as the history of a queue that ran for a while does.
_FILL_FINISHED = """
insert into app.jobs (tenant_id, operation_key, kind, payload, state, attempts,
                      available_at, result, created_at, updated_at, completed_at)
select (%(tenants)s::uuid[])[1 + g %% cardinality(%(tenants)s::uuid[])],
       'finished-' || g, 'noop', jsonb_build_object('n', g), 'succeeded', 1,
       now() - interval '1 day', 'null'::jsonb,
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
from generate_series(1, %(count)s) g
"""


#: The two databases of a claim-latency comparison: only the ready jobs the samples
#: take, and the same beside a long history and a ready backlog.
LABELS = ("empty", "finished")


def _quantiles(timings: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(timings, n=100)
    return {"median_ms": statistics.median(timings), "p95_ms": cuts[94], "p99_ms": cuts[98],
            "min_ms": min(timings)}


def _interleaved(rounds: int, claim: dict[str, Any]) -> dict[str, list[float]]:
    """Call each database's ``claim()`` once a round, the order swapped every round, so
    that a slow spell of a shared machine falls on both alike. ``claim`` returns the
    milliseconds its claim took."""
    timings: dict[str, list[float]] = {label: [] for label in claim}
    order = list(claim)
    for i in range(rounds):
        for label in (order if i % 2 == 0 else order[::-1]):
            timings[label].append(claim[label]())
    return timings


def _result(out: dict[str, Any], timings: dict[str, list[float]], warmup: int,
            facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    for label in LABELS:
        out[label] = {**_quantiles(timings[label][warmup:]), **facts[label]}
    out["ratio"] = out["finished"]["median_ms"] / out["empty"]["median_ms"]
    out["p95_ratio"] = out["finished"]["p95_ms"] / out["empty"]["p95_ms"]
    return out


def claim_latency(server: Server, *, finished: int, tenants: int, ready_backlog: int = 0,
                  samples: int = 300, warmup: int = 30, keep: bool = False,
                  nice: int = 0) -> dict[str, Any]:
    """Claim latency (batch 10, one worker) with ``finished`` old jobs and a backlog of
    ``ready_backlog`` ready jobs in the tables, against a database holding only the
    ready jobs the samples take; the two sampled in alternation."""
    from leaseq import QueueClient
    from leaseq import connect as leaseq_connect
    from leaseq.base.jobs import JobOutcome

    needed = (samples + warmup) * 10 * 2
    sizes = {"empty": (0, needed), "finished": (finished, max(ready_backlog, needed))}
    out: dict[str, Any] = {"finished_rows": finished, "ready_rows": needed,
                           "ready_backlog": sizes["finished"][1], "samples": samples,
                           "batch": 10, "interleaved": True}
    facts: dict[str, dict[str, Any]] = {}
    lease = timedelta(seconds=30)
    with ExitStack() as stack:
        claim: dict[str, Any] = {}
        for label in LABELS:
            count, ready = sizes[label]
            dsn = stack.enter_context(server.database(
                run_database(f"leaseq_bench_latency_{label}"), keep=keep))
            leaseq_install(dsn)
            t0 = time.perf_counter()
            if count:
                with connect(dsn) as conn:
                    conn.execute(_FILL_FINISHED, {"tenants": tenant_ids(tenants), "count": count})
            leaseq_enqueue(dsn, ready, tenants)
            with connect(dsn) as conn:
                conn.execute("vacuum (analyze) app.jobs")
                conn.execute("vacuum (analyze) app.job_events")
                size = conn.execute(
                    "select pg_total_relation_size('app.jobs') as b").fetchone()
            facts[label] = {"ready_rows": ready, "fill_seconds": time.perf_counter() - t0,
                            "jobs_table_bytes": int(size["b"]) if size else None}
            client = QueueClient(
                lambda dsn=dsn: leaseq_connect(dsn, application_name="bench-latency"))
            client.check()
            stack.callback(client.close)
            if nice:
                backend = client.connection.execute(
                    "select pg_backend_pid() as pid").fetchone()
                if backend is not None:
                    renice(int(backend["pid"]), nice)

            def one(client: Any = client) -> float:
                t0 = time.perf_counter()
                jobs = client.claim_ready_jobs("bench-latency", 10, lease)
                elapsed = (time.perf_counter() - t0) * 1000
                if not jobs:
                    raise RuntimeError("a latency database ran out of ready jobs")
                client.finish_jobs("bench-latency", [JobOutcome(j, "succeeded") for j in jobs])
                return elapsed

            claim[label] = one
        timings = _interleaved(warmup + samples, claim)
    return _result(out, timings, warmup, facts)


# PgQueuer deletes a job when it finishes and keeps its log row: its history is
# pgqueuer_log, so that is where the finished jobs go (set-based, as above).
_PGQ_FILL_FINISHED = """
insert into pgqueuer_log (created, job_id, status, priority, entrypoint, aggregated)
select now() - interval '1 day', g, 'successful', 0, 'noop', true
from generate_series(1, %(count)s) g
"""


def pgqueuer_claim_latency(server: Server, *, finished: int, ready_backlog: int = 0,
                           samples: int = 300, warmup: int = 30, keep: bool = False,
                           nice: int = 0) -> dict[str, Any]:
    """The same comparison for PgQueuer: its own ``Queries.dequeue`` (batch 10, the
    statement its QueueManager runs), each batch then logged as done with ``log_jobs``."""
    needed = (samples + warmup) * 10 * 2
    sizes = {"empty": (0, needed), "finished": (finished, max(ready_backlog, needed))}
    out: dict[str, Any] = {"finished_rows": finished, "ready_rows": needed,
                           "ready_backlog": sizes["finished"][1], "samples": samples,
                           "batch": 10, "interleaved": True}
    facts: dict[str, dict[str, Any]] = {}
    pgq = SYSTEMS["pgqueuer"]
    with ExitStack() as stack:
        dsns = {}
        for label in LABELS:
            count, ready = sizes[label]
            dsn = stack.enter_context(server.database(
                run_database(f"pgqueuer_bench_latency_{label}"), keep=keep))
            pgq.install(dsn)
            t0 = time.perf_counter()
            if count:
                with connect(dsn) as conn:
                    conn.execute(_PGQ_FILL_FINISHED, {"count": count})
            pgq.enqueue(dsn, ready, 1, 0)
            with connect(dsn) as conn:
                conn.execute("vacuum (analyze) pgqueuer")
                conn.execute("vacuum (analyze) pgqueuer_log")
            facts[label] = {"ready_rows": ready, "fill_seconds": time.perf_counter() - t0}
            dsns[label] = dsn
        timings = asyncio.run(_pgqueuer_claims(dsns, warmup + samples, nice))
    return _result(out, timings, warmup, facts)


async def _pgqueuer_claims(dsns: dict[str, str], rounds: int,
                           nice: int) -> dict[str, list[float]]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries
    from pgqueuer.queries import EntrypointExecutionParameter

    entrypoints = {"noop": EntrypointExecutionParameter(concurrency_limit=0)}
    manager = uuid.uuid4()
    conns = {label: await asyncpg.connect(
        as_url(dsn), server_settings={"application_name": "bench-latency"})
        for label, dsn in dsns.items()}
    try:
        queries = {label: Queries(AsyncpgDriver(conn)) for label, conn in conns.items()}
        if nice:
            for conn in conns.values():
                renice(int(await conn.fetchval("select pg_backend_pid()")), nice)
        timings: dict[str, list[float]] = {label: [] for label in dsns}
        order = list(dsns)
        for i in range(rounds):
            for label in (order if i % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                jobs = await queries[label].dequeue(
                    batch_size=10, entrypoints=entrypoints, queue_manager_id=manager,
                    global_concurrency_limit=None, heartbeat_timeout=timedelta(seconds=30))
                elapsed = (time.perf_counter() - t0) * 1000
                if not jobs:
                    raise RuntimeError("a PgQueuer latency database ran out of ready jobs")
                await queries[label].log_jobs([(job, "successful", None) for job in jobs])
                timings[label].append(elapsed)
        return timings
    finally:
        for conn in conns.values():
            await conn.close()


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")
#: One cold import, timed inside the interpreter (its own start-up excluded): wall and CPU.
_TIMED_IMPORT = ("import time; t = time.perf_counter(); c = time.process_time(); import app; "
                 "print(time.perf_counter() - t, time.process_time() - c)")


def _handler_env(function_dir: Path, layer_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(function_dir), str(layer_dir)])
    # What the deployed function has in its environment; nothing is contacted at import.
    env.setdefault("DATABASE_URL", "postgresql://bench@127.0.0.1:9/none")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env.setdefault("POWERTOOLS_SERVICE_NAME", "leaseq-worker")
    env.setdefault("POWERTOOLS_METRICS_NAMESPACE", "leaseq")
    # Every run reads the bytecode compiled below and writes none: each measures the same
    # thing, whatever the machine's PYTHONDONTWRITEBYTECODE says.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def import_time(repeats: int = 7, *, function_dir: Path | None = None,
                layer_dir: Path | None = None, python: str = sys.executable,
                profiles: int = 3) -> dict[str, Any]:
    """Wall and CPU time of ``import app`` for the worker function, in fresh interpreters.

    The interpreter's own start-up is excluded (Lambda pays it whatever the code). The
    project's modules are compiled to bytecode first, as the Lambda layer ships them
    (layer/Makefile), so no run compiles them; the installed packages have theirs. Where
    the time goes comes from ``-X importtime``, self time summed per top-level package,
    the median of ``profiles`` runs. Defaults: the worker function and layer/ of the
    frozen copy (or of the checkout).
    """
    function_dir = function_dir or source.worker_function_dir()
    layer_dir = layer_dir or source.layer_dir()
    if not (function_dir / "app.py").exists():
        return {"error": "functions/worker/app.py does not exist"}
    subprocess.run([python, "-m", "compileall", "-q", str(function_dir),
                    *(str(p) for p in layer_dir.iterdir() if (p / "__init__.py").exists())],
                   capture_output=True, check=True)
    env = _handler_env(function_dir, layer_dir)
    walls, cpus = [], []
    for _ in range(repeats):
        proc = subprocess.run([python, "-c", _TIMED_IMPORT], capture_output=True, text=True,
                              env=env, cwd=function_dir, check=False)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip().splitlines()[-1:] or ["import failed"]}
        wall, cpu = (float(x) * 1000 for x in proc.stdout.split()[-2:])
        walls.append(wall)
        cpus.append(cpu)
    by_run: list[dict[str, float]] = []
    for _ in range(profiles):
        proc = subprocess.run([python, "-X", "importtime", "-c", "import app"],
                              capture_output=True, text=True, env=env, cwd=function_dir,
                              check=False)
        totals: dict[str, float] = {}
        for line in proc.stderr.splitlines():
            match = _IMPORT_LINE.match(line)
            if match:
                package = match.group(4).split(".")[0]
                totals[package] = totals.get(package, 0.0) + int(match.group(1)) / 1000
        by_run.append(totals)
    packages = {name for run in by_run for name in run}
    by_package = {name: statistics.median(run.get(name, 0.0) for run in by_run)
                  for name in packages}
    top = [{"package": name, "self_ms": ms}
           for name, ms in sorted(by_package.items(), key=lambda kv: -kv[1])]
    return {
        "median_ms": statistics.median(walls),
        "min_ms": min(walls),
        "max_ms": max(walls),
        "cpu_median_ms": statistics.median(cpus),
        "repeats": repeats,
        # Self time summed per top-level package (median of the profiled runs).
        "by_package": top[:12],
    }
