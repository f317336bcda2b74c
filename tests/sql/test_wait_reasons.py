"""Why a pending job is not running: app.job_wait_reasons (operators, the dashboard),
app.reader_job_wait_reasons (a tenant's readers) and app.waiting_jobs (leaseq status).
The reasons are sql/README.md's ("Waiting jobs"); time is moved through the SQL."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import claim_one, new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn


def enqueue(conn: Conn, tenant: uuid.UUID, key: str, priority: int = 5,
            available_at: Any = None) -> uuid.UUID:
    row = conn.execute("select id from app.enqueue_job(%s, %s, 'email.send', %s, %s, 6, %s)",
                       (tenant, key, Jsonb({}), available_at, priority)).fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


def reasons(conn: Conn, ids: list[uuid.UUID], *, reader: bool = False
            ) -> dict[uuid.UUID, dict[str, Any]]:
    statement = ("select * from app.reader_job_wait_reasons(%s)" if reader
                 else "select * from app.job_wait_reasons(%s)")
    rows = conn.execute(statement, (ids,)).fetchall()
    return {r["job_id"]: r for r in rows}


def test_each_waiting_job_says_why_it_is_not_running(
    worker: Conn, owner: Conn, db: Database
) -> None:
    tenant = new_tenant()
    running = enqueue(worker, tenant, "running", priority=1)
    assert claim_one(worker, tenant)["id"] == running
    first = enqueue(worker, tenant, "first")
    owner.execute("update app.jobs set available_at = clock_timestamp() - interval '10 minutes'"
                  " where id = %s", (first,))
    queued = enqueue(worker, tenant, "queued", priority=5)
    urgent = enqueue(worker, tenant, "urgent", priority=9)
    low = enqueue(worker, tenant, "low", priority=2)
    later = owner.execute("select clock_timestamp() + interval '1 hour' as t").fetchone()
    assert later is not None
    scheduled = enqueue(worker, tenant, "scheduled", available_at=later["t"])
    retried = enqueue(worker, tenant, "retried", priority=1)
    owner.execute("update app.jobs set state = 'retry_wait', attempts = 1,"
                  " available_at = clock_timestamp() + interval '5 minutes' where id = %s",
                  (retried,))
    ids = [first, queued, urgent, low, scheduled, retried, running, uuid.uuid4()]

    with db.connect(postgres.OPERATOR) as operator:
        got = reasons(operator, ids)

    # Claim order: first (due 10 minutes ago, key -14 min), urgent (key -8), queued (-4),
    # low (-1).
    assert {k: (v["reason"], v["jobs_ahead"], v["higher_priority_ahead"])
            for k, v in got.items()} == {
        first: ("ready", 0, 0),
        urgent: ("queued", 1, 0),
        queued: ("behind_priority", 2, 1),
        low: ("behind_priority", 3, 3),
        scheduled: ("scheduled", None, None),
        retried: ("retry_wait", None, None),
        running: (None, None, None),
    }
    assert got[scheduled]["until"] == got[scheduled]["available_at"] == later["t"]
    assert got[retried]["until"] == got[retried]["available_at"]
    assert got[first]["until"] is None

    with db.connect(postgres.OPERATOR) as operator:
        summary = operator.execute("select * from app.waiting_jobs(%s)", (tenant,)).fetchall()
    assert [(r["reason"], r["jobs"]) for r in summary] == [
        ("behind_priority", 2), ("queued", 1), ("ready", 1), ("retry_wait", 1),
        ("scheduled", 1)]
    assert {r["reason"]: r["next_at"] for r in summary}["scheduled"] == later["t"]


def test_a_reader_learns_why_its_own_tenants_jobs_wait_and_nothing_of_others(
    worker: Conn, owner: Conn, reader: Conn
) -> None:
    mine, other = new_tenant(), new_tenant()
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, mine))
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(mine),))
    theirs = [enqueue(worker, other, f"urgent-{i}", priority=9) for i in range(3)]
    own = enqueue(worker, mine, "own", priority=1)

    got = reasons(reader, [own, *theirs], reader=True)

    assert list(got) == [own]
    assert (got[own]["reason"], got[own]["jobs_ahead"]) == ("ready", 0)


def test_a_wait_reason_call_takes_1_to_500_ids_and_only_its_roles(db: Database) -> None:
    with db.connect(postgres.OPERATOR) as operator:
        for bad in ([], None, [uuid.uuid4()] * 501):
            with raises_sqlstate("22023", "number of jobs must be between 1 and 500"):
                operator.execute("select * from app.job_wait_reasons(%s::uuid[])", (bad,))
    for role in (postgres.PRODUCER, postgres.DUTY_WORKER, postgres.READER):
        with db.connect(role) as conn, raises_sqlstate("42501"):
            conn.execute("select * from app.job_wait_reasons(%s)", ([uuid.uuid4()],))
        with db.connect(role) as conn, raises_sqlstate("42501"):
            conn.execute("select * from app.waiting_jobs()")
