#!/usr/bin/env python3
"""What retention costs for one day of events: dropping the day's partition against
deleting the same rows.

``python3 bench/retention.py --dsn SUPERUSER_DSN [--jobs 1000000]`` (in the project's
environment: ``source scripts/bootstrap`` first). It makes a database of its own,
migrated with this checkout's ``sql/``, and drops it at the end.

* One UTC day 40 days ago gets its partition (``app.add_event_day``) and ``--jobs`` jobs'
  three events each (created, claimed, succeeded), written with one ``generate_series``
  insert; their jobs are gone (pruned), as they are when retention reaches the day.
* The same rows are copied into ``bench_events``, a table of the shape before 0027 (an
  ``id`` uuid and the primary key ``(tenant_id, job_id, sequence)``; the foreign key to
  ``app.jobs`` is left out, which only spares the DELETE its per-row key checks).
* After a CHECKPOINT each, (a) ``app.drop_event_days`` drops the day (the same call the
  prune makes, its read of the day for kept jobs included) and (b) ``delete from
  bench_events`` deletes the rows.

Reported for each: seconds, WAL bytes (``pg_current_wal_lsn`` before and after) and, where
``pg_walinspect`` is installed (PostgreSQL 15+), the WAL's full-page-image bytes and
records over that range. The server is shared: other clients' WAL in the range is
counted too (a temporary physical replication slot keeps the range until it is read).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import psycopg
from leaseq.store.migrate import migrate
from psycopg import sql

FILL = """
insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at,
                            lease_token)
select t.tenant_id, j.job_id, e.type, e.actor, e.details,
       (current_date - 40)::timestamp at time zone 'UTC'
         + (j.n %% 86000) * interval '1 second' + e.k * interval '100 milliseconds',
       case when e.type <> 'created' then j.token end
from generate_series(1, %(jobs)s) as j0(n)
cross join lateral (select j0.n, gen_random_uuid() as job_id, gen_random_uuid() as token)
  as j(n, job_id, token)
cross join lateral (select ('00000000-0000-0000-0000-' || lpad((j.n %% 100)::text, 12, '0'))::uuid
  as tenant_id) as t
cross join lateral (values
  (0, 'created', 'enqueue', '{"kind": "email.send", "maxAttempts": 6, "priority": 3}'::jsonb),
  (1, 'claimed', 'worker-1', '{"attempt": 1}'::jsonb),
  (2, 'succeeded', 'worker-1', '{"attempt": 1}'::jsonb)) as e(k, type, actor, details)
"""

COPY = """
create table bench_events (
  sequence bigint not null, id uuid not null default gen_random_uuid(),
  tenant_id uuid not null, job_id uuid not null, event_type text not null,
  actor text not null, details jsonb not null, created_at timestamptz not null,
  lease_token uuid, primary key (tenant_id, job_id, sequence));
insert into bench_events (sequence, tenant_id, job_id, event_type, actor, details,
                          created_at, lease_token)
select sequence, tenant_id, job_id, event_type, actor, details, created_at, lease_token
from app.job_events
"""


def _measure(conn: psycopg.Connection[Any], statement: str, walinspect: bool) -> dict[str, Any]:
    conn.execute("checkpoint")
    start = conn.execute("select pg_current_wal_lsn() as lsn").fetchone()
    assert start is not None
    began = time.monotonic()
    cur = conn.execute(statement)  # type: ignore[call-overload]
    result = cur.fetchall() if cur.description else [{"rows": cur.rowcount}]
    seconds = time.monotonic() - began
    end = conn.execute("select pg_current_wal_lsn() as lsn,"
                       " pg_wal_lsn_diff(pg_current_wal_lsn(), %s) as bytes",
                       (start["lsn"],)).fetchone()
    assert end is not None
    row: dict[str, Any] = {"seconds": round(seconds, 3), "wal_bytes": int(end["bytes"]),
                           "result": [dict(r) for r in result]}
    if walinspect:
        stats = conn.execute(
            "select coalesce(sum(count), 0) as records, coalesce(sum(fpi_size), 0) as fpi"
            " from pg_get_wal_stats(%s, %s)", (start["lsn"], end["lsn"])).fetchone()
        assert stats is not None
        row.update(records=int(stats["records"]), fpi_bytes=int(stats["fpi"]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a superuser's DSN")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    name = f"leaseq_bench_retention_{uuid.uuid4().hex[:8]}"
    slot = f"bench_retention_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=name)
        with psycopg.connect(dsn, autocommit=True,
                             row_factory=psycopg.rows.dict_row) as conn:
            migrate(conn)
            walinspect = True
            try:
                conn.execute("create extension if not exists pg_walinspect")
                conn.execute("select pg_create_physical_replication_slot(%s, true, true)",
                             (slot,))
            except psycopg.Error:
                walinspect = False
            conn.execute("select app.add_event_day(current_date - 40)")
            began = time.monotonic()
            conn.execute(FILL, {"jobs": args.jobs})  # type: ignore[arg-type]
            conn.execute("vacuum analyze app.job_events")
            filled = time.monotonic() - began
            count = conn.execute("select count(*) as n from app.job_events").fetchone()
            for statement in COPY.split(";"):
                conn.execute(statement)  # type: ignore[call-overload]
            conn.execute("vacuum analyze bench_events")
            size = conn.execute(
                "select pg_total_relation_size(%s) as part,"
                " pg_total_relation_size('bench_events') as copy",
                ("app_events.job_events_" + conn.execute(
                    "select to_char(current_date - 40, 'YYYYMMDD') as d"
                ).fetchone()["d"],)).fetchone()  # type: ignore[index]
            delete = _measure(conn, "delete from bench_events", walinspect)
            drop = _measure(conn, "select * from app.drop_event_days(clock_timestamp())",
                            walinspect)
            server = conn.execute("show server_version").fetchone()
            if walinspect:
                conn.execute("select pg_drop_replication_slot(%s)", (slot,))
        print(json.dumps({"server": server, "jobs": args.jobs, "events": count,
                          "fill_seconds": round(filled, 1), "bytes": size,
                          "drop_partition": drop, "delete_rows": delete}, indent=2,
                         default=str))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("drop database if exists {} with (force)")
                          .format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
