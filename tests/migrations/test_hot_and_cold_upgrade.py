"""Upgrading a database of the release before the claimable entries and leases, with jobs
in every state and their events.

The database is built with every migration before ``hot_and_cold_jobs`` (no function
files: this release's need its tables), and its jobs are written into that release's
table directly, the way its functions left them. After ``migrate`` every job row keeps
its values, each waiting job has exactly one claimable entry with its key and due time,
each running job its lease with the same owner, token and expiry, the events are kept,
and the upgraded jobs go on: the claim takes the ready ones in their order, the worker
that held a lease before the upgrade finishes its job with its token, the renewal tells
of a cancel requested before the upgrade, and the reaper releases an expired lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import WORKER_NAME
from tests.support import postgres

#: The events' columns before and after 0029_events_by_day (which drops their id).
EVENTS = ("select sequence, tenant_id, job_id, event_type, actor, details, created_at,"
          " lease_token from app.job_events order by sequence")

HOT_AND_COLD = next(m.version for m in load_migrations() if m.name == "hot_and_cold_jobs")

#: (operation key, state, available_at relative to now, lease: None, "live" or "expired",
#: cancel requested)
JOBS: list[tuple[str, str, timedelta, str | None, bool]] = [
    ("ready-old", "pending", timedelta(minutes=-10), None, False),
    ("ready-new", "pending", timedelta(minutes=-1), None, False),
    ("scheduled", "pending", timedelta(hours=1), None, False),
    ("running", "running", timedelta(minutes=-5), "live", False),
    ("cancelling", "running", timedelta(minutes=-5), "live", True),
    ("stuck", "running", timedelta(minutes=-6), "expired", False),
    ("retrying", "retry_wait", timedelta(seconds=30), None, False),
    ("retried", "retry_wait", timedelta(minutes=-3), None, False),
    ("done", "succeeded", timedelta(minutes=-20), None, False),
    ("failed", "dead", timedelta(minutes=-30), None, False),
    ("stopped", "cancelled", timedelta(minutes=-40), None, True),
]

#: The columns both releases have.
KEPT = ("id", "tenant_id", "operation_key", "kind", "payload", "state", "attempts",
        "max_attempts", "available_at", "lease_owner", "last_error", "result", "created_at",
        "updated_at", "completed_at", "correlation_id", "cancel_requested_at",
        "cancel_requested_by", "priority", "claim_key")


def _build(owner: Any, tenant: uuid.UUID) -> None:
    for n, (key, state, due, lease, cancel) in enumerate(JOBS):
        owner.execute(
            "with job as ("
            " insert into app.jobs (tenant_id, operation_key, kind, payload, state, attempts,"
            "  available_at, lease_owner, lease_token, lease_expires_at, completed_at,"
            "  result, last_error, priority, created_at, cancel_requested_at,"
            "  cancel_requested_by)"
            " values (%(t)s, %(k)s, 'email.send', %(p)s, %(s)s::app.job_state,"
            "  case when %(s)s::app.job_state = 'pending' then 0 else 1 end,"
            "  clock_timestamp() + %(due)s,"
            "  case when %(l)s::text is not null then 'old-worker' end,"
            "  case when %(l)s::text is not null then gen_random_uuid() end,"
            "  case %(l)s::text when 'live' then clock_timestamp() + interval '5 minutes'"
            "   when 'expired' then clock_timestamp() - interval '1 minute' end,"
            "  case when %(s)s::app.job_state in ('succeeded', 'dead', 'cancelled')"
            "   then clock_timestamp() end,"
            "  case when %(s)s::app.job_state = 'succeeded' then '{\"ok\": true}'::jsonb end,"
            "  case when %(s)s::app.job_state in ('dead', 'retry_wait')"
            "   then '{\"code\": \"E\"}'::jsonb end,"
            "  %(prio)s, clock_timestamp() - interval '1 hour' + %(n)s * interval '1 second',"
            "  case when %(c)s then clock_timestamp() end, case when %(c)s then 'ops' end)"
            " returning *)"
            " insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token)"
            " select tenant_id, id, e.type, e.actor, case when e.type = 'claimed'"
            "  then lease_token end from job"
            " cross join lateral (values ('created', 'enqueue'), ('claimed', 'old-worker'))"
            "  as e(type, actor)"
            " where e.type = 'created' or state <> 'pending'",
            {"t": tenant, "k": key, "s": state, "due": due, "l": lease, "c": cancel,
             "p": Jsonb({"n": n}), "prio": 9 if key == "ready-new" else 5, "n": n})


def test_an_upgraded_database_keeps_every_job_and_moves_waiting_and_running_ones(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    tenant = uuid.uuid4()
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < HOT_AND_COLD], [])
    with database.connect(postgres.OWNER) as owner:
        _build(owner, tenant)
        before = {r["operation_key"]: r for r in owner.execute(
            "select * from app.jobs order by operation_key").fetchall()}
        events_before = owner.execute(EVENTS).fetchall()

    with connect(database.owner_dsn) as conn:
        report = migrate(conn)
    assert HOT_AND_COLD in report.applied

    with database.connect(postgres.OWNER) as owner:
        after = {r["operation_key"]: r for r in owner.execute(
            "select * from app.jobs order by operation_key").fetchall()}
        entries = owner.execute("select * from app.claimable").fetchall()
        leases = owner.execute("select * from app.leases").fetchall()
        assert owner.execute(EVENTS).fetchall() == events_before
    assert after.keys() == before.keys()
    for key, old in before.items():
        new = after[key]
        assert {c: new[c] for c in KEPT} == {c: old[c] for c in KEPT}, key
        assert new["outcome"] == (old["state"] if old["state"] in
                                  ("succeeded", "dead", "cancelled") else None)
    waiting = {k: r for k, r in before.items() if r["state"] in ("pending", "retry_wait")}
    assert sorted(e["job_id"] for e in entries) == sorted(r["id"] for r in waiting.values())
    for entry in entries:
        job = next(r for r in waiting.values() if r["id"] == entry["job_id"])
        assert {c: entry[c] for c in ("tenant_id", "kind", "claim_key", "created_at",
                                      "available_at", "state", "priority")} == {
            c: job[c] for c in ("tenant_id", "kind", "claim_key", "created_at",
                                "available_at", "state", "priority")}
    running = {r["id"]: r for r in before.values() if r["state"] == "running"}
    assert {lease["job_id"] for lease in leases} == running.keys()
    for lease in leases:
        job = running[lease["job_id"]]
        assert (lease["tenant_id"], lease["lease_owner"], lease["lease_token"],
                lease["expires_at"]) == (job["tenant_id"], job["lease_owner"],
                                         job["lease_token"], job["lease_expires_at"])

    with database.connect(postgres.WORKER) as worker:
        live = before["running"]
        finished = worker.execute(
            "select state::text as state from app.finish_jobs('old-worker', %s, %s, %s,"
            " array['succeeded'], array['{}'::jsonb], array[null::interval])",
            ([tenant], [live["id"]], [live["lease_token"]])).fetchall()
        assert finished == [{"state": "succeeded"}]
        cancelling = before["cancelling"]
        renewal = worker.execute(
            "select renewed, cancel_requested from app.renew_job_lease_status(%s, %s,"
            " 'old-worker', %s)", (tenant, cancelling["id"], cancelling["lease_token"])
        ).fetchone()
        assert renewal == {"renewed": True, "cancel_requested": True}
        claimed = worker.execute("select operation_key, priority from app.claim_jobs(%s, %s,"
                                 " 10)", (tenant, WORKER_NAME)).fetchall()
    # ready-new (priority 9) gains 4 steps on ready-old, which waited 10 minutes.
    assert [r["operation_key"] for r in claimed] == ["ready-old", "ready-new", "retried"]
    assert claimed[1]["priority"] == 9

    with database.connect(postgres.REAPER) as reaper:
        released = reaper.execute("select app.release_all_expired_jobs(100) as n").fetchone()
    assert released == {"n": 1}
    with database.connect(postgres.OWNER) as owner:
        stuck = owner.execute("select state::text as state from app.jobs where id = %s",
                              (before["stuck"]["id"],)).fetchone()
        assert stuck == {"state": "retry_wait"}
        assert owner.execute("select count(*) as n from app.claimable where job_id = %s",
                             (before["stuck"]["id"],)).fetchone() == {"n": 1}
