"""Upgrading a database of the release before per-queue turns, with waiting jobs in two
queues and turns per tenant as that release kept them.

The database is built with every migration before 0027_queue_turns and its rows are written
directly (the function files here are this release's). After ``migrate`` every tenant's
turn of that release is its turn in 'default', every (queue, tenant) and (queue, tenant,
kind) with claimable entries, in 'default' too, has a turn no later than its oldest entry,
and each queue's claim takes its own jobs without waiting for the reaper's repair.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate

from tests.conftest import Database
from tests.support import postgres

QUEUE_TURNS = next(m.version for m in load_migrations() if m.name == "queue_turns")

#: (tenant, queue, kind, available_at relative to now)
WAITING = [
    (0, "default", "email.send", timedelta(minutes=-5)),
    (0, "reports", "report.build", timedelta(minutes=-3)),
    (0, "reports", "report.build", timedelta(hours=1)),
    (1, "reports", "pdf.render", timedelta(minutes=-1)),
    (1, "pdf", "pdf.render", timedelta(minutes=2)),
    (2, "default", "email.send", timedelta(minutes=-2)),
]


def test_an_upgraded_database_gives_every_claimable_entry_a_turn_in_its_queue(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    tenants = [uuid.uuid4(), uuid.uuid4(), uuid.uuid4()]
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < QUEUE_TURNS], [])
    with database.connect(postgres.OWNER) as owner:
        for n, (tenant, queue, kind, due) in enumerate(WAITING):
            owner.execute(
                "insert into app.jobs (tenant_id, operation_key, kind, payload, state,"
                " available_at, claim_key, queue)"
                " values (%(t)s, %(k)s, %(kind)s, '{}', 'pending',"
                " clock_timestamp() + %(due)s, clock_timestamp() + %(due)s, %(q)s)",
                {"t": tenants[tenant], "k": f"job-{n}", "kind": kind, "due": due, "q": queue})
        # The entries carry their job's queue, as that release's triggers wrote them.
        owner.execute("update app.claimable c set queue = j.queue from app.jobs j"
                      " where j.id = c.job_id")
        # That release's turns: one per tenant, whatever the queue; the third tenant's
        # turn was lost (a defect the reaper's repair would have fixed).
        owner.execute("insert into app.tenant_turns (tenant_id, turn_at)"
                      " values (%s, clock_timestamp() - interval '10 minutes'),"
                      " (%s, null), (%s, null)", tenants)
        old_turns = owner.execute("select tenant_id, turn_at from app.tenant_turns"
                                  " where tenant_id <> %s order by tenant_id",
                                  (tenants[2],)).fetchall()
        entries = owner.execute("select count(*) as n from app.claimable").fetchone()
        assert entries == {"n": len(WAITING)}

    with connect(database.owner_dsn) as conn:
        report = migrate(conn)
    assert QUEUE_TURNS in report.applied

    with database.connect(postgres.OWNER) as owner:
        kept = owner.execute("select tenant_id, turn_at from app.tenant_turns"
                             " where queue = 'default' and tenant_id <> %s"
                             " order by tenant_id", (tenants[2],)).fetchall()
        assert kept == old_turns  # already no later than their entries: unchanged
        late = owner.execute(
            "select c.queue, c.tenant_id, c.kind from app.claimable c"
            " where not exists (select 1 from app.tenant_turns t"
            "   where t.queue = c.queue and t.tenant_id = c.tenant_id"
            "     and t.turn_at <= c.available_at)"
            " union all"
            " select c.queue, c.tenant_id, c.kind from app.claimable c"
            " where not exists (select 1 from app.kind_turns t"
            "   where t.queue = c.queue and t.tenant_id = c.tenant_id and t.kind = c.kind"
            "     and t.turn_at <= c.available_at)").fetchall()
        assert late == []
        assert owner.execute("select count(*) as n from app.claimable").fetchone() == {
            "n": len(WAITING)}

    with database.connect(postgres.WORKER) as worker:
        reports = worker.execute(
            "select operation_key from app.claim_ready_jobs('w', 10, interval '30 seconds',"
            " null, null, 'reports') order by operation_key").fetchall()
        assert [r["operation_key"] for r in reports] == ["job-1", "job-3"]
        assert worker.execute(
            "select * from app.claim_ready_jobs('w', 10, interval '30 seconds',"
            " null, null, 'pdf')").fetchall() == []  # due in two minutes
        default = worker.execute(
            "select operation_key from app.claim_ready_jobs('w', 10, interval '30 seconds',"
            " null, null, 'default') order by operation_key").fetchall()
        assert [r["operation_key"] for r in default] == ["job-0", "job-5"]
