"""The fair claim serves tenants by turn (app.tenant_turns, sql/README.md).

What it must keep: a claim reads nothing of tenants whose work is all in the future;
every tenant with a ready job is served round robin, whatever the number of tenants; a
claim that finds a tenant without work never clears its turn while a producer's job is
still uncommitted (both orders forced below); and a lost turn is rebuilt by the repair
sweep, so a defect can delay a job but not lose it.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import (
    WORKER_NAME,
    claim_one,
    enqueue,
    expire_lease,
    new_tenant,
)
from tests.support import postgres
from tests.support.postgres import Conn

LAST_TENANT = uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff")


def numbered_tenant(n: int) -> uuid.UUID:
    """Tenants that sort before any random one (and before LAST_TENANT)."""
    return uuid.UUID(int=n + 1)


def enqueue_for(conn: Conn, tenants: list[uuid.UUID], *, per_tenant: int = 1,
                available_at: datetime | None = None, prefix: str = "job") -> None:
    """``per_tenant`` jobs for every tenant, enqueued 1,000 per call."""
    items = [(t, f"{prefix}-{i}") for i in range(per_tenant) for t in tenants]
    for start in range(0, len(items), 1000):
        chunk = items[start:start + 1000]
        conn.execute(
            "select 1 from app.enqueue_jobs(%s, %s, %s, %s, %s)",
            ([t for t, _ in chunk], [k for _, k in chunk], ["fair.test"] * len(chunk),
             [Jsonb({"k": k}) for _, k in chunk], [available_at] * len(chunk)),
        )


def claim_ready(conn: Conn, limit: int = 10) -> list[dict[str, Any]]:
    return conn.execute(
        "select id, tenant_id, lease_token from app.claim_ready_jobs(%s, %s)",
        (WORKER_NAME, limit),
    ).fetchall()


def turn_of(owner: Conn, tenant: uuid.UUID) -> dict[str, Any] | None:
    return owner.execute(
        "select turn_at from app.tenant_turns where tenant_id = %s", (tenant,)
    ).fetchone()


# Served whatever the number of tenants ---------------------------------------------------


def test_a_tenant_sorting_after_10000_busy_tenants_is_claimed_within_the_round_robin_bound(
    worker: Conn,
) -> None:
    """Issue: tenants after the first 10,000 in tenant_id order were never served."""
    busy = [numbered_tenant(n) for n in range(10_000)]
    enqueue_for(worker, busy, per_tenant=2)  # each stays busy for two rounds
    enqueue(worker, LAST_TENANT, "waiting")
    limit = 100
    bound = math.ceil((len(busy) + 1) / limit)  # every due tenant once: 101 claims

    served_in: int | None = None
    for n in range(1, bound + 1):
        batch = claim_ready(worker, limit)
        assert len(batch) == limit
        if LAST_TENANT in {r["tenant_id"] for r in batch}:
            served_in = n
            break
    assert served_in is not None, f"{LAST_TENANT} was not claimed within {bound} claims"


def test_tenants_beyond_one_batch_take_turns_and_each_is_served_once_per_round(
    worker: Conn,
) -> None:
    tenants = [new_tenant() for _ in range(25)]
    enqueue_for(worker, tenants, per_tenant=4)

    first_round = [r["tenant_id"] for _ in range(3) for r in claim_ready(worker, 10)]

    # 25 tenants, batches of 10: three claims serve every tenant (the third batch's
    # room left after five tenants is refilled from them).
    assert set(first_round) == set(tenants)


# Cost: tenants whose work is all in the future are never read -----------------------------


def _app_reads(conn: Conn) -> dict[str, int]:
    """Index entries and sequential scans of app's tables in this transaction so far."""
    rows = conn.execute(
        "select c.relname::text as name, pg_stat_get_xact_tuples_returned(c.oid) as n"
        " from pg_class c where c.relnamespace = 'app'::regnamespace and c.relkind = 'i'"
        " union all"
        " select 'seq_scan ' || relname, seq_scan from pg_stat_xact_user_tables"
        " where schemaname = 'app'"
    ).fetchall()
    return {r["name"]: r["n"] for r in rows}


@pytest.mark.parametrize(
    ("call", "expected_rows"),
    [
        ("select id from app.claim_ready_jobs('w', 10)", 10),
        ("select tenant_id from app.ready_tenants(10000)", 3),
        ("select app.oldest_ready_at() as at", 1),
    ],
    ids=["claim_ready_jobs", "ready_tenants", "oldest_ready_at"],
)
def test_tenants_whose_jobs_are_all_due_later_cost_nothing(
    worker: Conn, owner: Conn, call: Any, expected_rows: int
) -> None:
    """Issue: each claim read every tenant with a pending job, due now or next month."""
    enqueue_for(worker, [new_tenant() for _ in range(3)], per_tenant=5)
    enqueue_for(worker, [new_tenant() for _ in range(3_000)],
                available_at=datetime.now(UTC) + timedelta(days=30), prefix="later")

    owner.execute("analyze app.jobs, app.tenant_turns")  # as autovacuum would

    with worker.transaction():
        before = _app_reads(worker)
        rows = worker.execute(call).fetchall()
        after = _app_reads(worker)

    assert len(rows) == expected_rows
    read = {name: after.get(name, 0) - n for name, n in before.items()}
    assert {name: n for name, n in read.items() if name.startswith("seq_scan") and n} == {}
    # A few entries per ready tenant and per claimed job; 3,000 tenants would be 3,000.
    assert sum(read.values()) < 150, read


# Every path that makes a job claimable wakes its tenant ----------------------------------


def _enqueued(worker: Conn, owner: Conn, admin: Conn, tenant: uuid.UUID, held: Any) -> None:
    enqueue(worker, tenant, "new")


def _retried(worker: Conn, owner: Conn, admin: Conn, tenant: uuid.UUID, held: Any) -> None:
    worker.execute("select app.fail_job(%s, %s, %s, %s, '{}', interval '0 seconds')",
                   (tenant, held["id"], WORKER_NAME, held["lease_token"]))


def _lease_expired(worker: Conn, owner: Conn, admin: Conn, tenant: uuid.UUID,
                   held: Any) -> None:
    expire_lease(admin, held["id"])
    worker.execute("select app.release_expired_jobs(%s, 10)", (tenant,))


def _reaped(worker: Conn, owner: Conn, admin: Conn, tenant: uuid.UUID, held: Any) -> None:
    expire_lease(admin, held["id"])
    worker.execute("select app.release_all_expired_jobs(10)")


def _given_back(worker: Conn, owner: Conn, admin: Conn, tenant: uuid.UUID, held: Any) -> None:
    worker.execute("select * from app.release_jobs(%s, %s, %s, %s)",
                   (WORKER_NAME, [tenant], [held["id"]], [held["lease_token"]]))


def _redriven(worker: Conn, owner: Conn, admin: Conn, tenant: uuid.UUID, held: Any) -> None:
    worker.execute("select app.discard_job(%s, %s, %s, %s, '{}')",
                   (tenant, held["id"], WORKER_NAME, held["lease_token"]))
    worker.execute("select * from app.redrive_jobs('operator', %s)", (tenant,))


#: Every path that makes a job claimable, as ``make_claimable(worker, owner, admin,
#: tenant, held)``: the tests of both turn tables (tenants here, kinds in
#: test_claim_by_kind.py) run through all of them.
every_path_to_claimable = pytest.mark.parametrize(
    "make_claimable",
    [_enqueued, _retried, _lease_expired, _reaped, _given_back, _redriven],
    ids=["enqueue", "retry", "release_expired", "release_all_expired", "release_jobs",
         "redrive"],
)


@every_path_to_claimable
def test_a_tenant_without_a_turn_gets_one_when_a_job_becomes_claimable(
    worker: Conn, owner: Conn, admin: Conn,
    make_claimable: Callable[[Conn, Conn, Conn, uuid.UUID, Any], None],
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "first")
    (held,) = claim_ready(worker)
    assert turn_of(owner, tenant) == {"turn_at": None}  # nothing left: no turn

    make_claimable(worker, owner, admin, tenant, held)

    assert [r["tenant_id"] for r in claim_ready(worker)] == [tenant]


def test_a_busy_tenants_producers_do_not_write_its_turn(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "first")
    before = owner.execute(
        "select xmin::text as version, turn_at from app.tenant_turns where tenant_id = %s",
        (tenant,)).fetchone()

    for n in range(5):
        enqueue(worker, tenant, f"more-{n}")

    after = owner.execute(
        "select xmin::text as version, turn_at from app.tenant_turns where tenant_id = %s",
        (tenant,)).fetchone()
    assert after == before


def test_a_job_due_later_gives_a_turn_due_then_and_is_claimed_once_due(
    worker: Conn, owner: Conn, admin: Conn,
) -> None:
    tenant = new_tenant()
    later = datetime.now(UTC) + timedelta(hours=1)
    job = enqueue(worker, tenant, "later", available_at=later)
    turn = turn_of(owner, tenant)
    assert turn is not None
    assert turn["turn_at"] == job["available_at"]
    assert claim_ready(worker) == []

    admin.execute("update app.jobs set available_at = clock_timestamp() where id = %s",
                  (job["id"],))
    admin.execute("update app.tenant_turns set turn_at = clock_timestamp()"
                  " where tenant_id = %s", (tenant,))  # the clock moved on

    assert [r["id"] for r in claim_ready(worker)] == [job["id"]]
    assert turn_of(owner, tenant) == {"turn_at": None}


def test_a_turn_left_behind_by_claim_jobs_costs_no_slot_of_the_batch(worker: Conn) -> None:
    """claim_jobs (one tenant) does not touch turns; the fair claim fixes a stale one."""
    stale, ready = new_tenant(), [new_tenant() for _ in range(2)]
    enqueue(worker, stale, "taken-directly")
    claim_one(worker, stale)
    enqueue_for(worker, ready, per_tenant=1)

    batch = claim_ready(worker, 2)

    assert sorted(r["tenant_id"] for r in batch) == sorted(ready)


# The lost wake-up race -------------------------------------------------------------------


def _produce_enqueue(conn: Conn, tenant: uuid.UUID, held: Any) -> None:
    enqueue(conn, tenant, "second")


def _produce_retry(conn: Conn, tenant: uuid.UUID, held: Any) -> None:
    conn.execute("select app.fail_job(%s, %s, %s, %s, '{}', interval '0 seconds')",
                 (tenant, held["id"], WORKER_NAME, held["lease_token"]))


@pytest.mark.parametrize("produce", [_produce_enqueue, _produce_retry],
                         ids=["enqueue", "retry"])
def test_a_claim_keeps_the_turn_of_a_tenant_whose_producer_has_not_committed(
    db: Database, worker: Conn, produce: Callable[[Conn, uuid.UUID, Any], None],
) -> None:
    """Producer first: its job is invisible to the claim, so the claim must not clear."""
    tenant = new_tenant()
    enqueue(worker, tenant, "held")
    held = claim_one(worker, tenant)
    first = enqueue(worker, tenant, "first")

    with db.connect(postgres.WORKER) as producer, producer.transaction():
        produce(producer, tenant, held)
        # The claim takes "first", then finds no other ready job it can see.
        assert [r["id"] for r in claim_ready(worker)] == [first["id"]]
    # The producer has committed.

    batch = claim_ready(worker)
    assert len(batch) == 1
    assert batch[0]["tenant_id"] == tenant


def _waiting_for_an_advisory_lock(admin: Conn, pid: int) -> bool:
    row = admin.execute(
        "select count(*) as n from pg_locks"
        " where pid = %s and locktype = 'advisory' and not granted", (pid,)).fetchone()
    return bool(row and row["n"])


def test_a_producer_waits_for_a_claim_clearing_its_tenants_turn_then_restores_the_turn(
    db: Database, worker: Conn, admin: Conn,
) -> None:
    """Claim first: it cleared the turn but has not committed; the producer must not
    read the old turn and skip its write."""
    tenant = new_tenant()
    enqueue(worker, tenant, "first")
    produced: list[BaseException | None] = []

    with db.connect(postgres.WORKER) as claimer, db.connect(postgres.WORKER) as producer:
        producer_pid = producer.info.backend_pid

        def produce() -> None:
            try:
                enqueue(producer, tenant, "second")
                produced.append(None)
            except BaseException as exc:  # reported by the assertion below
                produced.append(exc)

        with claimer.transaction():
            assert len(claim_ready(claimer)) == 1  # "first"; the tenant has nothing left
            thread = threading.Thread(target=produce)
            thread.start()
            deadline = time.monotonic() + 10
            while (thread.is_alive() and time.monotonic() < deadline
                   and not _waiting_for_an_advisory_lock(admin, producer_pid)):
                time.sleep(0.01)
        thread.join(timeout=30)

    assert produced == [None]
    batch = claim_ready(worker)
    assert [r["tenant_id"] for r in batch] == [tenant]


# Repair -----------------------------------------------------------------------------------


def repair(conn: Conn, limit: int) -> tuple[int, int]:
    row = conn.execute(
        "select tenants_checked, turns_repaired from app.repair_tenant_turns(%s)", (limit,)
    ).fetchone()
    assert row is not None
    return row["tenants_checked"], row["turns_repaired"]


def test_repair_gives_back_a_lost_turn_so_the_job_is_delayed_not_lost(
    worker: Conn, owner: Conn,
) -> None:
    tenant = new_tenant()
    job = enqueue(worker, tenant, "a")
    owner.execute("delete from app.tenant_turns where tenant_id = %s", (tenant,))  # a defect
    assert claim_ready(worker) == []

    assert repair(worker, 100) == (1, 1)

    assert [r["id"] for r in claim_ready(worker)] == [job["id"]]


def test_repair_sweeps_every_tenant_in_pages_and_then_starts_over(
    worker: Conn, owner: Conn,
) -> None:
    tenants = sorted(new_tenant() for _ in range(5))
    enqueue_for(worker, tenants)
    owner.execute("update app.tenant_turns set turn_at = null")
    owner.execute("delete from app.tenant_turns where tenant_id = %s", (tenants[0],))

    assert [repair(worker, 2) for _ in range(4)] == [(2, 2), (2, 2), (1, 1), (2, 0)]

    turns = owner.execute("select count(*) as n from app.tenant_turns"
                          " where turn_at <= clock_timestamp()").fetchone()
    assert turns == {"n": 5}
    assert len(claim_ready(worker)) == 5


def test_repair_leaves_a_round_robin_turn_alone(worker: Conn, owner: Conn) -> None:
    """A served tenant's turn is later than its oldest ready job by design."""
    tenants = [new_tenant() for _ in range(3)]
    enqueue_for(worker, tenants, per_tenant=3)
    claim_ready(worker, 2)  # two of three served: their turns move to now
    before = owner.execute("select * from app.tenant_turns order by tenant_id").fetchall()

    assert repair(worker, 100) == (3, 0)

    assert owner.execute("select * from app.tenant_turns order by tenant_id").fetchall() == before


@pytest.mark.parametrize("limit", [None, 0, 10001])
def test_repair_limit_outside_1_to_10000_raises_22023(worker: Conn, limit: int | None) -> None:
    from tests.sql.calls import raises_sqlstate

    with raises_sqlstate("22023", match="p_limit must be between 1 and 10000"):
        repair(worker, limit)  # type: ignore[arg-type]


# Oldest ready job ---------------------------------------------------------------------------


def test_oldest_ready_at_sees_a_tenant_after_10000_others(worker: Conn, owner: Conn) -> None:
    """Issue: the oldest-ready metric read only the first 10,000 tenants."""
    enqueue_for(worker, [numbered_tenant(n) for n in range(10_000)])
    enqueue(worker, new_tenant(), "later", available_at=datetime.now(UTC) + timedelta(days=1))
    oldest = enqueue(worker, LAST_TENANT, "day-old")
    owner.execute("update app.jobs set available_at = available_at - interval '1 day'"
                  " where id = %s", (oldest["id"],))

    row = worker.execute("select app.oldest_ready_at() as at").fetchone()

    assert row == {"at": oldest["available_at"] - timedelta(days=1)}


def test_oldest_ready_at_is_null_when_nothing_is_ready(worker: Conn) -> None:
    enqueue(worker, new_tenant(), "later", available_at=datetime.now(UTC) + timedelta(hours=1))
    assert worker.execute("select app.oldest_ready_at() as at").fetchone() == {"at": None}
