#!/usr/bin/env python3
"""What the claims' kind filter (migration 0015) costs: WAL and time per job.

``python3 bench/claim_kinds.py --dsn SUPERUSER_DSN [--baseline-sql DIR]`` (in the
project's environment: ``source scripts/bootstrap`` first). The server needs
``pg_walinspect`` (PostgreSQL 15+, as the Debian and RDS builds ship it); the embedded
one lacks it.

Each case runs in a database of its own, migrated with this checkout's ``sql/`` (and,
with ``--baseline-sql``, once more with another checkout's, such as the commit before
0015), all as the superuser calling the SQL functions directly, one connection:

* ``dense``: 10 tenants x 400 jobs of two kinds, enqueued 100 per call, then drained
  without a filter (``app.finish_and_claim_jobs``, batches of 10);
* ``sparse``: 1,000 tenants with one job each (every claim leaves tenants idle);
* with this checkout only, the same two queues drained by a main worker
  (``p_exclude_kinds``) and a slow one (``p_kinds``).

Then ``--claims`` rounds of one claim of 10 in each of three databases of this checkout
(10 tenants x 4,000 jobs of two kinds, vacuumed and analysed) in turn: without a filter,
with ``p_exclude_kinds`` and with ``p_kinds`` (and without a filter on the baseline):
the median claim time of each, the claims' own cost apart from the drain's round trips.

Reported per step: microseconds per job and the WAL bytes per job of the database's own
records (pg_walinspect over the step's LSN range, full-page images apart), by relation in
the JSON. A temporary physical replication slot keeps the range's WAL until it is read
(other clients' checkpoints would recycle it). ``--rounds`` alternates the versions, so
that a shared machine's load falls on both alike; the medians are printed.
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
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layer"))

from harness import meters
from leaseq.store.migrate import load_functions, load_migrations, migrate

Conn = psycopg.Connection[dict[str, Any]]
HERE = Path(__file__).resolve().parents[1] / "sql"
FINISH_AND_CLAIM = (
    "select claimed, id, tenant_id, lease_token from app.finish_and_claim_jobs(%s,"
    " %s::uuid[], %s::uuid[], %s::uuid[], %s::text[], %s::jsonb[], %s::interval[], %s,"
    " '5 minutes'::interval"
)


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


def fresh_database(admin_dsn: str, sql_dir: Path) -> tuple[str, str]:
    name = f"leaseq_bench_kinds_{uuid.uuid4().hex[:8]}"
    with connect(admin_dsn) as admin:
        admin.execute(f'create database "{name}"')
    dsn = make_conninfo(admin_dsn, dbname=name)
    with connect(dsn) as conn:
        migrate(conn, load_migrations(sql_dir / "migrations"),
                load_functions(sql_dir / "functions"))
        conn.execute("create extension if not exists pg_walinspect")
    return name, dsn


def drop_database(admin_dsn: str, name: str) -> None:
    with connect(admin_dsn) as admin:
        admin.execute(f'drop database "{name}" with (force)')


def enqueue(conn: Conn, tenants: list[uuid.UUID], per_tenant: int, kinds: list[str]) -> int:
    items = [(t, f"k-{i}", kinds[i % len(kinds)]) for i in range(per_tenant) for t in tenants]
    for start in range(0, len(items), 100):
        chunk = items[start:start + 100]
        conn.execute("select 1 from app.enqueue_jobs(%s, %s, %s, %s)",
                     ([t for t, _, _ in chunk], [k for _, k, _ in chunk],
                      [kind for _, _, kind in chunk], [Jsonb({}) for _ in chunk]))
    return len(items)


def drain(conn: Conn, owner: str, kinds: list[str] | None = None,
          exclude: list[str] | None = None) -> int:
    """Record each batch with the claim of the next, until a claim finds nothing."""
    statement = FINISH_AND_CLAIM + (", %s::text[], %s::text[])" if kinds or exclude else ")")
    done: list[dict[str, Any]] = []
    jobs = 0
    while True:
        params: list[Any] = [owner, [j["tenant_id"] for j in done], [j["id"] for j in done],
                             [j["lease_token"] for j in done], ["succeeded"] * len(done),
                             [None] * len(done), [None] * len(done), 10]
        if kinds or exclude:
            params += [kinds, exclude]
        rows = conn.execute(statement, params).fetchall()
        jobs += len(done)
        done = [r for r in rows if r["claimed"]]
        if not done:
            return jobs


def measure(conn: Conn, step: Callable[[], int]) -> dict[str, Any]:
    start = meters.wal_mark(conn)
    began = time.perf_counter()
    jobs = step()
    seconds = time.perf_counter() - began
    own = meters.wal_breakdown(conn, start, meters.wal_mark(conn))
    return {"jobs": jobs, "us_per_job": round(seconds / jobs * 1e6, 1),
            "wal_per_job": round((own["own_bytes"] - own["own_fpi_bytes"]) / jobs, 1),
            "fpi_per_job": round(own["own_fpi_bytes"] / jobs, 1),
            "by_relation": {k: round(v / jobs, 1) for k, v in own["by_relation"].items()}}


def dense(conn: Conn, filtered: bool) -> dict[str, Any]:
    tenants = [uuid.uuid4() for _ in range(10)]
    out = {"enqueue, 10 tenants x 400, two kinds": measure(
        conn, lambda: enqueue(conn, tenants, 400, ["quick", "slow"]))}
    if filtered:
        out["drain, main worker (p_exclude_kinds)"] = measure(
            conn, lambda: drain(conn, "main", exclude=["slow"]))
        out["drain, slow worker (p_kinds)"] = measure(conn, lambda: drain(conn, "slow", ["slow"]))
    else:
        out["drain, no filter"] = measure(conn, lambda: drain(conn, "worker"))
    return out


def sparse(conn: Conn, filtered: bool) -> dict[str, Any]:
    tenants = [uuid.uuid4() for _ in range(1000)]
    out = {"enqueue, 1,000 tenants x 1": measure(
        conn, lambda: enqueue(conn, tenants, 1, ["quick"]))}
    if filtered:
        out["drain sparse, main worker (p_exclude_kinds)"] = measure(
            conn, lambda: drain(conn, "main", exclude=["slow"]))
    else:
        out["drain sparse, no filter"] = measure(conn, lambda: drain(conn, "worker"))
    return out


def run(admin_dsn: str, sql_dir: Path, with_filters: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case in (dense, sparse):
        for filtered in (False, True) if with_filters else (False,):
            name, dsn = fresh_database(admin_dsn, sql_dir)
            try:
                with connect(dsn) as conn:
                    out.update(case(conn, filtered))
            finally:
                drop_database(admin_dsn, name)
    return out


CLAIMS = {
    "no filter": "select id from app.claim_ready_jobs('bench', 10, '5 minutes')",
    "p_exclude_kinds": "select id from app.claim_ready_jobs('bench', 10, '5 minutes', null,"
                       " '{slow}')",
    "p_kinds": "select id from app.claim_ready_jobs('bench', 10, '5 minutes', '{quick}', null)",
}


def claim_latency(admin_dsn: str, versions: dict[str, tuple[Path, bool]],
                  claims: int) -> dict[str, float]:
    """Median milliseconds of one claim of 10, each case in its own database, in turn."""
    cases: dict[str, tuple[str, Conn, str]] = {}
    try:
        for version, (sql_dir, with_filters) in versions.items():
            for label, statement in CLAIMS.items():
                if label != "no filter" and not with_filters:
                    continue
                name, dsn = fresh_database(admin_dsn, sql_dir)
                conn = connect(dsn)
                cases[f"{version}, {label}"] = (name, conn, statement)
                enqueue(conn, [uuid.uuid4() for _ in range(10)], 4000, ["quick", "slow"])
                conn.execute("vacuum analyze")
        times: dict[str, list[float]] = {case: [] for case in cases}
        for n in range(claims + 30):
            for case, (_, conn, statement) in cases.items():
                began = time.perf_counter()
                conn.execute(statement).fetchall()
                if n >= 30:  # the first ones warm the caches and plan
                    times[case].append(time.perf_counter() - began)
        return {case: round(statistics.median(t) * 1000, 3) for case, t in times.items()}
    finally:
        for name, conn, _ in cases.values():
            conn.close()
            drop_database(admin_dsn, name)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python3 bench/claim_kinds.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", required=True, help="superuser DSN of a server with pg_walinspect")
    p.add_argument("--baseline-sql", type=Path,
                   help="the sql/ directory of another checkout to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--claims", type=int, default=300, help="timed claims per case")
    p.add_argument("--out", type=Path, help="also write every round as JSON here")
    args = p.parse_args(argv)
    if "dbname" not in conninfo_to_dict(args.dsn):
        args.dsn = make_conninfo(args.dsn, dbname="postgres")
    versions = {"this checkout": (HERE, True)}
    if args.baseline_sql is not None:
        versions = {"baseline": (args.baseline_sql, False), **versions}
    with connect(args.dsn) as slot:
        slot.execute("select pg_create_physical_replication_slot(%s, true, true)",
                     (f"leaseq_bench_{uuid.uuid4().hex[:8]}",))
        rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in versions}
        for _ in range(args.rounds):
            for version, (sql_dir, with_filters) in versions.items():
                rounds[version].append(run(args.dsn, sql_dir, with_filters))
    for version, results in rounds.items():
        print(version)
        for step in results[0]:
            us = [r[step]["us_per_job"] for r in results]
            wal = [r[step]["wal_per_job"] for r in results]
            print(f"  {step:45s} {statistics.median(us):7.1f} us/job  "
                  f"{statistics.median(wal):7.1f} WAL B/job  (runs: {us} / {wal})")
    latency = claim_latency(args.dsn, versions, args.claims)
    print("one claim of 10, median ms")
    for case, ms in latency.items():
        print(f"  {case:45s} {ms:7.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps({"rounds": rounds, "claim_ms": latency}, indent=1),
                            encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
