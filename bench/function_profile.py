#!/usr/bin/env python3
"""Where a no-op drain's server time goes, function by function.

``python3 bench/function_profile.py --dsn SUPERUSER_DSN [--jobs 10000] [--tenants 10]
[--analyze]`` (in the project's environment: ``source scripts/bootstrap`` first). One
database, migrated with this checkout's ``sql/``; ``--jobs`` no-op jobs enqueued over
``--tenants`` tenants, then drained by one superuser session the way a worker drains
them (``app.claim_ready_jobs``, then ``app.finish_and_claim_jobs`` in batches of 10)
with ``track_functions = 'all'``. Printed: each function's calls per batch and its *self*
time per job, from ``pg_stat_user_functions``.

A function's self time includes the SQL statements it runs (their planning and
execution), not the functions it calls: a statement that scans a table it should probe,
or is planned again on every call, shows as its function's share. The figures are one
session's wall-clock time inside the server, so they carry no client or network time
and no contention between workers; ``bench/run.py`` measures those. Without
``--analyze`` the job table has the statistics its growth left it (none, on a fresh
table, until autovacuum comes by), as a new deployment's does.

PostgreSQL is profiled rather than a hand-written timer around each statement because
its own counters see the statements inside the PL/pgSQL functions, which a client
cannot time one by one.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layer"))

from leaseq.store.migrate import migrate
from leaseq.store.queries import CLAIM_READY_JOBS, ENQUEUE_JOBS, FINISH_AND_CLAIM_JOBS

Conn = psycopg.Connection[dict[str, Any]]
BATCH = 10
OWNER = "profile"
LEASE = timedelta(minutes=5)
PROFILE = """
select f.funcname as function, f.calls, f.self_time, f.total_time
from pg_stat_user_functions f
where f.schemaname = 'app'
order by f.self_time desc
"""


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


def enqueue(conn: Conn, jobs: int, tenants: list[uuid.UUID]) -> None:
    for start in range(0, jobs, 1000):
        n = min(1000, jobs - start)
        conn.execute(ENQUEUE_JOBS, {
            "tenant_ids": [tenants[(start + i) % len(tenants)] for i in range(n)],
            "operation_keys": [f"profile-{start + i}" for i in range(n)],
            "kinds": ["noop"] * n, "payloads": [Jsonb({"i": start + i}) for i in range(n)],
            "available_ats": None, "max_attempts": None, "correlation_ids": None,
            "priorities": None, "queues": None, "limit_keys": None})


def drain(conn: Conn) -> tuple[int, int, float]:
    """Jobs finished, batches, seconds: claim, then finish each batch and claim the next
    in one call, with the library's own statements (leaseq.store.queries), every kind and
    every queue, as a worker with the default settings does."""
    claim = {"owner": OWNER, "limit": BATCH, "lease": LEASE, "kinds": None,
             "exclude_kinds": None, "queue": None}
    started = time.perf_counter()
    rows = conn.execute(CLAIM_READY_JOBS, claim).fetchall()
    done = batches = 0
    while rows:
        n = len(rows)
        claimed = conn.execute(FINISH_AND_CLAIM_JOBS, {
            **claim, "tenant_ids": [r["tenant_id"] for r in rows],
            "job_ids": [r["id"] for r in rows], "tokens": [r["lease_token"] for r in rows],
            "outcomes": ["succeeded"] * n, "details": [Jsonb(None)] * n,
            "retry_delays": [None] * n}).fetchall()
        done += n
        batches += 1
        rows = [r for r in claimed if r["claimed"]]
    return done, batches, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="superuser DSN; a database is created and dropped there")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--analyze", action="store_true",
                        help="ANALYZE the tables after the enqueue")
    args = parser.parse_args()
    if args.jobs < BATCH or args.tenants < 1:
        parser.error(f"--jobs must be at least {BATCH} and --tenants at least 1")

    name = f"leaseq_bench_profile_{uuid.uuid4().hex[:6]}"
    with connect(args.dsn) as admin:
        admin.execute(f'create database "{name}"')
    dsn = make_conninfo(args.dsn, dbname=name)
    try:
        with connect(dsn) as conn:
            migrate(conn)
            enqueue(conn, args.jobs, [uuid.UUID(int=i + 1) for i in range(args.tenants)])
            if args.analyze:
                conn.execute("analyze")
            conn.execute("select pg_stat_reset()")
        # A session flushes its function counters when it ends: drain in one, read in
        # the next.
        with connect(dsn) as conn:
            conn.execute("set track_functions = 'all'")
            done, batches, seconds = drain(conn)
        with connect(dsn) as conn:
            rows = conn.execute(PROFILE).fetchall()
            server = conn.info.parameter_status("server_version")
    finally:
        with connect(args.dsn) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')

    total = sum(r["self_time"] for r in rows)
    print(f"{done:,} jobs in {batches:,} batches of up to {BATCH}, {args.tenants} tenants,"
          f" one session; PostgreSQL {server}; statistics"
          f" {'analysed' if args.analyze else 'as the growth left them'}")
    print(f"{done / seconds:,.0f} jobs/s; functions' time {total * 1000 / done:.1f} µs a job\n")
    print("| function | calls a batch | self µs a job | share |")
    print("|---|--:|--:|--:|")
    for r in rows:
        if r["self_time"] * 1000 / done < 0.05:
            continue
        print(f"| `app.{r['function']}` | {r['calls'] / batches:.2f}"
              f" | {r['self_time'] * 1000 / done:.1f} | {r['self_time'] / total:.0%} |")


if __name__ == "__main__":
    main()
