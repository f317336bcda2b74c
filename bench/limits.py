#!/usr/bin/env python3
"""What limits (functions/admission.sql) cost the work they do not hold back.

``python3 bench/limits.py --dsn SUPERUSER_DSN [--held 100000] [--rounds 5]`` (in the
project's environment: ``source scripts/bootstrap`` first). Two databases, migrated with
this checkout's ``sql/``, one connection each as the superuser calling the SQL functions:

* ``none``: 20 tenants with 500 ready jobs of an unlimited kind each, no limit at all;
* ``held``: the same, plus ``--held`` jobs of a kind limited to 2 at once (spread over
  the same 20 tenants and enqueued first, so they are older than the unlimited work), of
  which 2 are admitted and claimed and the rest held;
* ``future``: the same table size without limits: ``--held`` jobs of another kind due
  300 days from now, so what ``held`` costs beyond a table that large shows apart.

Measured in each, rounds alternating between the two so that a shared machine's load falls
on both alike, medians printed:

* ``claim``: one ``app.claim_ready_jobs(owner, 10)`` rolled back (the queue stays as it
  is): what a worker's claim of other work costs with the backlog held or not, in time
  and in shared buffers touched (EXPLAIN ANALYZE BUFFERS: what it reads, which a shared
  machine's load does not change);
* ``drain``: 2,000 unlimited jobs enqueued (100 per call) then drained with
  ``app.finish_and_claim_jobs`` in batches of 10: jobs per second of unlimited kinds;
* ``enqueue``: the enqueue part of that, microseconds per unlimited job (the limits hook
  looks the kind up once a limit exists anywhere).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layer"))

from leaseq.store.migrate import migrate

Conn = psycopg.Connection[dict[str, Any]]
TENANTS = [uuid.UUID(int=i + 1) for i in range(20)]
ENQUEUE = ("select count(*) as n from app.enqueue_jobs(%s::uuid[], %s::text[], %s::text[],"
           " %s::jsonb[])")
FINISH_AND_CLAIM = (
    "select claimed, id, tenant_id, lease_token from app.finish_and_claim_jobs('bench',"
    " %s::uuid[], %s::uuid[], %s::uuid[], %s::text[], %s::jsonb[], %s::interval[], 10,"
    " '5 minutes'::interval)")


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


def enqueue(conn: Conn, kind: str, count: int, prefix: str) -> None:
    for start in range(0, count, 1000):
        n = min(1000, count - start)
        conn.execute(ENQUEUE, ([TENANTS[(start + i) % len(TENANTS)] for i in range(n)],
                               [f"{prefix}-{start + i}" for i in range(n)], [kind] * n,
                               [Jsonb({"i": start + i}) for i in range(n)]))


def build(admin_dsn: str, case: str, held: int) -> tuple[str, Conn]:
    name = f"leaseq_bench_limits_{case}_{uuid.uuid4().hex[:6]}"
    with connect(admin_dsn) as admin:
        admin.execute(f'create database "{name}"')
    conn = connect(make_conninfo(admin_dsn, dbname=name))
    migrate(conn)
    if case == "held":
        conn.execute("select app.set_limit('bench', 'kind', 'report', null, null, 2)")
        enqueue(conn, "report", held, "report")
        conn.execute("select count(*) from app.claim_ready_jobs('holder', 10, '1 day')")
    if case == "future":
        for start in range(0, held, 1000):
            n = min(1000, held - start)
            conn.execute(
                "select count(*) from app.enqueue_jobs(%s::uuid[], %s::text[], %s::text[],"
                " %s::jsonb[], %s::timestamptz[])",
                ([TENANTS[(start + i) % len(TENANTS)] for i in range(n)],
                 [f"future-{start + i}" for i in range(n)], ["report"] * n,
                 [Jsonb({"i": start + i}) for i in range(n)],
                 [None] * n))
        conn.execute("update app.jobs set available_at = now() + interval '300 days'"
                     " where kind = 'report'")
    enqueue(conn, "email", 500 * len(TENANTS), "ready")
    # Every table, app.claimable too: holding a job (or moving one's due time) deletes the
    # entry the enqueue made, which autovacuum would clear within seconds of a busy queue.
    conn.execute("vacuum analyze")
    return name, conn


def claim_once(conn: Conn) -> float:
    with conn.transaction(force_rollback=True):
        started = time.perf_counter()
        rows = conn.execute("select id from app.claim_ready_jobs('bench', 10, '1 minute')"
                            ).fetchall()
        elapsed = time.perf_counter() - started
    assert len(rows) == 10, rows
    return elapsed


def claim_buffers(conn: Conn) -> int:
    """Shared buffers one claim touches (hit or read): what it reads, whatever the load."""
    with conn.transaction(force_rollback=True):
        (row,) = conn.execute(
            "explain (analyze, buffers, format json)"
            " select * from app.claim_ready_jobs('bench', 10, '1 minute')").fetchall()
    plan = row["QUERY PLAN"][0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def drain(conn: Conn, round_no: int, count: int = 2000) -> tuple[float, float]:
    """Seconds per enqueued job, jobs drained per second."""
    started = time.perf_counter()
    for start in range(0, count, 100):
        conn.execute(ENQUEUE, ([TENANTS[i % len(TENANTS)] for i in range(100)],
                               [f"drain-{round_no}-{start + i}" for i in range(100)],
                               ["email"] * 100, [Jsonb({"i": i}) for i in range(100)]))
    enqueued = (time.perf_counter() - started) / count
    done = 0
    outcome: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    started = time.perf_counter()
    while done < count:
        tenants, ids, tokens = outcome
        rows = conn.execute(FINISH_AND_CLAIM, (
            tenants, ids, tokens, ["succeeded"] * len(ids), [Jsonb({})] * len(ids),
            [None] * len(ids))).fetchall()
        claimed = [r for r in rows if r["claimed"]]
        done += len(ids)
        if not claimed and not ids:
            break
        outcome = ([r["tenant_id"] for r in claimed], [r["id"] for r in claimed],
                   [r["lease_token"] for r in claimed])
    seconds = time.perf_counter() - started
    # Put the standing backlog back to its size: enqueue as many ready jobs as drained
    # beyond the 2,000 (the drain takes from the oldest, the standing backlog first).
    conn.execute("delete from app.job_events where job_id in (select id from app.jobs"
                 " where state = 'succeeded')")
    conn.execute("delete from app.jobs where state = 'succeeded'")
    missing = 500 * len(TENANTS) - conn.execute(
        "select count(*) as n from app.jobs where kind = 'email' and state = 'pending'"
    ).fetchone()["n"]  # type: ignore[index]
    if missing > 0:
        enqueue(conn, "email", missing, f"refill-{round_no}")
    return enqueued, done / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a superuser DSN")
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--claims", type=int, default=200, help="claims per round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    made: list[str] = []
    results: dict[str, dict[str, list[float]]] = {}
    try:
        conns = {}
        for case in ("none", "held", "future"):
            started = time.perf_counter()
            name, conns[case] = build(args.dsn, case, args.held)
            made.append(name)
            print(f"built {case} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            results[case] = {"claim_ms": [], "claim_buffers": [], "enqueue_us": [],
                             "drain_jobs_s": []}
        for round_no in range(args.rounds):
            for case, conn in conns.items():
                claims = sorted(claim_once(conn) for _ in range(args.claims))
                results[case]["claim_ms"].append(statistics.median(claims) * 1000)
                results[case]["claim_buffers"].append(
                    statistics.median(claim_buffers(conn) for _ in range(20)))
                enqueued, rate = drain(conn, round_no)
                results[case]["enqueue_us"].append(enqueued * 1e6)
                results[case]["drain_jobs_s"].append(rate)
        held = conns["held"].execute(
            "select count(*) as n from app.held_jobs").fetchone()
        summary = {case: {k: round(statistics.median(v), 3) for k, v in r.items()}
                   for case, r in results.items()}
        summary["held_jobs"] = held  # type: ignore[assignment]
        summary["claim_ratio"] = round(  # type: ignore[assignment]
            summary["held"]["claim_ms"] / summary["none"]["claim_ms"], 3)
        if args.json:
            print(json.dumps(summary, default=str, indent=2))
        else:
            print(f"held jobs: {held['n'] if held else 0}")  # type: ignore[index]
            print(f"{'case':<6} {'claim ms':>9} {'claim buffers':>14} {'enqueue us/job':>15}"
                  f" {'drain jobs/s':>13}")
            for case in ("none", "held", "future"):
                r = summary[case]
                print(f"{case:<6} {r['claim_ms']:>9.3f} {r['claim_buffers']:>14.0f}"
                      f" {r['enqueue_us']:>15.1f} {r['drain_jobs_s']:>13.0f}")
            print(f"claim held/none: {summary['claim_ratio']}")
        for conn in conns.values():
            conn.close()
    finally:
        with connect(args.dsn) as admin:
            for name in made:
                admin.execute(f'drop database if exists "{name}" with (force)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
