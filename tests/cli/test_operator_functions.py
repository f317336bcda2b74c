"""Contract of sql/0006: redrive, cancel, prune and the operator reads.

Every call is made as a runtime login (the suite's worker, a member of every runtime
duty group, leaseq_operator among them); who else may call them is checked at the end.
The owner and the administrator only arrange data or look at tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import (
    claim,
    claim_one,
    enqueue,
    enqueue_many,
    event_types,
    events,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support import postgres
from tests.support.postgres import Conn

OPERATOR_CALLS = {
    "redrive_jobs": "select * from app.redrive_jobs('ops', null, null, null, 10, null)",
    "cancel_jobs": "select * from app.cancel_jobs('ops', null, null, null, 10, null)",
    "prune_jobs": "select * from app.prune_jobs(interval '1 day', 10)",
    "queue_status": "select * from app.queue_status(null)",
    "get_job": "select * from app.get_job(gen_random_uuid())",
    "job_timeline": "select * from app.job_timeline(gen_random_uuid(), 10)",
    "dead_jobs": "select * from app.dead_jobs(null, null, 10)",
}


def _dead(worker: Conn, tenant: uuid.UUID, key: str, *, kind: str = "email.send"
          ) -> dict[str, Any]:
    """A job that died at once: discarded by its worker on the first attempt."""
    enqueue(worker, tenant, key, kind=kind)
    lease = claim_one(worker, tenant)
    worker.execute(
        "select app.discard_job(%s, %s, %s, %s, %s)",
        (tenant, lease["id"], lease["lease_owner"], lease["lease_token"],
         Jsonb({"code": "DISCARDED", "message": "bad input"})),
    )
    return lease


def _redrive(worker: Conn, *, tenant: uuid.UUID | None = None,
             ids: list[uuid.UUID] | None = None, kind: str | None = None, limit: int = 100,
             reason: str | None = None, actor: str = "ops:alice") -> list[dict[str, Any]]:
    return worker.execute(
        "select * from app.redrive_jobs(%s, %s, %s, %s, %s, %s)",
        (actor, tenant, ids, kind, limit, reason),
    ).fetchall()


def _cancel(worker: Conn, *, tenant: uuid.UUID | None = None,
            ids: list[uuid.UUID] | None = None, kind: str | None = None, limit: int = 100,
            reason: str | None = None, actor: str = "ops:alice") -> list[dict[str, Any]]:
    return worker.execute(
        "select * from app.cancel_jobs(%s, %s, %s, %s, %s, %s)",
        (actor, tenant, ids, kind, limit, reason),
    ).fetchall()


def _prune(worker: Conn, older_than: timedelta, limit: int = 1000) -> dict[str, Any]:
    row = worker.execute("select * from app.prune_jobs(%s, %s)", (older_than, limit)).fetchone()
    assert row is not None
    return row


def _age_completion(admin: Conn, job_id: uuid.UUID, days: int) -> None:
    admin.execute(
        "update app.jobs set completed_at = clock_timestamp() - make_interval(days => %s)"
        " where id = %s", (days, job_id))


# Redrive --------------------------------------------------------------------------------


def test_redrive_turns_a_dead_job_into_a_fresh_pending_one_with_an_audit_event(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    lease = _dead(worker, tenant, "a")
    rows = _redrive(worker, ids=[lease["id"]], reason="fixed the template")
    assert [r["job_id"] for r in rows] == [lease["id"]]
    redriven = job(owner, lease["id"])
    assert redriven["state"] == "pending"
    assert redriven["attempts"] == 0
    assert redriven["completed_at"] is None
    assert redriven["last_error"]["code"] == "DISCARDED"  # kept until the next failure
    last = events(owner, lease["id"])[-1]
    assert last["event_type"] == "redriven"
    assert last["actor"] == "ops:alice"
    assert last["details"] == {"previousAttempts": 1, "reason": "fixed the template"}
    assert claim_one(worker, tenant)["id"] == lease["id"]


def test_redrive_leaves_jobs_that_are_not_dead_untouched(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    pending = enqueue(worker, tenant, "pending")
    running_tenant = new_tenant()
    enqueue(worker, running_tenant, "running")
    running = claim_one(worker, running_tenant)
    before = snapshot(owner)
    assert _redrive(worker, ids=[pending["id"], running["id"]]) == []
    assert snapshot(owner) == before


def test_redrive_filters_by_tenant_and_kind_and_stops_at_the_limit(
    worker: Conn, owner: Conn
) -> None:
    tenant_a, tenant_b = new_tenant(), new_tenant()
    a1 = _dead(worker, tenant_a, "a1", kind="charge")
    a2 = _dead(worker, tenant_a, "a2", kind="email")
    b1 = _dead(worker, tenant_b, "b1", kind="charge")
    assert {r["job_id"] for r in _redrive(worker, tenant=tenant_a, kind="charge")} == {a1["id"]}
    assert job(owner, a2["id"])["state"] == "dead"
    assert job(owner, b1["id"])["state"] == "dead"
    assert len(_redrive(worker, limit=1)) == 1
    assert len(_redrive(worker, limit=5)) == 1
    assert _redrive(worker) == []


# Cancel ---------------------------------------------------------------------------------


def test_cancel_ends_pending_and_retry_wait_jobs_with_an_audit_event(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "retrying")
    lease = claim_one(worker, tenant)
    worker.execute("select app.fail_job(%s, %s, %s, %s, %s, interval '1 hour')",
                   (tenant, lease["id"], lease["lease_owner"], lease["lease_token"],
                    Jsonb({"message": "flaky"})))
    pending = enqueue(worker, tenant, "pending")
    cancelled = _cancel(worker, tenant=tenant, reason="customer left")
    assert {r["job_id"] for r in cancelled} == {lease["id"], pending["id"]}
    retrying = job(owner, lease["id"])
    assert retrying["state"] == "cancelled"
    assert retrying["completed_at"] is not None
    last = events(owner, lease["id"])[-1]
    assert last["event_type"] == "cancelled"
    assert last["details"] == {"previousState": "retry_wait", "attempts": 1,
                               "reason": "customer left"}


def test_cancel_refuses_running_and_finished_jobs_and_cancelled_jobs_are_never_claimed(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    ids = enqueue_many(worker, tenant, 3)
    running = claim(worker, tenant, limit=1)[0]
    dead = _dead(worker, new_tenant(), "dead")
    cancelled = _cancel(worker, ids=[*ids, dead["id"]])
    waiting = set(ids) - {running["id"]}
    assert {r["job_id"] for r in cancelled} == waiting
    assert job(owner, running["id"])["state"] == "running"
    assert job(owner, dead["id"])["state"] == "dead"
    assert claim(worker, tenant) == []
    assert event_types(owner, waiting.pop()) == ["created", "cancelled"]


# Prune ----------------------------------------------------------------------------------


def test_prune_deletes_only_finished_jobs_completed_before_the_cutoff_with_their_events(
    worker: Conn, owner: Conn, admin: Conn
) -> None:
    tenant = new_tenant()
    old_dead = _dead(worker, tenant, "old-dead")
    recent_dead = _dead(worker, tenant, "recent-dead")
    old_cancelled = enqueue(worker, tenant, "old-cancelled")
    _cancel(worker, ids=[old_cancelled["id"]])
    old_pending = enqueue(worker, tenant, "old-pending")
    admin.execute("update app.jobs set created_at = created_at - interval '90 days'"
                  " where id = %s", (old_pending["id"],))
    _age_completion(admin, old_dead["id"], 40)
    _age_completion(admin, old_cancelled["id"], 31)
    _age_completion(admin, recent_dead["id"], 29)

    assert _prune(worker, timedelta(days=30)) == {"jobs_deleted": 2, "events_deleted": 5}
    left = {r["id"] for r in owner.execute("select id from app.jobs").fetchall()}
    assert left == {recent_dead["id"], old_pending["id"]}
    orphans = owner.execute(
        "select count(*) as n from app.job_events where job_id = any(%s)",
        ([old_dead["id"], old_cancelled["id"]],)).fetchone()
    assert orphans == {"n": 0}
    assert event_types(owner, recent_dead["id"]) == ["created", "claimed", "dead"]


def test_prune_works_in_bounded_batches(worker: Conn, admin: Conn) -> None:
    tenant = new_tenant()
    for i in range(5):
        lease = _dead(worker, tenant, f"d{i}")
        _age_completion(admin, lease["id"], 10 + i)
    batches = [_prune(worker, timedelta(days=1), limit=2)["jobs_deleted"] for _ in range(4)]
    assert batches == [2, 2, 1, 0]


# Reads ----------------------------------------------------------------------------------


def test_queue_status_counts_per_tenant_and_state_with_the_oldest_ready_age(
    worker: Conn, admin: Conn
) -> None:
    tenant_a, tenant_b = new_tenant(), new_tenant()
    ids = enqueue_many(worker, tenant_a, 3)
    admin.execute("update app.jobs set available_at = clock_timestamp() - interval '10 minutes'"
                  " where id = %s", (ids[0],))
    admin.execute("update app.jobs set available_at = clock_timestamp() + interval '1 hour'"
                  " where id = %s", (ids[2],))
    _dead(worker, tenant_b, "dead")
    rows = worker.execute("select * from app.queue_status(null)").fetchall()
    by_key = {(r["tenant_id"], r["state"]): r for r in rows}
    assert set(by_key) == {(tenant_a, "pending"), (tenant_b, "dead")}
    pending = by_key[(tenant_a, "pending")]
    assert (pending["jobs"], pending["ready_jobs"]) == (3, 2)
    assert timedelta(minutes=10) <= pending["oldest_ready_age"] < timedelta(minutes=11)
    assert timedelta(minutes=59) < pending["next_ready_in"] <= timedelta(hours=1)
    dead = by_key[(tenant_b, "dead")]
    assert (dead["jobs"], dead["ready_jobs"], dead["oldest_ready_age"]) == (1, 0, None)
    only_b = worker.execute("select * from app.queue_status(%s)", (tenant_b,)).fetchall()
    assert [(r["tenant_id"], r["state"]) for r in only_b] == [(tenant_b, "dead")]


def test_get_job_and_timeline_show_the_job_and_its_events_without_lease_tokens(
    worker: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    lease = claim_one(worker, tenant)
    found = worker.execute("select * from app.get_job(%s)", (lease["id"],)).fetchone()
    assert found is not None
    assert found["state"] == "running"
    assert found["lease_owner"] == lease["lease_owner"]
    assert "lease_token" not in found
    timeline = worker.execute("select * from app.job_timeline(%s, 10)",
                              (lease["id"],)).fetchall()
    assert [e["event_type"] for e in timeline] == ["created", "claimed"]
    assert "lease_token" not in timeline[0]
    assert worker.execute("select * from app.get_job(%s)", (uuid.uuid4(),)).fetchall() == []


def test_dead_jobs_lists_the_most_recent_first_with_the_reason_they_died(worker: Conn) -> None:
    tenant = new_tenant()
    first = _dead(worker, tenant, "first")
    second = _dead(worker, tenant, "second", kind="charge")
    _dead(worker, new_tenant(), "elsewhere")
    rows = worker.execute("select * from app.dead_jobs(%s, null, 10)", (tenant,)).fetchall()
    assert [r["id"] for r in rows] == [second["id"], first["id"]]
    assert rows[0]["reason"] == "discarded"
    assert rows[0]["last_error"]["code"] == "DISCARDED"
    by_kind = worker.execute("select id from app.dead_jobs(null, 'charge', 10)").fetchall()
    assert [r["id"] for r in by_kind] == [second["id"]]


# Bounds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("select * from app.redrive_jobs('ops', null, null, null, 0, null)",
         "p_limit must be between 1 and 1000 (got 0)"),
        ("select * from app.redrive_jobs('ops', null, null, null, 1001, null)",
         "p_limit must be between 1 and 1000 (got 1001)"),
        ("select * from app.redrive_jobs('  ', null, null, null, 10, null)",
         "p_actor must be a non-blank text of at most 200 characters"),
        ("select * from app.redrive_jobs('ops', null, '{}', null, 10, null)",
         "number of job ids must be between 1 and 1000 (got 0)"),
        ("select * from app.redrive_jobs('ops', null, array[null]::uuid[], null, 10, null)",
         "p_job_ids must not contain NULL"),
        ("select * from app.cancel_jobs('ops', null, null, ' ', 10, null)",
         "p_kind must be a non-blank text of at most 128 characters"),
        ("select * from app.cancel_jobs('ops', null, null, null, 10, repeat('x', 501))",
         "p_reason must be at most 500 characters (got 501)"),
        ("select * from app.cancel_jobs(null, null, null, null, 10, null)",
         "p_actor must be a non-blank text"),
        ("select * from app.prune_jobs(interval '-1 second', 10)",
         "p_older_than must be between 00:00:00 and 3650 days"),
        ("select * from app.prune_jobs(null, 10)", "p_older_than must be between"),
        ("select * from app.prune_jobs(interval '1 day', 10001)",
         "p_limit must be between 1 and 10000 (got 10001)"),
        ("select * from app.job_timeline(gen_random_uuid(), 0)",
         "p_limit must be between 1 and 10000 (got 0)"),
        ("select * from app.get_job(null)", "p_job_id is required"),
        ("select * from app.dead_jobs(null, null, 1001)",
         "p_limit must be between 1 and 1000 (got 1001)"),
    ],
)
def test_operator_functions_refuse_arguments_out_of_bounds_with_22023(
    worker: Conn, owner: Conn, call: str, message: str
) -> None:
    _dead(worker, new_tenant(), "dead")
    before = snapshot(owner)
    with raises_sqlstate("22023", message):
        worker.execute(call.encode())
    assert snapshot(owner) == before


@pytest.mark.parametrize("kind", ["\t", "\u200b", " \u3000\n", "\ufeff\u2060"],
                         ids=["tab", "zero-width-space", "ideographic-space", "bom-and-joiner"])
@pytest.mark.parametrize(
    "call",
    ["select * from app.redrive_jobs('ops', null, null, %s, 10, null)",
     "select * from app.cancel_jobs('ops', null, null, %s, 10, null)",
     "select * from app.dead_jobs(null, %s, 10)"],
    ids=["redrive_jobs", "cancel_jobs", "dead_jobs"],
)
def test_a_kind_filter_of_invisible_characters_only_is_refused_with_22023(
    worker: Conn, owner: Conn, call: str, kind: str
) -> None:
    """A tab-only filter matched no job and said nothing: the operator learned that no
    job of "that kind" was dead, a wrong answer to the question asked."""
    _dead(worker, new_tenant(), "dead")
    enqueue(worker, new_tenant(), "pending")
    before = snapshot(owner)
    with raises_sqlstate("22023", "p_kind must be a non-blank text of at most 128 characters"):
        worker.execute(call.encode(), (kind,))
    assert snapshot(owner) == before


# Privileges -----------------------------------------------------------------------------


@pytest.fixture
def outsider(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.OUTSIDER) as conn:
        yield conn


@pytest.mark.parametrize("name", sorted(OPERATOR_CALLS))
def test_only_operators_and_the_all_duty_login_may_call_the_operator_functions(
    name: str, db: Database, worker: Conn, reader: Conn, outsider: Conn
) -> None:
    worker.execute(OPERATOR_CALLS[name].encode()).fetchall()
    with db.connect(postgres.OPERATOR) as operator:
        operator.execute(OPERATOR_CALLS[name].encode()).fetchall()
    with db.connect(postgres.PRODUCER) as producer, \
            db.connect(postgres.DUTY_WORKER) as duty_worker, \
            db.connect(postgres.REAPER) as reaper:
        for refused in (reader, outsider, producer, duty_worker, reaper):
            with raises_sqlstate("42501"):
                refused.execute(OPERATOR_CALLS[name].encode())


def test_the_operator_functions_run_as_the_owner_searching_pg_catalog_before_pg_temp(
    owner: Conn,
) -> None:
    rows = owner.execute(
        "select proname, prosecdef, proconfig from pg_proc"
        " where pronamespace = 'app'::regnamespace and proname = any(%s)",
        (list(OPERATOR_CALLS),),
    ).fetchall()
    assert {r["proname"] for r in rows} == set(OPERATOR_CALLS)
    for row in rows:
        assert row["prosecdef"], row["proname"]
        assert row["proconfig"] == ["search_path=pg_catalog, pg_temp"], row["proname"]
