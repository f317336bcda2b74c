#!/usr/bin/env python3
"""What the schedules' tick (migration 0019) costs: time per schedule and per slot.

``python3 bench/schedules.py --dsn SUPERUSER_DSN [--schedules 1000] [--rounds 5]`` (in the
project's environment: ``source scripts/bootstrap`` first). One database of its own,
migrated with this checkout's ``sql/``, all calls as the superuser over one connection:

* ``due``: ``--schedules`` schedules (``* * * * *``, Europe/Berlin), each with one due
  slot, ticked in pages of 100 (``app.tick_schedules(100)``) until none is left: the
  reaper's usual minute, one job per schedule;
* ``idle``: the same schedules, none due: one tick call, which only reads the due index;
* ``catch-up``: 20 schedules of 50 missed slots each (filled): 1,000 slots, one job each;
* ``list``: ``app.list_schedules(null, 3)`` over the ``--schedules`` schedules (the page
  of ``leaseq schedules list`` and the dashboard);
* ``sparse``: the next slot of ``0 0 29 2 *`` (a leap day) from a day after one, the
  longest search a valid cron expression can need (up to eight years of days).

Each step is repeated ``--rounds`` times (the jobs deleted in between); the medians are
printed, and the whole run as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layer"))

from leaseq.store.migrate import load_functions, load_migrations, migrate

Conn = psycopg.Connection[dict[str, Any]]
SQL = Path(__file__).resolve().parents[1] / "sql"


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = step()
    return time.perf_counter() - start, result


def tick_all(conn: Conn) -> int:
    ticked = 0
    while rows := conn.execute("select * from app.tick_schedules(100)").fetchall():
        ticked += sum(r["enqueued"] for r in rows)
        if len(rows) < 100:
            break
    return ticked


def run(dsn: str, schedules: int, rounds: int) -> dict[str, Any]:
    results: dict[str, list[float]] = {"due": [], "idle": [], "catch-up": [], "list": [],
                                       "sparse": []}
    with connect(dsn) as conn:
        version = conn.execute("show server_version").fetchone()
        tenant = uuid.uuid4()
        for i in range(schedules):
            conn.execute("select * from app.put_schedule(%s, %s, 'bench', '* * * * *',"
                         " 'Europe/Berlin')", (tenant, f"s{i}"))
        hour = conn.execute("select extract(hour from now() - interval '3 hours')::int as h"
                            ).fetchone()
        assert hour is not None
        catch_up = uuid.uuid4()
        for i in range(20):
            conn.execute("select * from app.put_schedule(%s, %s, 'bench', %s, 'UTC', '{}', 50)",
                         (catch_up, f"c{i}", f"0-49 {hour['h']} * * *"))
        for _ in range(rounds):
            conn.execute("truncate app.jobs, app.job_events, app.claimable, app.leases,"
                         " app.tenant_turns, app.kind_turns")
            conn.execute("update app.schedules set next_slot = date_trunc('minute', now())"
                         " where tenant_id = %s", (tenant,))
            conn.execute("update app.schedules set next_slot = 'infinity'"
                         " where tenant_id = %s", (catch_up,))
            seconds, made = timed(lambda: tick_all(conn))
            assert made >= schedules, made
            results["due"].append(seconds / made)
            seconds, _ = timed(lambda: conn.execute(
                "select * from app.tick_schedules(100)").fetchall())
            results["idle"].append(seconds)
            conn.execute("update app.schedules set next_slot = 'infinity'"
                         " where tenant_id = %s", (tenant,))
            conn.execute("update app.schedules set next_slot = date_trunc('hour', now()"
                         " - interval '3 hours') where tenant_id = %s", (catch_up,))
            seconds, made = timed(lambda: tick_all(conn))
            assert made == 1000, made
            results["catch-up"].append(seconds / made)
            conn.execute("update app.schedules set next_slot = app.next_schedule_slot("
                         "expression, time_zone, now())")
            seconds, rows = timed(lambda: conn.execute(
                "select * from app.list_schedules(null, 3)").fetchall())
            assert len(rows) == schedules + 20
            results["list"].append(seconds)
            seconds, _ = timed(lambda: conn.execute(
                "select app.next_schedule_slot('0 0 29 2 *', 'UTC', '2096-03-01')").fetchone())
            results["sparse"].append(seconds)
    assert version is not None
    return {"server_version": version["server_version"], "schedules": schedules,
            "rounds": rounds, "runs": results,
            "medians": {k: statistics.median(v) for k, v in results.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    name = f"leaseq_bench_schedules_{uuid.uuid4().hex[:8]}"
    with connect(args.dsn) as admin:
        admin.execute(f'create database "{name}"')
    try:
        dsn = make_conninfo(args.dsn, dbname=name)
        with connect(dsn) as conn:
            migrate(conn, load_migrations(SQL / "migrations"), load_functions(SQL / "functions"))
        report = run(dsn, args.schedules, args.rounds)
    finally:
        with connect(args.dsn) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    m = report["medians"]
    print(f"PostgreSQL {report['server_version']}, {args.schedules} schedules, "
          f"medians of {args.rounds} rounds")
    print(f"  due       {m['due'] * 1e6:8.0f} us per schedule ticked (one slot, one job)")
    print(f"  idle      {m['idle'] * 1e3:8.2f} ms per tick call with nothing due")
    print(f"  catch-up  {m['catch-up'] * 1e6:8.0f} us per slot (20 schedules x 50 slots)")
    print(f"  list      {m['list'] * 1e3:8.1f} ms for app.list_schedules (next 3 slots each)")
    print(f"  sparse    {m['sparse'] * 1e3:8.1f} ms for the next leap-day slot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
