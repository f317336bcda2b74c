"""Priorities and their aging in the claim (sql/README.md, "Priorities").

Within a tenant's turn the claim takes the earliest claim key first, the key being
available_at - (priority - 1) x the owner's priority step; tenants' and kinds' turns are
untouched, so one tenant's urgent work never takes another tenant's turn. Time is moved
through the SQL (available_at written by the owner), never by sleeping.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import (
    WORKER_NAME,
    claim,
    claim_one,
    expire_lease,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support import postgres
from tests.support.postgres import Conn

STEP = timedelta(minutes=1)


def enqueue_at(conn: Conn, tenant: uuid.UUID, key: str, priority: int | None = None, *,
               kind: str = "email.send", available_at: Any = None) -> dict[str, Any]:
    """app.enqueue_job with a priority (the procedure's default when None)."""
    if priority is None:
        row = conn.execute(
            "select * from app.enqueue_job(%s, %s, %s, %s, %s)",
            (tenant, key, kind, Jsonb({"k": key}), available_at),
        ).fetchone()
    else:
        row = conn.execute(
            "select * from app.enqueue_job(%s, %s, %s, %s, %s, 6, %s)",
            (tenant, key, kind, Jsonb({"k": key}), available_at, priority),
        ).fetchone()
    assert row is not None
    return row


def due_ago(owner: Conn, job_id: uuid.UUID, ago: timedelta) -> None:
    """Make a job due ``ago`` before now (its key follows: jobs_refresh_claim_key)."""
    owner.execute("update app.jobs set available_at = clock_timestamp() - %s where id = %s",
                  (ago, job_id))


def claim_ready(conn: Conn, limit: int, kinds: list[str] | None = None) -> list[dict[str, Any]]:
    return conn.execute("select * from app.claim_ready_jobs(%s, %s, %s, %s)",
                        (WORKER_NAME, limit, timedelta(seconds=30), kinds)).fetchall()


def test_a_job_without_a_priority_gets_5_and_its_key_from_the_owners_step(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    row = enqueue_at(worker, tenant, "plain")
    stored = job(owner, row["id"])
    assert (row["priority"], stored["priority"]) == (5, 5)
    assert stored["claim_key"] == stored["available_at"] - 4 * STEP
    created = owner.execute("select details from app.job_events where job_id = %s",
                            (row["id"],)).fetchone()
    assert created is not None
    assert created["details"]["priority"] == 5


def test_urgent_jobs_overtake_older_normal_ones_within_a_tenant(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    older = [enqueue_at(worker, tenant, f"normal-{i}")["id"] for i in range(3)]
    for i, job_id in enumerate(older):
        due_ago(owner, job_id, timedelta(minutes=3, seconds=-i))
    urgent = enqueue_at(worker, tenant, "urgent", 9)["id"]
    background = enqueue_at(worker, tenant, "background", 1)["id"]

    order = [claim_one(worker, tenant)["id"] for _ in range(5)]

    assert order == [urgent, *older, background]


def test_the_fair_claim_takes_a_tenants_urgent_jobs_first_in_its_turn(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    normal = enqueue_at(worker, tenant, "normal")["id"]
    due_ago(owner, normal, timedelta(minutes=1))
    urgent = enqueue_at(worker, tenant, "urgent", 8)["id"]

    assert [r["id"] for r in claim_ready(worker, 1)] == [urgent]
    assert [r["id"] for r in claim_ready(worker, 1)] == [normal]


def test_a_tenants_urgent_flood_does_not_take_another_tenants_turn(worker: Conn) -> None:
    flooding, quiet = uuid.UUID(int=1), uuid.UUID(int=2)
    worker.execute(
        "select 1 from app.enqueue_jobs(%s, %s, %s, %s, null, null, null, %s)",
        ([flooding] * 50, [f"flood-{i}" for i in range(50)], ["email.send"] * 50,
         [Jsonb({"i": i}) for i in range(50)], [9] * 50))
    background = enqueue_at(worker, quiet, "background", 1)["id"]

    first = claim_ready(worker, 10)

    assert background in [r["id"] for r in first]
    assert sum(r["tenant_id"] == flooding for r in first) == 9
    # The same with a kind filter: the kinds' turns keep the tenants apart too.
    worker.execute(
        "select 1 from app.enqueue_jobs(%s, %s, %s, %s, null, null, null, %s)",
        ([flooding] * 50, [f"kind-flood-{i}" for i in range(50)], ["sms.send"] * 50,
         [Jsonb({"i": i}) for i in range(50)], [9] * 50))
    late = enqueue_at(worker, quiet, "kind-background", 1, kind="sms.send")["id"]
    assert late in [r["id"] for r in claim_ready(worker, 10, ["sms.send"])]


def test_a_claim_by_kind_takes_urgent_jobs_of_its_kinds_first(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    normal = enqueue_at(worker, tenant, "normal", kind="sms.send")["id"]
    due_ago(owner, normal, timedelta(minutes=2))
    enqueue_at(worker, tenant, "other-kind", 9, kind="email.send")
    urgent = enqueue_at(worker, tenant, "urgent", 9, kind="sms.send")["id"]

    one = worker.execute("select id from app.claim_jobs(%s, %s, 1, %s, %s)",
                         (tenant, WORKER_NAME, timedelta(seconds=30), ["sms.send"])).fetchall()
    fair = claim_ready(worker, 1, ["sms.send"])

    assert [r["id"] for r in one] == [urgent]
    assert [r["id"] for r in fair] == [normal]


@pytest.mark.parametrize("fair", [False, True], ids=["claim_jobs", "claim_ready_jobs"])
def test_a_low_priority_job_starts_within_the_bound_under_a_continuous_urgent_stream(
    worker: Conn, owner: Conn, fair: bool
) -> None:
    """Two urgent jobs arrive per claim of one: the urgent backlog never empties, yet
    the priority-1 job is overtaken only by urgent jobs due less than 8 steps after it."""
    owner.execute("select app.set_priority_step(%s)", (STEP,))
    tenant = new_tenant()
    start = timedelta(hours=2)  # the low job's due time, before now
    low = enqueue_at(worker, tenant, "low", 1)["id"]
    due_ago(owner, low, start)
    gap = timedelta(seconds=10)  # between urgent arrivals
    ahead: list[timedelta] = []
    pending_urgent = 0
    for n in range(400):
        for k in (2 * n, 2 * n + 1):
            urgent = enqueue_at(worker, tenant, f"urgent-{k}", 9)["id"]
            due_ago(owner, urgent, start - k * gap)
            pending_urgent += 1
        if fair:
            (taken,) = claim_ready(worker, 1)
        else:
            taken = claim_one(worker, tenant)
        if taken["id"] == low:
            break
        pending_urgent -= 1
        ahead.append(taken["available_at"] - job(owner, low)["available_at"])
    else:
        raise AssertionError("the low-priority job never started")

    bound = 8 * STEP
    assert all(delay < bound for delay in ahead)
    # Every urgent job due within the bound went first, and none due later did.
    assert len(ahead) == bound // gap
    assert pending_urgent > 0


def test_a_future_job_whose_key_has_passed_waits_for_its_time(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    soon = enqueue_at(worker, tenant, "soon", 9,
                      available_at=owner.execute(
                          "select clock_timestamp() + interval '2 minutes' as t"
                      ).fetchone()["t"])["id"]  # type: ignore[index]
    stored = job(owner, soon)
    assert stored["claim_key"] < stored["available_at"] - timedelta(minutes=7)
    ready = enqueue_at(worker, tenant, "ready", 1)["id"]

    assert [r["id"] for r in claim(worker, tenant)] == [ready]
    due_ago(owner, soon, timedelta(seconds=1))
    assert [r["id"] for r in claim(worker, tenant)] == [soon]


def test_a_retry_a_released_lease_and_a_redrive_recompute_the_key(
    worker: Conn, owner: Conn, db: Database
) -> None:
    owner.execute("select app.set_priority_step(%s)", (timedelta(seconds=30),))
    tenant = new_tenant()
    job_id = enqueue_at(worker, tenant, "retried", 7)["id"]
    assert job(owner, job_id)["claim_key"] == job(owner, job_id)["available_at"] - 3 * STEP
    owner.execute("select app.set_priority_step(%s)", (STEP,))

    def key_follows_due_time() -> None:
        row = job(owner, job_id)
        assert row["claim_key"] == row["available_at"] - 6 * STEP, row

    lease = claim_one(worker, tenant)
    worker.execute("select app.fail_job(%s, %s, %s, %s, %s, %s)",
                   (tenant, job_id, WORKER_NAME, lease["lease_token"],
                    Jsonb({"message": "later"}), timedelta(minutes=5)))
    assert job(owner, job_id)["state"] == "retry_wait"
    key_follows_due_time()

    due_ago(owner, job_id, timedelta(seconds=1))
    claim_one(worker, tenant)
    expire_lease(owner, job_id)
    with db.connect(postgres.REAPER) as reaper:
        reaper.execute("select app.release_expired_jobs(%s)", (tenant,))
    key_follows_due_time()

    owner.execute("update app.jobs set state = 'dead', completed_at = clock_timestamp(),"
                  " lease_owner = null,"
                  " available_at = available_at - interval '1 hour' where id = %s", (job_id,))
    with db.connect(postgres.OPERATOR) as operator:
        operator.execute("select * from app.redrive_jobs_by_id('ops', %s)", ([job_id],))
    assert job(owner, job_id)["state"] == "pending"
    key_follows_due_time()


def test_a_priority_outside_1_to_9_is_refused_and_stores_nothing(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    before = snapshot(owner)
    for bad in (0, 10, -1, None):
        with raises_sqlstate("22023", "p_priority must be between 1 (least urgent) and 9"):
            worker.execute("select * from app.enqueue_job(%s, 'k', 'email.send', '{}', null,"
                           " 6, %s)", (tenant, bad))
    assert snapshot(owner) == before

    rows = worker.execute(
        "select ord, status, error from app.enqueue_jobs(%s, %s, %s, %s, null, null, null, %s)"
        " order by ord",
        ([tenant] * 3, ["a", "b", "c"], ["email.send"] * 3, [Jsonb({})] * 3, [0, None, 12]),
    ).fetchall()
    assert [(r["status"], r["error"]) for r in rows] == [
        ("rejected", "job 1: priority must be between 1 (least urgent) and 9 (most urgent)"
                     " (got 0)"),
        ("created", None),
        ("rejected", "job 3: priority must be between 1 (least urgent) and 9 (most urgent)"
                     " (got 12)"),
    ]
    with raises_sqlstate("22023", "enqueue arrays must all have the same length"):
        worker.execute("select * from app.enqueue_jobs(%s, %s, %s, %s, null, null, null, %s)",
                       ([tenant], ["d"], ["email.send"], [Jsonb({})], [5, 5]))
    # Even the owner, writing the table directly, cannot store one.
    with raises_sqlstate("23514", "jobs_priority_range"):
        owner.execute("insert into app.jobs (tenant_id, operation_key, kind, payload,"
                      " priority) values (%s, 'direct', 'k', '{}', 10)", (tenant,))


def test_the_old_call_shapes_still_enqueue_and_no_overload_is_left(worker: Conn) -> None:
    tenant = new_tenant()
    row = worker.execute("select * from app.enqueue_job(%s, 'old', 'email.send', '{}')",
                         (tenant,)).fetchone()
    assert row is not None
    assert row["priority"] == 5
    worker.execute("select * from app.enqueue_jobs(%s, %s, %s, %s, %s, %s, %s)",
                   ([tenant], ["old-batch"], ["email.send"], [Jsonb({})], [None], [3], ["c-1"]))
    overloads = worker.execute(
        "select proname, count(*) as n from pg_proc"
        " where pronamespace = 'app'::regnamespace and proname in ('enqueue_job', 'enqueue_jobs')"
        " group by proname order by proname").fetchall()
    assert [(r["proname"], r["n"]) for r in overloads] == [("enqueue_job", 1), ("enqueue_jobs", 1)]


def test_only_the_owner_sets_the_priority_step_within_its_range(
    owner: Conn, db: Database
) -> None:
    for bad in (timedelta(0), timedelta(days=2), None):
        with raises_sqlstate("22023", "p_step must be between"):
            owner.execute("select app.set_priority_step(%s)", (bad,))
    row = owner.execute("select app.set_priority_step(%s) as step",
                        (timedelta(seconds=5),)).fetchone()
    assert row is not None
    assert row["step"] == timedelta(seconds=5)
    for role in (postgres.PRODUCER, postgres.DUTY_WORKER, postgres.OPERATOR):
        with db.connect(role) as conn, raises_sqlstate("42501"):
            conn.execute("select app.set_priority_step(interval '1 hour')")
        with db.connect(role) as conn, raises_sqlstate("42501"):
            conn.execute("update app.settings set priority_step = interval '1 hour'")


def test_a_hand_edit_of_available_at_or_priority_moves_the_key_and_the_claimable_entry(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    row = enqueue_at(worker, tenant, "edited")
    owner.execute("update app.jobs set available_at = available_at + interval '1 hour'"
                  " where id = %s", (row["id"],))
    owner.execute("update app.jobs set priority = 9 where id = %s", (row["id"],))
    stored = job(owner, row["id"])
    assert stored["claim_key"] == stored["available_at"] - 8 * STEP
    entry = owner.execute("select claim_key, available_at, priority from app.claimable"
                          " where job_id = %s", (row["id"],)).fetchone()
    assert entry == {"claim_key": stored["claim_key"], "available_at": stored["available_at"],
                     "priority": 9}
    # An edit that writes the key as well keeps the key it wrote.
    owner.execute("update app.jobs set priority = 1, claim_key = available_at where id = %s",
                  (row["id"],))
    kept = job(owner, row["id"])
    assert kept["claim_key"] == kept["available_at"]


def test_no_before_update_row_trigger_locks_the_rows_of_the_hot_tables(owner: Conn) -> None:
    """A BEFORE UPDATE row trigger makes PostgreSQL lock each row before its update
    (a WAL record per claim and per outcome), whatever the trigger's WHEN test says."""
    rows = owner.execute(
        "select t.tgrelid::regclass::text as relation, t.tgname from pg_trigger t"
        " where t.tgrelid = any (array['app.jobs', 'app.claimable', 'app.leases']::regclass[])"
        "   and not t.tgisinternal"
        "   and t.tgtype & 1 = 1 and t.tgtype & 2 = 2 and t.tgtype & 16 = 16").fetchall()
    assert rows == []
    refresh = owner.execute("select t.tgtype & 2 = 0 as after from pg_trigger t"
                            " where t.tgname = 'jobs_refresh_claim_key'").fetchone()
    assert refresh == {"after": True}
