"""``bench/run.py retention``: what deleting a day of finished jobs costs today.

One database holds ``--finished`` succeeded jobs that completed two days ago, each with
the events a job leaves (created, claimed, succeeded), written set-based into the
partitions of their UTC days (made first, as the reaper makes them ahead). The reaper's
retention then deletes them as it does in production: ``app.prune_retained_jobs``
pages of ``--page`` jobs (each its own short transaction, through the same
``prune_in_pages`` loop and ``QueueClient`` the reaper uses) until a page comes back
short. Measured: seconds, WAL (pg_walinspect's attribution to this database when
available, the LSN distance otherwise), server CPU; then the ``VACUUM`` that the deleted
rows call for, measured the same way, since a DELETE's cost is only paid off when vacuum
has reclaimed the space. A later design that drops a day's partition instead compares
against these figures.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness import meters, source
from harness.drain import Window, measured
from harness.pg import Server, connect, run_database
from harness.systems import leaseq_install, pin_migrations, tenant_ids

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DIR = Path(__file__).resolve().parent.parent

_FILL_JOBS = """
insert into app.jobs (tenant_id, operation_key, kind, payload, state, attempts,
                      available_at, result, created_at, updated_at, completed_at)
select (%(tenants)s::uuid[])[1 + g %% cardinality(%(tenants)s::uuid[])],
       'retained-' || g, 'noop', jsonb_build_object('n', g), 'succeeded', 1,
       now() - interval '2 days', 'null'::jsonb,
       now() - interval '2 days', now() - interval '2 days',
       now() - interval '2 days' + g * interval '1 millisecond' * 86400000 / %(count)s
from generate_series(1, %(count)s) g
"""

# The days the jobs finished in get their partitions first, as the reaper's roll makes
# them ahead of time in production: the events land in their day, not in DEFAULT.
_ADD_DAYS = """
select app.add_event_day(d::date)
from generate_series((now() - interval '2 days') at time zone 'UTC',
                     (now() - interval '1 day') at time zone 'UTC', interval '1 day') d
"""

_FILL_EVENTS = """
insert into app.job_events (tenant_id, job_id, event_type, actor, created_at, lease_token)
select j.tenant_id, j.id, e.event_type, e.actor, j.completed_at,
       case when e.event_type = 'created' then null else gen_random_uuid() end
from app.jobs j
cross join (values ('created', 'enqueue'), ('claimed', 'bench-worker'),
                   ('succeeded', 'bench-worker')) as e(event_type, actor)
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 bench/run.py retention",
        description="Delete a day of finished jobs (with their events) as the reaper's "
                    "retention does, app.prune_retained_jobs page by page; report the "
                    "seconds, WAL and server CPU of the prune and of the VACUUM after it.")
    p.add_argument("--dsn", default=DEFAULT_DSN, help="superuser DSN (default: %(default)s)")
    p.add_argument("--finished", type=int, default=1_000_000,
                   help="finished jobs that completed within one day, two days ago "
                        "(default %(default)s), each with 3 events")
    p.add_argument("--tenants", type=int, default=10, help="tenants (%(default)s)")
    p.add_argument("--page", type=int, default=1000,
                   help="jobs per app.prune_retained_jobs call, the reaper's page "
                        "(default %(default)s)")
    p.add_argument("--chunk", type=int, default=50,
                   help="pages per measured stretch: the WAL of each is attributed before "
                        "checkpoints recycle it (default %(default)s)")
    p.add_argument("--retention-days", type=float, default=1.0,
                   help="the age passed to the prune (default %(default)s day)")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results file (default bench/results/retention-<time>.json)")
    return p.parse_args(argv)


def _reading(window: Window) -> dict[str, Any]:
    wal = window.wal
    breakdown = wal.breakdown if wal is not None else {}
    return {
        "seconds": window.seconds,
        "wal_lsn_bytes": wal.lsn_bytes if wal is not None else None,
        "wal_own_bytes": breakdown.get("own_bytes"),
        "wal_fpi_bytes": breakdown.get("own_fpi_bytes"),
        "wal_by_relation": breakdown.get("by_relation"),
        "wal_own_records": breakdown.get("own_records"),
        "server_cpu_s": window.cpu.attributed_s if window.cpu is not None else None,
        "wal_breakdown_error": breakdown.get("error"),
    }


def _summed(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """The stretches' readings added up (a figure missing from any stretch is None)."""
    out: dict[str, Any] = {}
    for key in ("seconds", "wal_lsn_bytes", "server_cpu_s"):
        values = [r[key] for r in readings]
        out[key] = None if any(v is None for v in values) else sum(values)
    # A stretch whose WAL could not be attributed (the last one, nearly empty, may start
    # past the flushed WAL) counts with its LSN distance, an upper bound; how many did
    # is kept beside the total.
    unattributed = [r for r in readings if r["wal_own_bytes"] is None]
    out["wal_own_bytes"] = sum(r["wal_own_bytes"] if r["wal_own_bytes"] is not None
                               else r["wal_lsn_bytes"] for r in readings)
    out["wal_fpi_bytes"] = sum(r["wal_fpi_bytes"] or 0 for r in readings)
    out["wal_unattributed_stretches"] = len(unattributed)
    out["wal_unattributed_lsn_bytes"] = sum(r["wal_lsn_bytes"] for r in unattributed)
    out["stretch_own_bytes"] = [r["wal_own_bytes"] for r in readings]
    by_relation: dict[str, int] = {}
    for r in readings:
        for rel, b in (r["wal_by_relation"] or {}).items():
            by_relation[rel] = by_relation.get(rel, 0) + b
    out["wal_by_relation"] = dict(sorted(by_relation.items(), key=lambda kv: -kv[1]))
    out["wal_breakdown_errors"] = [r["wal_breakdown_error"] for r in readings
                                   if r["wal_breakdown_error"]]
    return out


def _sizes(dsn: str) -> dict[str, int]:
    with connect(dsn) as conn:
        row = conn.execute(
            "select pg_total_relation_size('app.jobs') as jobs,"
            " pg_total_relation_size('app.job_events') as events,"
            " (select count(*) from app.jobs) as job_rows").fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from leaseq import QueueClient
    from leaseq import connect as leaseq_connect
    from leaseq.upkeep.retention import PruneReport, prune_in_pages

    server = Server(args.dsn)
    with connect(args.dsn) as conn:
        pm = meters.postmaster_pid(conn)
    walinspect = server.has_extension("pg_walinspect")
    dbname = run_database("leaseq_bench_retention")
    out: dict[str, Any] = {"finished": args.finished, "page": args.page,
                           "events_per_job": 3, "server": server.facts()}
    with server.database(dbname, keep=args.keep_databases) as dsn:
        leaseq_install(dsn)
        has_walinspect = walinspect and meters.enable_walinspect(dsn)
        t0 = time.perf_counter()
        with connect(dsn) as conn:
            conn.execute(_FILL_JOBS, {"tenants": tenant_ids(args.tenants),
                                      "count": args.finished})
            conn.execute(_ADD_DAYS)
            conn.execute(_FILL_EVENTS)
            conn.execute("vacuum (analyze) app.jobs")
            conn.execute("vacuum (analyze) app.job_events")
        out["fill_seconds"] = time.perf_counter() - t0
        out["before"] = _sizes(dsn)
        print(f"  filled {args.finished:,} finished jobs in {out['fill_seconds']:.0f} s",
              flush=True)
        server.checkpoint()

        def cpu() -> meters.ServerCpuMeter | None:
            return meters.ServerCpuMeter(pm, dbname) if meters.ServerCpuMeter.available(
                pm) and pm is not None else None

        client = QueueClient(lambda: leaseq_connect(dsn, application_name="bench-retention"))
        client.check()
        # The prune runs in stretches of --chunk pages, each its own window: the WAL of a
        # stretch is attributed by pg_walinspect right after it (outside the window, so
        # neither its time nor its CPU is counted), before checkpoints recycle it.
        readings: list[dict[str, Any]] = []
        report = PruneReport()
        try:
            with connect(dsn) as probe:
                while True:
                    with measured(probe, cpu_meter=cpu(),
                                  walinspect=has_walinspect) as window:
                        part = prune_in_pages(client.prune_retained_jobs,
                                              timedelta(days=args.retention_days),
                                              limit=args.page, max_pages=args.chunk)
                    readings.append(_reading(window))
                    report.jobs_deleted += part.jobs_deleted
                    report.events_deleted += part.events_deleted
                    report.batches += part.batches
                    if part.batches < args.chunk or part.jobs_deleted < args.page * part.batches:
                        break
        finally:
            client.close()
        out["prune"] = {**_summed(readings), "jobs_deleted": report.jobs_deleted,
                        "events_deleted": report.events_deleted, "pages": report.batches,
                        "stretches": len(readings)}
        print(f"  prune: {report.jobs_deleted:,} jobs, {report.events_deleted:,} events in "
              f"{report.batches} pages, {out['prune']['seconds']:.1f} s", flush=True)
        if report.jobs_deleted != args.finished:
            raise RuntimeError(f"the prune deleted {report.jobs_deleted} of {args.finished}")
        with connect(dsn) as probe, connect(dsn) as conn, measured(
                probe, cpu_meter=cpu(), walinspect=has_walinspect) as window:
            conn.execute("vacuum app.jobs")
            conn.execute("vacuum app.job_events")
        out["vacuum"] = _reading(window)
        out["after"] = _sizes(dsn)
    return out


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e6:,.0f}"


def render(result: dict[str, Any]) -> str:
    lines = [f"Retention: {result['finished']:,} finished jobs of one day (3 events each), "
             f"app.prune_retained_jobs in pages of {result['page']:,}; "
             f"{result['server']['version'].split(' on ')[0]}", "",
             "| Step | seconds | WAL MB (this database) | of which FPI MB | WAL MB (LSN distance) "
             "| server CPU s | WAL B/job |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for step in ("prune", "vacuum"):
        r = result[step]
        own = r["wal_own_bytes"]
        per_job = (own if own is not None else r["wal_lsn_bytes"]) / result["finished"]
        lines.append(
            f"| {step} | {r['seconds']:.1f} | {_mb(own)} | {_mb(r['wal_fpi_bytes'])} "
            f"| {_mb(r['wal_lsn_bytes'])} "
            f"| {'–' if r['server_cpu_s'] is None else format(r['server_cpu_s'], '.1f')} "
            f"| {per_job:,.0f} |")
    prune = result["prune"]
    lines += ["", f"pages: {prune['pages']:,}; jobs deleted {prune['jobs_deleted']:,}, "
              f"events deleted {prune['events_deleted']:,}; table + index bytes before "
              f"{(result['before']['jobs'] + result['before']['events']) / 1e6:,.0f} MB, "
              "after the vacuum "
              f"{(result['after']['jobs'] + result['after']['events']) / 1e6:,.0f} MB"]
    if prune.get("wal_unattributed_stretches"):
        lines.append(f"{prune['wal_unattributed_stretches']} stretch(es) of the prune counted "
                     f"with their LSN distance ({prune['wal_unattributed_lsn_bytes']:,} B), "
                     "their WAL not attributable")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    revision = source.revision()
    source.freeze()
    migrations = pin_migrations()
    result = run(args)
    result["source"] = revision
    result["leaseq_migrations"] = migrations
    result["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    out = args.out or BENCH_DIR / "results" / (
        "retention-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    print()
    print(render(result))
    print(f"\nresults: {out}")
    return 0
