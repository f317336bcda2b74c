"""Contract of app.release_expired_jobs (one tenant) and app.release_all_expired_jobs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.sql.calls import (
    claim,
    claim_one,
    enqueue,
    enqueue_many,
    event_insert_statements,
    events,
    expire_lease,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support.postgres import Conn


def _release(conn: Conn, tenant: uuid.UUID | None, limit: int | None = 100) -> int:
    row = conn.execute(
        "select app.release_expired_jobs(%s, %s) as n", (tenant, limit)
    ).fetchone()
    assert row is not None
    return int(row["n"])


def _release_all(conn: Conn, limit: int | None = 1000) -> int:
    row = conn.execute("select app.release_all_expired_jobs(%s) as n", (limit,)).fetchone()
    assert row is not None
    return int(row["n"])


def _crashed(worker: Conn, owner: Conn, tenant: uuid.UUID, key: str, **kw: Any) -> dict[str, Any]:
    """A job whose worker died: claimed, then its lease ran out."""
    enqueue(worker, tenant, key, **kw)
    lease = claim_one(worker, tenant, owner=f"crashed-{key}")
    expire_lease(owner, lease["id"])
    return lease


def test_expired_lease_goes_back_to_retry_wait_with_a_lease_expired_event(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    lease = _crashed(worker, owner, tenant, "a")
    before = datetime.now(UTC)

    assert _release(worker, tenant) == 1

    row = job(owner, lease["id"])
    assert row["state"] == "retry_wait"
    assert before - timedelta(seconds=1) <= row["available_at"] <= datetime.now(UTC)
    assert (row["lease_owner"], row["lease_token"], row["lease_expires_at"]) == (None,) * 3
    assert row["last_error"] == {
        "code": "LEASE_EXPIRED", "retryable": True, "leaseOwner": "crashed-a"
    }
    audit = events(owner, lease["id"])
    assert [e["event_type"] for e in audit] == ["created", "claimed", "lease_expired"]
    expired = audit[-1]
    assert expired["actor"] == "watchdog"
    assert expired["lease_token"] == lease["lease_token"]
    assert expired["details"]["leaseOwner"] == "crashed-a"
    assert expired["details"]["recoveredState"] == "retry_wait"
    # The job runs again under a new lease.
    again = claim_one(worker, tenant)
    assert (again["id"], again["attempts"]) == (lease["id"], 2)


def test_expired_lease_at_max_attempts_makes_the_job_dead(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    lease = _crashed(worker, owner, tenant, "last", max_attempts=1)

    assert _release(worker, tenant) == 1

    row = job(owner, lease["id"])
    assert row["state"] == "dead"
    assert row["completed_at"] is not None
    assert row["last_error"]["retryable"] is False
    audit = events(owner, lease["id"])
    assert [e["event_type"] for e in audit] == ["created", "claimed", "dead"]
    assert audit[-1]["lease_token"] == lease["lease_token"]
    assert audit[-1]["details"]["leaseOwner"] == "crashed-last"
    assert audit[-1]["details"]["reason"] == "lease_expired_at_max_attempts"
    assert claim(worker, tenant) == []


def test_live_leases_and_other_tenants_are_left_alone(worker: Conn, owner: Conn) -> None:
    mine, theirs = new_tenant(), new_tenant()
    expired = _crashed(worker, owner, mine, "expired")
    enqueue(worker, mine, "live")
    live = claim_one(worker, mine)
    other = _crashed(worker, owner, theirs, "theirs")

    assert _release(worker, mine) == 1

    assert job(owner, expired["id"])["state"] == "retry_wait"
    assert job(owner, live["id"])["state"] == "running"
    assert job(owner, other["id"])["state"] == "running"


def test_release_all_recovers_expired_leases_of_every_tenant(worker: Conn, owner: Conn) -> None:
    """Reference defect 15: the reaper could only work one known tenant at a time."""
    tenants = [new_tenant() for _ in range(3)]
    crashed = [_crashed(worker, owner, t, f"k{i}") for i, t in enumerate(tenants)]
    enqueue(worker, tenants[0], "live")
    live = claim_one(worker, tenants[0])

    assert _release_all(worker) == 3

    assert {job(owner, c["id"])["state"] for c in crashed} == {"retry_wait"}
    assert job(owner, live["id"])["state"] == "running"
    assert _release_all(worker) == 0


def test_release_takes_the_oldest_expiry_first_and_honours_the_limit(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 5)
    leases = claim(worker, tenant, limit=5)
    # Expiries 50, 40, 30, 20, 10 seconds ago.
    for age, lease in zip((50, 40, 30, 20, 10), leases, strict=True):
        owner.execute(
            "update app.leases set expires_at = clock_timestamp() - make_interval(secs => %s)"
            " where job_id = %s",
            (age, lease["id"]),
        )

    assert _release(worker, tenant, 2) == 2
    assert _release_all(worker, 1) == 1

    states = [job(owner, lease["id"])["state"] for lease in leases]
    assert states == ["retry_wait", "retry_wait", "retry_wait", "running", "running"]


@pytest.mark.parametrize("limit", [None, 0, -1, 1001])
def test_release_limit_outside_1_to_1000_raises_22023(
    worker: Conn, owner: Conn, limit: int | None
) -> None:
    """Reference defect 14: a NULL limit released everything, negatives depended on data."""
    tenant = new_tenant()
    _crashed(worker, owner, tenant, "a")
    before = snapshot(owner)
    with raises_sqlstate("22023", match="p_limit must be between 1 and 1000"):
        _release(worker, tenant, limit)
    assert snapshot(owner) == before


def test_release_without_tenant_raises_22023_instead_of_returning_zero(
    worker: Conn, owner: Conn
) -> None:
    """Reference defect 14: a NULL tenant silently returned 0."""
    _crashed(worker, owner, new_tenant(), "a")
    with raises_sqlstate("22023", match="p_tenant_id is required"):
        _release(worker, None)


@pytest.mark.parametrize("limit", [None, 0, -5, 10001])
def test_release_all_limit_outside_1_to_10000_raises_22023(
    worker: Conn, owner: Conn, limit: int | None
) -> None:
    _crashed(worker, owner, new_tenant(), "a")
    before = snapshot(owner)
    with raises_sqlstate("22023", match="p_limit must be between 1 and 10000"):
        _release_all(worker, limit)
    assert snapshot(owner) == before


def test_release_writes_all_its_events_with_one_insert_statement(
    worker: Conn, owner: Conn, admin: Conn
) -> None:
    """Reference defect 18: events were inserted one row at a time inside the loop."""
    tenants = [new_tenant() for _ in range(2)]
    for t in tenants:
        enqueue_many(worker, t, 3)
        for lease in claim(worker, t, limit=3):
            expire_lease(owner, lease["id"])
    owner.execute("update app.jobs set max_attempts = 1 where tenant_id = %s", (tenants[0],))

    with event_insert_statements(admin, worker) as statements:
        assert _release(worker, tenants[0]) == 3
        assert _release_all(worker) == 3

    assert statements == [3, 3]
    kinds = owner.execute(
        "select event_type, count(*) as n, count(distinct created_at) as instants"
        " from app.job_events where event_type in ('dead', 'lease_expired')"
        " group by event_type order by event_type"
    ).fetchall()
    assert kinds == [
        {"event_type": "dead", "n": 3, "instants": 1},
        {"event_type": "lease_expired", "n": 3, "instants": 1},
    ]
