"""Each queue keeps its own round robin (migration 0027_queue_turns, sql/functions/turns.sql):
a queue's claims read and move only that queue's turns, a tenant idle in one queue stays
due in another, every path that makes a job claimable gives it a turn in its own queue,
and the reaper's repair rebuilds turns per queue.

Producers enqueue, a worker login claims, the owner routes kinds and inspects the turns,
as in production.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import new_tenant
from tests.support import postgres
from tests.support.postgres import Conn

LEASE = timedelta(seconds=30)


def enqueue(conn: Conn, tenant: uuid.UUID, count: int, queue: str | None,
            kind: str = "email.send", prefix: str = "") -> list[dict[str, Any]]:
    keys = [f"{prefix}{queue}-{uuid.uuid4().hex[:8]}-{n}" for n in range(count)]
    return conn.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s, p_queues => %s) order by ord",
        ([tenant] * count, keys, [kind] * count, [Jsonb({"k": k}) for k in keys],
         [queue] * count)).fetchall()


def claim(conn: Conn, queue: str | None, limit: int = 10,
          kinds: list[str] | None = None) -> list[dict[str, Any]]:
    return conn.execute(
        "select * from app.claim_ready_jobs(%s, %s, %s, %s, null, %s)",
        ("worker-1", limit, LEASE, kinds, queue)).fetchall()


def turns(owner: Conn, queue: str) -> dict[uuid.UUID, Any]:
    """The queue's tenants' turns, each with its row version (xmin): a turn a claim did
    not write keeps its version."""
    rows = owner.execute("select tenant_id, turn_at, xmin::text as version"
                         " from app.tenant_turns where queue = %s", (queue,)).fetchall()
    return {r["tenant_id"]: (r["turn_at"], r["version"]) for r in rows}


def kind_turn(owner: Conn, queue: str, tenant: uuid.UUID, kind: str) -> Any:
    row = owner.execute("select turn_at from app.kind_turns"
                        " where queue = %s and tenant_id = %s and kind = %s",
                        (queue, tenant, kind)).fetchone()
    return None if row is None else row["turn_at"]


def test_a_queues_claims_never_read_or_move_another_queues_turns(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    tenants = [new_tenant() for _ in range(12)]
    for tenant in tenants:
        enqueue(producer, tenant, 3, "default")
        enqueue(producer, tenant, 3, "reports")
    before = turns(owner, "default")
    assert set(before) == set(tenants)

    served = [job for _ in range(3) for job in claim(duty_worker, "reports", limit=5)]

    assert {job["tenant_id"] for job in served} <= set(tenants)
    assert len(served) == 15
    assert turns(owner, "default") == before  # neither moved nor rewritten
    assert all(row["queue"] == "reports" for row in owner.execute(
        "select c.queue from app.claimable c join app.leases l using (job_id)").fetchall())


def test_a_tenant_with_nothing_left_in_one_queue_stays_due_in_another(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 1, "reports")
    enqueue(producer, tenant, 4, "default")

    (job,) = claim(duty_worker, "reports")
    assert job["tenant_id"] == tenant
    # Idle in reports: its turn there is settled (nothing claimable: NULL) ...
    assert turns(owner, "reports")[tenant][0] is None
    # ... while its turn in default is still due, and default's claim serves it.
    turn_at, _ = turns(owner, "default")[tenant]
    assert turn_at is not None
    assert len(claim(duty_worker, "default")) == 4


def test_a_busy_queue_does_not_push_a_tenant_back_in_another_queues_round_robin(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    """Tenant A is busy in both queues; B only in default. However often reports' worker
    serves A, A keeps its place ahead of B in default's order."""
    a, b = new_tenant(), new_tenant()
    enqueue(producer, a, 20, "reports")
    enqueue(producer, a, 5, "default")
    enqueue(producer, b, 5, "default")
    a_turn_in_default = turns(owner, "default")[a]
    for _ in range(4):
        assert claim(duty_worker, "reports", limit=5)
    assert turns(owner, "default")[a] == a_turn_in_default

    first = claim(duty_worker, "default", limit=2)
    assert sorted(job["tenant_id"] for job in first) == sorted([a, b])  # both served


def test_a_claim_naming_no_queue_serves_every_queue_but_the_paused_ones(
        producer: Conn, duty_worker: Conn, operator: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 2, "default")
    enqueue(producer, tenant, 2, "reports")
    enqueue(producer, tenant, 2, "pdf")
    operator.execute("select * from app.pause_queue('pdf', 'ada', 'incident')")

    claimed = claim(duty_worker, None, limit=10)

    assert sorted(job["operation_key"].split("-")[0] for job in claimed) == [
        "default", "default", "reports", "reports"]
    assert claim(duty_worker, "pdf") == []


def test_jobs_moved_by_a_route_are_claimable_in_their_new_queue_at_once(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 3, None, kind="report.build")
    assert owner.execute("select app.route_kinds('slow', array['report.build']) as n"
                         ).fetchone() == {"n": 3}

    # No producer wrote to 'slow' and no repair ran: the move itself gave the turn.
    assert turns(owner, "slow")[tenant][0] is not None
    assert kind_turn(owner, "slow", tenant, "report.build") is not None
    assert len(claim(duty_worker, "slow")) == 3


def test_a_retry_gives_its_tenant_a_turn_in_its_own_queue_only(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 1, "reports")
    (job,) = claim(duty_worker, "reports")
    assert turns(owner, "reports")[tenant][0] is None
    default_before = turns(owner, "default").get(tenant)

    state = duty_worker.execute(
        "select app.fail_job(%s, %s, 'worker-1', %s, %s, interval '0 seconds') as state",
        (tenant, job["id"], job["lease_token"], Jsonb({"code": "E"}))).fetchone()

    assert state == {"state": "retry_wait"}
    assert turns(owner, "reports")[tenant][0] is not None
    assert turns(owner, "default").get(tenant) == default_before
    assert [j["id"] for j in claim(duty_worker, "reports")] == [job["id"]]


def test_a_filtered_claim_moves_only_its_queues_kinds_turns(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 1, "reports", kind="pdf.render")
    enqueue(producer, tenant, 1, "default", kind="pdf.render")
    default_turn = kind_turn(owner, "default", tenant, "pdf.render")

    (job,) = claim(duty_worker, "reports", kinds=["pdf.render"])

    assert job["tenant_id"] == tenant
    assert kind_turn(owner, "reports", tenant, "pdf.render") is None  # settled: none left
    assert kind_turn(owner, "default", tenant, "pdf.render") == default_turn
    assert len(claim(duty_worker, "default", kinds=["pdf.render"])) == 1


def test_the_repair_rebuilds_a_missing_turn_in_its_own_queue(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 2, "reports", kind="pdf.render")
    enqueue(producer, tenant, 2, "default")
    owner.execute("delete from app.tenant_turns where queue = 'reports'")  # a defect
    owner.execute("delete from app.kind_turns where queue = 'reports'")
    assert claim(duty_worker, "reports") == []  # no turn: nothing served until repaired

    row = owner.execute("select * from app.repair_tenant_turns(100)").fetchone()

    assert row is not None
    assert row["turns_repaired"] == 2  # the tenant's and its kind's
    assert turns(owner, "reports")[tenant][0] is not None
    assert kind_turn(owner, "reports", tenant, "pdf.render") is not None
    assert len(claim(duty_worker, "reports")) == 2


def test_the_repair_pages_through_queue_and_tenant_pairs_and_wraps(
        producer: Conn, owner: Conn) -> None:
    tenants = [new_tenant() for _ in range(3)]
    for tenant in tenants:
        enqueue(producer, tenant, 1, "default")
        enqueue(producer, tenant, 1, "reports")
    pages = [owner.execute("select * from app.repair_tenant_turns(4)").fetchone()
             for _ in range(3)]
    assert [p["tenants_checked"] for p in pages if p is not None] == [4, 2, 4]


def test_a_paused_queues_turns_are_neither_read_nor_moved_until_it_resumes(
        producer: Conn, duty_worker: Conn, operator: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, 2, "default")
    enqueue(producer, tenant, 2, "pdf")
    operator.execute("select * from app.pause_queue('pdf', 'ada', 'incident')")
    before = turns(owner, "pdf")
    kinds_before = owner.execute("select tenant_id, kind, turn_at, xmin::text as version"
                                 " from app.kind_turns where queue = 'pdf'").fetchall()

    assert len(claim(duty_worker, None)) == 2  # default's only
    assert claim(duty_worker, "pdf") == []
    assert claim(duty_worker, "pdf", kinds=["email.send"]) == []

    assert turns(owner, "pdf") == before
    assert owner.execute("select tenant_id, kind, turn_at, xmin::text as version"
                         " from app.kind_turns where queue = 'pdf'").fetchall() == kinds_before
    operator.execute("select * from app.resume_queue('pdf', 'ada')")
    assert len(claim(duty_worker, None)) == 2


# The lost wake-up race, in a named queue --------------------------------------------------


def _waiting_for_an_advisory_lock(owner: Conn, pid: int) -> bool:
    row = owner.execute(
        "select count(*) as n from pg_locks"
        " where pid = %s and locktype = 'advisory' and not granted", (pid,)).fetchone()
    return bool(row and row["n"])


def test_a_queues_claim_keeps_the_turn_of_a_tenant_whose_producer_has_not_committed(
        db: Database, producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    """Producer first: its job in the queue is invisible to the claim, which finds the
    tenant idle there; it must not clear the turn the producer relied on."""
    tenant = new_tenant()
    (first,) = enqueue(producer, tenant, 1, "reports")

    with db.connect(postgres.PRODUCER) as late, late.transaction():
        enqueue(late, tenant, 1, "reports", prefix="late-")
        assert [j["id"] for j in claim(duty_worker, "reports")] == [first["job_id"]]
        assert turns(owner, "reports")[tenant][0] is not None  # kept: lock not free
    # The producer has committed: its job is served by the next claim, no repair needed.

    assert [j["tenant_id"] for j in claim(duty_worker, "reports")] == [tenant]


def test_a_producer_in_a_queue_waits_for_a_claim_clearing_its_turn_then_restores_it(
        db: Database, duty_worker: Conn, owner: Conn) -> None:
    """Claim first: it settled the tenant's turn in the queue and has not committed; the
    producer must wait for it rather than read the old turn and skip its write."""
    tenant = new_tenant()
    with db.connect(postgres.PRODUCER) as conn:
        enqueue(conn, tenant, 1, "reports")
    produced: list[BaseException | None] = []

    with db.connect(postgres.DUTY_WORKER) as claimer, \
            db.connect(postgres.PRODUCER) as late:
        late_pid = late.info.backend_pid

        def produce() -> None:
            try:
                enqueue(late, tenant, 1, "reports", prefix="late-")
                produced.append(None)
            except BaseException as exc:  # reported by the assertion below
                produced.append(exc)

        with claimer.transaction():
            assert len(claim(claimer, "reports")) == 1  # the tenant has nothing left
            thread = threading.Thread(target=produce)
            thread.start()
            deadline = time.monotonic() + 10
            while (thread.is_alive() and time.monotonic() < deadline
                   and not _waiting_for_an_advisory_lock(owner, late_pid)):
                time.sleep(0.01)
            assert thread.is_alive()  # it waits for the claim's bucket lock
        thread.join(timeout=30)

    assert produced == [None]
    assert [j["tenant_id"] for j in claim(duty_worker, "reports")] == [tenant]


def test_a_producer_of_another_queue_does_not_keep_a_claim_from_settling_a_turn(
        db: Database, producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    """The bucket lock names the queue: an uncommitted job in 'default' leaves the
    tenant's bucket in 'reports' free, so reports' claim settles its idle turn."""
    tenant = new_tenant()
    while owner.execute("select app.turn_bucket('default', %s) = app.turn_bucket('reports', %s)"
                        " as same", (tenant, tenant)).fetchone() == {"same": True}:
        tenant = new_tenant()  # one in 256: the two turns would share a bucket
    enqueue(producer, tenant, 1, "reports")

    with db.connect(postgres.PRODUCER) as other, other.transaction():
        enqueue(other, tenant, 1, "default")
        assert len(claim(duty_worker, "reports")) == 1
        assert turns(owner, "reports")[tenant][0] is None  # settled: nothing left there
    assert len(claim(duty_worker, "default")) == 1


def _due_turn_scans(conn: Conn) -> int:
    """Scans of the tenants' due-turn index in this transaction so far."""
    row = conn.execute("select pg_stat_get_xact_numscans('app.tenant_turns_due_idx'::regclass)"
                       " as n").fetchone()
    assert row is not None
    return int(row["n"])


def test_a_queues_claim_walks_its_due_turns_once_per_pick(
        producer: Conn, duty_worker: Conn, owner: Conn) -> None:
    """Fewer due tenants than the batch's room: the claim picks the free ones and the
    others from one read of the due turns (it once read them again for the others), and
    settling its tenants looks once for tenants left waiting behind them."""
    tenants = [new_tenant() for _ in range(3)]
    for tenant in tenants:
        enqueue(producer, tenant, 5, "reports")

    with duty_worker.transaction():
        before = _due_turn_scans(duty_worker)
        claimed = claim(duty_worker, "reports", limit=10)
        scans = _due_turn_scans(duty_worker) - before

    assert len(claimed) == 10
    assert scans == 2  # the pick's read, and the settlement's look for others waiting
