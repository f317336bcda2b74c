"""Upgrading a database of the release before priorities, with jobs in every state.

The database is built with every migration before the priorities migration, and its jobs
are written into that release's table directly (the function files here are this
release's and need its columns). After ``migrate`` every row has priority 5 and the
claim key its available_at gives it, the events are kept, and the claim takes the
upgraded jobs in their old order, new urgent work ahead of those that waited less
than the 4 steps it gains on them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate

from tests.conftest import Database
from tests.sql.calls import WORKER_NAME
from tests.support import postgres

#: The events' columns before and after 0029_events_by_day (which drops their id).
EVENTS = ("select sequence, tenant_id, job_id, event_type, actor, details, created_at,"
          " lease_token from app.job_events order by sequence")

PRIORITIES = next(m.version for m in load_migrations() if m.name == "job_priorities")

#: (operation key, state, available_at relative to now, with a live lease)
JOBS = [
    ("ready-old", "pending", timedelta(minutes=-10), False),
    ("ready-new", "pending", timedelta(minutes=-1), False),
    ("scheduled", "pending", timedelta(hours=1), False),
    ("running", "running", timedelta(minutes=-5), True),
    ("retrying", "retry_wait", timedelta(seconds=30), False),
    ("retried", "retry_wait", timedelta(minutes=-3), False),
    ("done", "succeeded", timedelta(minutes=-20), False),
    ("failed", "dead", timedelta(minutes=-30), False),
    ("stopped", "cancelled", timedelta(minutes=-40), False),
]


def test_an_upgraded_database_gets_priorities_and_keys_on_every_row(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    tenant = uuid.uuid4()
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < PRIORITIES], [])
    with database.connect(postgres.OWNER) as owner:
        for key, state, due, leased in JOBS:
            owner.execute(
                "with job as ("
                " insert into app.jobs (tenant_id, operation_key, kind, payload, state,"
                "  attempts, available_at, lease_owner, lease_token, lease_expires_at,"
                "  completed_at)"
                " values (%(t)s, %(k)s, 'email.send', '{}', %(s)s::app.job_state,"
                "  case when %(s)s::app.job_state = 'pending' then 0 else 1 end,"
                "  clock_timestamp() + %(due)s,"
                "  case when %(l)s then 'old-worker' end,"
                "  case when %(l)s then gen_random_uuid() end,"
                "  case when %(l)s then clock_timestamp() + interval '1 minute' end,"
                "  case when %(s)s::app.job_state in ('succeeded', 'dead', 'cancelled')"
                "   then clock_timestamp() end)"
                " returning *)"
                " insert into app.job_events (tenant_id, job_id, event_type, actor)"
                " select tenant_id, id, 'created', 'enqueue' from job",
                {"t": tenant, "k": key, "s": state, "due": due, "l": leased})
        before = owner.execute(
            "select id, operation_key, state, attempts, available_at, lease_token"
            " from app.jobs order by operation_key").fetchall()
        events_before = owner.execute(EVENTS).fetchall()

    with connect(database.owner_dsn) as conn:
        report = migrate(conn)
    assert PRIORITIES in report.applied

    with database.connect(postgres.OWNER) as owner:
        after = owner.execute(
            "select j.id, operation_key, state, attempts, available_at, l.lease_token, priority,"
            " claim_key from app.jobs j left join app.leases l on l.job_id = j.id"
            " order by operation_key").fetchall()
        assert owner.execute(EVENTS).fetchall() == events_before
        step = owner.execute("select priority_step from app.settings").fetchone()
    assert step == {"priority_step": timedelta(minutes=1)}
    assert len(after) == len(JOBS)
    for old, new in zip(before, after, strict=True):
        assert {k: new[k] for k in old} == old
        assert new["priority"] == 5
        assert new["claim_key"] == new["available_at"] - 4 * timedelta(minutes=1), new

    with database.connect(postgres.WORKER) as worker:
        worker.execute("select * from app.enqueue_job(%s, 'urgent', 'email.send', '{}', null,"
                       " 6, 9)", (tenant,))
        claimed = worker.execute("select operation_key from app.claim_jobs(%s, %s, 10)",
                                 (tenant, WORKER_NAME)).fetchall()
    # ready-old has waited 10 minutes: more than the 4 steps urgent work gains on it.
    assert [r["operation_key"] for r in claimed] == ["ready-old", "urgent", "retried",
                                                     "ready-new"]
