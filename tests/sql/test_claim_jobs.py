"""Contract of app.claim_jobs, app.claim_ready_jobs, app.ready_tenants and app.renew_job_lease."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import Database
from tests.sql.calls import (
    WORKER_NAME,
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
from tests.support import postgres
from tests.support.postgres import Conn


def test_claim_takes_oldest_available_first_then_created_then_id(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    ids = enqueue_many(worker, tenant, 4)
    # Reorder availability: job 2 became available first, then 0, then 3; 1 is later.
    for job_id, seconds_ago in zip(ids, (20, -3600, 30, 10), strict=True):
        owner.execute(
            "update app.jobs set available_at = clock_timestamp() - make_interval(secs => %s)"
            " where id = %s",
            (seconds_ago, job_id),
        )

    claimed = claim(worker, tenant, limit=10)

    assert [r["id"] for r in claimed] == [ids[2], ids[0], ids[3]]


def test_claimed_job_gets_attempt_fresh_token_lease_and_one_claimed_event(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    created = enqueue(worker, tenant, "a")
    before = datetime.now(UTC)

    row = claim_one(worker, tenant, owner="w-7")

    assert row["id"] == created["id"]
    assert row["state"] == "running"
    assert row["attempts"] == 1
    assert row["lease_owner"] == "w-7"
    assert isinstance(row["lease_token"], uuid.UUID)
    lease_left = row["lease_expires_at"] - before
    assert timedelta(seconds=25) < lease_left < timedelta(seconds=40)
    audit = events(owner, row["id"])
    assert [e["event_type"] for e in audit] == ["created", "claimed"]
    claimed = audit[1]
    assert claimed["actor"] == "w-7"
    assert claimed["lease_token"] == row["lease_token"]
    assert "leaseToken" not in claimed["details"]
    assert claimed["details"]["attempt"] == 1


def test_every_claim_issues_a_new_token(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    first = claim_one(worker, tenant)
    expire_lease(owner, first["id"])
    worker.execute("select app.release_expired_jobs(%s)", (tenant,))

    second = claim_one(worker, tenant)

    assert second["id"] == first["id"]
    assert second["attempts"] == 2
    assert second["lease_token"] != first["lease_token"]


def test_claim_ignores_future_running_and_finished_jobs(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "later", available_at=datetime.now(UTC) + timedelta(hours=1))
    enqueue(worker, tenant, "running")
    claim_one(worker, tenant)

    assert claim(worker, tenant) == []


def test_claim_only_sees_the_requested_tenant(worker: Conn) -> None:
    mine, theirs = new_tenant(), new_tenant()
    enqueue(worker, theirs, "theirs")
    enqueue(worker, mine, "mine")

    rows = claim(worker, mine, limit=100)

    assert [(r["tenant_id"], r["operation_key"]) for r in rows] == [(mine, "mine")]


def test_concurrent_claimers_skip_locked_rows_instead_of_waiting(
    worker: Conn, db: Database
) -> None:
    tenant = new_tenant()
    ids = sorted(enqueue_many(worker, tenant, 3))  # same timestamps: id decides
    with db.connect(postgres.WORKER) as other:
        other.execute("set lock_timeout = '2s'")  # waiting would fail with 55P03
        with worker.transaction():
            held = claim(worker, tenant, owner="a", limit=1)
            rest = claim(other, tenant, owner="b", limit=10)
        assert [r["id"] for r in held] == [ids[0]]
        assert [r["id"] for r in rest] == ids[1:]


@pytest.mark.parametrize("limit", [None, 0, -1, 101])
def test_claim_limit_outside_1_to_100_raises_22023(
    worker: Conn, owner: Conn, limit: int | None
) -> None:
    """Reference defect 11: a NULL limit claimed the whole tenant."""
    tenant = new_tenant()
    enqueue_many(worker, tenant, 3)
    before = snapshot(owner)
    with raises_sqlstate("22023", match="p_limit must be between 1 and 100"):
        claim(worker, tenant, limit=limit)
    assert snapshot(owner) == before


@pytest.mark.parametrize(
    "lease",
    [None, timedelta(0), timedelta(seconds=-30), timedelta(milliseconds=999),
     timedelta(days=1, seconds=1), timedelta(days=36500)],
    ids=["null", "zero", "negative", "under-1s", "over-1-day", "100-years"],
)
def test_claim_lease_outside_1_second_to_1_day_raises_22023(
    worker: Conn, owner: Conn, lease: timedelta | None
) -> None:
    """Reference defect 11: a NULL lease gave 23514 and 100 years was accepted."""
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    before = snapshot(owner)
    with raises_sqlstate("22023", match="p_lease must be between 00:00:01 and 1 day"):
        claim(worker, tenant, lease=lease)
    assert snapshot(owner) == before


@pytest.mark.parametrize("lease", [timedelta(seconds=1), timedelta(days=1)])
def test_claim_lease_at_the_bounds_is_accepted(worker: Conn, lease: timedelta) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    assert len(claim(worker, tenant, lease=lease)) == 1


@pytest.mark.parametrize("owner_name", [None, "", "   ", "\t\n", "\u200b", "\u3000\ufeff",
                                        "w" * 201])
def test_claim_without_a_usable_owner_raises_22023(worker: Conn, owner_name: str | None) -> None:
    with raises_sqlstate("22023", match="p_owner must be a non-blank text"):
        worker.execute(
            "select * from app.claim_jobs(%s, %s)", (new_tenant(), owner_name)
        )


def test_claim_without_tenant_raises_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="p_tenant_id is required"):
        worker.execute("select * from app.claim_jobs(null, 'w')")


# Fair claim across tenants ---------------------------------------------------------------


def test_quiet_tenant_job_is_in_the_first_batch_despite_a_noisy_backlog(
    worker: Conn, owner: Conn
) -> None:
    noisy, quiet = new_tenant(), new_tenant()
    enqueue_many(worker, noisy, 300)
    quiet_job = enqueue(worker, quiet, "only-one")

    batch = worker.execute(
        "select * from app.claim_ready_jobs(%s, %s, %s)", ("w", 10, timedelta(seconds=30))
    ).fetchall()

    assert len(batch) == 10
    assert quiet_job["id"] in {r["id"] for r in batch}
    assert sum(r["tenant_id"] == noisy for r in batch) == 9
    claimed_events = owner.execute(
        "select count(*) as n from app.job_events where event_type = 'claimed'"
    ).fetchone()
    assert claimed_events == {"n": 10}


def test_every_ready_tenant_gets_a_share_and_unused_shares_are_refilled(worker: Conn) -> None:
    tenants = [new_tenant() for _ in range(3)]
    enqueue_many(worker, tenants[0], 1)
    enqueue_many(worker, tenants[1], 20)
    enqueue_many(worker, tenants[2], 20)

    batch = worker.execute("select * from app.claim_ready_jobs('w', 10)").fetchall()

    per_tenant = {t: sum(r["tenant_id"] == t for r in batch) for t in tenants}
    assert len(batch) == 10
    assert per_tenant[tenants[0]] == 1
    assert per_tenant[tenants[1]] >= 4
    assert per_tenant[tenants[2]] >= 4


def test_claim_ready_jobs_claims_nothing_when_nothing_is_ready(worker: Conn) -> None:
    enqueue(worker, new_tenant(), "later", available_at=datetime.now(UTC) + timedelta(minutes=5))
    assert worker.execute("select * from app.claim_ready_jobs('w')").fetchall() == []


@pytest.mark.parametrize(
    ("limit", "lease", "message"),
    [
        (None, timedelta(seconds=30), "p_limit must be between 1 and 100"),
        (0, timedelta(seconds=30), "p_limit must be between 1 and 100"),
        (101, timedelta(seconds=30), "p_limit must be between 1 and 100"),
        (10, None, "p_lease must be between"),
        (10, timedelta(seconds=-1), "p_lease must be between"),
        (10, timedelta(days=2), "p_lease must be between"),
    ],
)
def test_claim_ready_jobs_bounds_raise_22023(
    worker: Conn, limit: int | None, lease: timedelta | None, message: str
) -> None:
    enqueue(worker, new_tenant(), "a")
    with raises_sqlstate("22023", match=message):
        worker.execute("select * from app.claim_ready_jobs('w', %s, %s)", (limit, lease))


def test_ready_tenants_lists_tenants_with_ready_work_and_leaves_out_future_only_ones(
    worker: Conn, owner: Conn
) -> None:
    """Reference defect 15: nothing could list the tenants that have work."""
    ready, future_only, running_only, retrying = (new_tenant() for _ in range(4))
    first = enqueue(worker, ready, "a")
    enqueue(worker, ready, "b")
    enqueue(worker, future_only, "later", available_at=datetime.now(UTC) + timedelta(hours=1))
    enqueue(worker, running_only, "busy")
    claim_one(worker, running_only)
    enqueue(worker, retrying, "r")
    retry = claim_one(worker, retrying)
    worker.execute(
        "select app.fail_job(%s, %s, %s, %s, '{}', interval '0 seconds')",
        (retrying, retry["id"], WORKER_NAME, retry["lease_token"]),
    )

    rows = worker.execute("select * from app.ready_tenants()").fetchall()

    assert [r["tenant_id"] for r in rows] == sorted([ready, retrying])
    by_tenant = {r["tenant_id"]: r["oldest_ready_at"] for r in rows}
    assert by_tenant[ready] == first["available_at"]
    assert by_tenant[retrying] == job(owner, retry["id"])["available_at"]


def test_ready_tenants_honours_its_limit(worker: Conn) -> None:
    tenants = sorted(new_tenant() for _ in range(5))
    for t in tenants:
        enqueue(worker, t, "a")
    rows = worker.execute("select tenant_id from app.ready_tenants(2)").fetchall()
    assert [r["tenant_id"] for r in rows] == tenants[:2]


@pytest.mark.parametrize("limit", [None, 0, 10001])
def test_ready_tenants_limit_outside_1_to_10000_raises_22023(
    worker: Conn, limit: int | None
) -> None:
    with raises_sqlstate("22023", match="p_limit must be between 1 and 10000"):
        worker.execute("select * from app.ready_tenants(%s)", (limit,))


# Lease renewal --------------------------------------------------------------------------


def _renew(
    conn: Conn, tenant: uuid.UUID, job_id: uuid.UUID, owner: str, token: uuid.UUID | None,
    lease: timedelta | None = timedelta(seconds=120),
) -> bool:
    row = conn.execute(
        "select app.renew_job_lease(%s, %s, %s, %s, %s) as ok",
        (tenant, job_id, owner, token, lease),
    ).fetchone()
    assert row is not None
    return bool(row["ok"])


def test_renew_extends_a_live_lease_held_by_owner_and_token(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    lease = claim_one(worker, tenant)

    assert _renew(worker, tenant, lease["id"], WORKER_NAME, lease["lease_token"])

    renewed = job(owner, lease["id"])
    assert renewed["lease_expires_at"] > lease["lease_expires_at"] + timedelta(seconds=60)
    assert renewed["lease_token"] == lease["lease_token"]
    assert renewed["attempts"] == 1


def test_renew_is_fenced_by_token_owner_tenant_and_a_live_lease(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    lease = claim_one(worker, tenant)
    before = snapshot(owner)

    assert not _renew(worker, tenant, lease["id"], WORKER_NAME, uuid.uuid4())
    assert not _renew(worker, tenant, lease["id"], "someone-else", lease["lease_token"])
    assert not _renew(worker, new_tenant(), lease["id"], WORKER_NAME, lease["lease_token"])
    assert snapshot(owner) == before

    expire_lease(owner, lease["id"])
    expired = job(owner, lease["id"])["lease_expires_at"]
    assert not _renew(worker, tenant, lease["id"], WORKER_NAME, lease["lease_token"])
    assert job(owner, lease["id"])["lease_expires_at"] == expired


@pytest.mark.parametrize(
    "lease",
    [None, timedelta(seconds=-60), timedelta(0), timedelta(days=1, seconds=1)],
    ids=["null", "negative", "zero", "over-1-day"],
)
def test_renew_lease_outside_bounds_raises_22023_and_never_moves_expiry_into_the_past(
    worker: Conn, owner: Conn, lease: timedelta | None
) -> None:
    """Reference defect 12: a negative lease returned true and expired the lease."""
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    held = claim_one(worker, tenant)

    with raises_sqlstate("22023", match="p_lease must be between 00:00:01 and 1 day"):
        _renew(worker, tenant, held["id"], WORKER_NAME, held["lease_token"], lease)

    after = job(owner, held["id"])
    assert after["lease_expires_at"] == held["lease_expires_at"]
    assert after["lease_expires_at"] > datetime.now(UTC)


def test_renew_without_token_raises_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="p_token is required"):
        _renew(worker, new_tenant(), uuid.uuid4(), WORKER_NAME, None)


def test_claims_write_all_their_events_with_one_insert_statement(
    worker: Conn, admin: Conn
) -> None:
    """Reference defect 18: claimed events were inserted one row at a time in a loop."""
    tenants = [new_tenant() for _ in range(3)]
    for t in tenants:
        enqueue_many(worker, t, 4)

    with event_insert_statements(admin, worker) as statements:
        assert len(claim(worker, tenants[0], limit=4)) == 4
        ready = worker.execute("select * from app.claim_ready_jobs('w', 8)").fetchall()
        assert len(ready) == 8

    assert statements == [4, 8]


@pytest.mark.parametrize("tenant_count", [2, 3, 6, 7, 9, 10])
def test_every_ready_tenant_gets_a_job_into_a_batch_while_they_fit_in_it(
    worker: Conn, tenant_count: int
) -> None:
    tenants = [new_tenant() for _ in range(tenant_count)]
    for t in tenants:  # each with a backlog larger than a batch
        enqueue_many(worker, t, 12)

    batch = worker.execute("select tenant_id from app.claim_ready_jobs('w', 10)").fetchall()

    assert len(batch) == 10
    assert {r["tenant_id"] for r in batch} == set(tenants)
