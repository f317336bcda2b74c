"""Concurrency and rate limits, enforced at admission (functions/admission.sql).

A job under a limit is claimable only with a slot of it; the rest are held out of every
claim's reach and admitted by the statement that frees a slot. Time is moved through the
SQL (a start slot's last start, a job's due time, a lease's expiry), never by sleeping.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import WORKER_NAME, expire_lease, job, new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

LEASE = timedelta(seconds=30)


def set_limit(conn: Conn, scope: str, *, kind: str | None = None,
              tenant: uuid.UUID | None = None, key: str | None = None,
              concurrency: int | None = None, rate: tuple[int, timedelta] | None = None,
              burst: int | None = None) -> str:
    count, period = rate if rate is not None else (None, None)
    row = conn.execute(
        "select app.set_limit('ops', %s, %s, %s, %s, %s, %s, %s, %s) as name",
        (scope, kind, tenant, key, concurrency, count, period, burst)).fetchone()
    assert row is not None
    return str(row["name"])


def enqueue(conn: Conn, tenant: uuid.UUID, count: int, *, kind: str = "report",
            prefix: str = "j", priority: int | None = None,
            limit_key: str | None = None, batch: bool = False) -> list[uuid.UUID]:
    """Enqueue ``count`` jobs, one call each (claim order is enqueue order) or in one
    batch."""
    if not batch:
        return [job_id for _ in range(count)
                for job_id in enqueue(conn, tenant, 1, kind=kind, prefix=prefix,
                                      priority=priority, limit_key=limit_key, batch=True)]
    rows = conn.execute(
        "select job_id from app.enqueue_jobs(%s, %s, %s, %s, null, null, null, %s, null, %s)"
        " order by ord",
        ([tenant] * count, [f"{prefix}-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)],
         [kind] * count, [Jsonb({"i": i}) for i in range(count)],
         None if priority is None else [priority] * count,
         None if limit_key is None else [limit_key] * count)).fetchall()
    return [r["job_id"] for r in rows]


def claim(conn: Conn, limit: int = 10, owner: str = WORKER_NAME) -> list[dict[str, Any]]:
    return conn.execute("select * from app.claim_ready_jobs(%s, %s, %s)",
                        (owner, limit, LEASE)).fetchall()


def finish(conn: Conn, row: dict[str, Any], outcome: str = "succeeded",
           delay: timedelta | None = None, owner: str = WORKER_NAME) -> None:
    conn.execute(
        "select * from app.finish_jobs(%s, %s, %s, %s, %s, %s, %s)",
        (owner, [row["tenant_id"]], [row["id"]], [row["lease_token"]], [outcome],
         [Jsonb({"message": "x"} if outcome != "succeeded" else {"ok": True})], [delay]))


def status(conn: Conn) -> dict[str, dict[str, Any]]:
    return {r["bucket"]: r for r in conn.execute("select * from app.limit_status()").fetchall()}


def held(conn: Conn) -> set[uuid.UUID]:
    return {r["job_id"] for r in conn.execute("select job_id from app.held_jobs").fetchall()}


def test_a_kind_limit_of_two_lets_two_be_claimed_and_holds_the_rest_out_of_reach(
    worker: Conn, owner: Conn
) -> None:
    assert set_limit(owner, "kind", kind="report", concurrency=2) == "kind:report"
    tenant = new_tenant()
    ids = enqueue(worker, tenant, 5)
    other = enqueue(worker, tenant, 3, kind="email")
    assert held(owner) == set(ids[2:])
    claimed = claim(worker, 10)
    assert sorted(r["id"] for r in claimed) == sorted(ids[:2] + other)
    assert claim(worker, 10) == []
    row = status(owner)["kind:report"]
    assert (row["admitted"], row["running"], row["blocked"]) == (2, 2, 3)
    # Held jobs are not due: no ready count, no oldest-ready age, no turn of their tenant.
    assert owner.execute("select app.oldest_ready_at() as at").fetchone() == {"at": None}


def test_finishing_a_job_admits_the_next_held_one_in_the_same_statement(
    worker: Conn, owner: Conn
) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    ids = enqueue(worker, tenant, 3)
    (first,) = claim(worker)
    assert first["id"] == ids[0]
    finish(worker, first)
    assert held(owner) == {ids[2]}
    (second,) = claim(worker)
    assert second["id"] == ids[1]
    finish(worker, second, "dead")
    (third,) = claim(worker)
    assert third["id"] == ids[2]
    assert held(owner) == set()


def test_worker_b_claims_nothing_beyond_the_limit_while_worker_a_holds_its_claim_open(
    db: Database, owner: Conn, worker: Conn
) -> None:
    set_limit(owner, "kind", kind="report", concurrency=2)
    enqueue(worker, new_tenant(), 6)
    with db.connect(postgres.WORKER) as a, db.connect(postgres.WORKER) as b:
        a.execute("begin")
        got_a = claim(a, 1, owner="worker-a")
        assert len(got_a) == 1
        got_b = claim(b, 10, owner="worker-b")  # A's claim is still open
        assert len(got_b) == 1
        assert claim(b, 10, owner="worker-b") == []
        a.execute("rollback")  # A's claim never happened: its job is claimable again
        assert len(claim(b, 10, owner="worker-b")) == 1
        assert claim(b, 10, owner="worker-b") == []
    running = owner.execute("select count(*) as n from app.jobs where state = 'running'").fetchone()
    assert running == {"n": 2}


def test_a_killed_holders_job_is_claimable_again_at_lease_expiry_and_its_end_frees_the_slot(
    worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    first, second = (
        owner.execute("select job_id from app.enqueue_jobs(%s, %s, %s, %s, null, %s)",
                      ([tenant], [key], ["report"], [Jsonb({})], [2])).fetchone()["job_id"]
        for key in ("a", "b"))
    (claimed,) = claim(worker)
    assert claimed["id"] == first
    expire_lease(admin, first)  # its worker was killed
    owner.execute("select app.release_all_expired_jobs(100)")
    (again,) = claim(worker)  # the slot is the job's: it runs again, nothing else does
    assert again["id"] == first
    assert claim(worker) == []
    expire_lease(admin, first)
    owner.execute("select app.release_all_expired_jobs(100)")  # its last attempt: dead
    assert job(owner, first)["state"] == "dead"
    (next_one,) = claim(worker)
    assert next_one["id"] == second


def test_cancel_retry_and_give_back_keep_running_within_the_limit(
    worker: Conn, owner: Conn
) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    ids = enqueue(worker, tenant, 4)
    # A held job cancelled leaves the queue; the admitted one cancelled frees the slot.
    owner.execute("select * from app.cancel_jobs('ops', null, %s)", ([ids[3]],))
    assert ids[3] not in held(owner)
    owner.execute("select * from app.cancel_jobs('ops', null, %s)", ([ids[0]],))
    (a,) = claim(worker)
    assert a["id"] == ids[1]
    # A retry keeps the slot: nothing else is admitted while it waits.
    finish(worker, a, "retry", timedelta(0))
    (again,) = claim(worker)
    assert again["id"] == ids[1]
    # A give-back keeps it too.
    worker.execute("select * from app.release_jobs(%s, %s, %s, %s)",
                   (WORKER_NAME, [again["tenant_id"]], [again["id"]], [again["lease_token"]]))
    (given,) = claim(worker)
    assert given["id"] == ids[1]
    # A running job cancelled ends at its outcome, and then the next is admitted.
    owner.execute("select * from app.request_job_cancel('ops', %s)", ([ids[1]],))
    finish(worker, given)
    assert job(owner, ids[1])["state"] == "cancelled"
    (last,) = claim(worker)
    assert last["id"] == ids[2]


def test_a_redriven_job_is_admitted_again_through_its_limit(
    worker: Conn, owner: Conn
) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    ids = enqueue(worker, tenant, 2)
    (a,) = claim(worker)
    finish(worker, a, "dead")
    (b,) = claim(worker)
    owner.execute("select * from app.redrive_jobs('ops', null, %s)", ([ids[0]],))
    assert held(owner) == {ids[0]}
    assert claim(worker) == []
    finish(worker, b)
    (again,) = claim(worker)
    assert again["id"] == ids[0]


def test_admission_within_a_limit_is_fair_across_tenants_and_follows_priority(
    worker: Conn, owner: Conn
) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    flood, small = new_tenant(), new_tenant()
    enqueue(worker, flood, 20, prefix="flood")
    small_ids = enqueue(worker, small, 3, prefix="small")
    urgent = enqueue(worker, flood, 1, prefix="urgent", priority=9)
    order: list[uuid.UUID] = []
    for _ in range(8):
        (row,) = claim(worker)
        order.append(row["tenant_id"])
        if row["id"] == urgent[0]:
            urgent_at = len(order)
        finish(worker, row)
    # The small tenant's 3 jobs are among the first 7 admissions, alternating.
    assert Counter(order[:7])[small] == 3
    runs = "".join("s" if t == small else "f" for t in order[:7])
    assert "fff" not in runs, runs  # turn about, not first come
    assert "ss" not in runs, runs
    assert urgent_at <= 4  # the flood's urgent job goes first of its held ones
    assert not held(owner) & set(small_ids)


def test_a_rate_limit_starts_at_most_its_rate_per_window_even_when_claims_come_late(
    worker: Conn, owner: Conn
) -> None:
    set_limit(owner, "kind", kind="report", rate=(2, timedelta(seconds=10)))
    tenant = new_tenant()
    enqueue(worker, tenant, 6)
    assert len(claim(worker)) == 2  # the burst
    assert claim(worker) == []
    # The next admitted ones are scheduled to the window's end; make them due now, as a
    # claim arriving late would find them: they still may not start.
    owner.execute("update app.jobs set available_at = clock_timestamp() - interval '1 second'"
                  " where state = 'pending' and id not in (select job_id from app.held_jobs)")
    owner.execute("select * from app.repair_tenant_turns(100)")
    assert claim(worker) == []
    # A window later (the slots' last starts moved back) two more start, no more.
    owner.execute("update app.limit_starts set started_at = started_at - interval '10 seconds'")
    owner.execute("update app.jobs set available_at = clock_timestamp() - interval '1 second'"
                  " where state = 'pending' and id not in (select job_id from app.held_jobs)")
    owner.execute("select * from app.repair_tenant_turns(100)")
    assert len(claim(worker)) == 2
    assert claim(worker) == []
    starts = owner.execute("select count(*) as n from app.job_events where event_type = 'claimed'"
                           ).fetchone()
    assert starts == {"n": 4}


def test_a_burst_below_the_rate_spreads_the_starts(worker: Conn, owner: Conn) -> None:
    set_limit(owner, "kind", kind="report", rate=(4, timedelta(seconds=8)), burst=1)
    enqueue(worker, new_tenant(), 4)
    assert len(claim(worker)) == 1
    nxt = owner.execute("select min(available_at) - clock_timestamp() as wait from app.jobs"
                        " where state = 'pending'").fetchone()
    assert nxt is not None
    assert timedelta(seconds=1) < nxt["wait"] <= timedelta(seconds=2)


def test_limits_that_can_never_admit_are_refused(owner: Conn) -> None:
    for concurrency, rate, burst in [(0, None, None), (-1, None, None),
                                     (None, (0, timedelta(seconds=1)), None),
                                     (None, (5, timedelta(0)), None),
                                     (None, (5, timedelta(seconds=1)), 6),
                                     (None, None, None)]:
        with raises_sqlstate("22023"):
            set_limit(owner, "kind", kind="report", concurrency=concurrency, rate=rate,
                      burst=burst)
    with raises_sqlstate("22023", "takes no p_tenant_id"):
        set_limit(owner, "kind", kind="report", tenant=new_tenant(), concurrency=1)


def test_an_operators_limit_is_in_force_over_the_codes_and_a_tenants_over_every_tenants(
    worker: Conn, owner: Conn
) -> None:
    owner.execute("select * from app.sync_limits(%s, %s, %s, %s, %s, %s)",
                  (["report"], [False], [1], [None], [None], [None]))
    set_limit(owner, "kind", kind="report", concurrency=3)
    tenant = new_tenant()
    enqueue(worker, tenant, 5)
    assert len(claim(worker)) == 3
    in_force = {(r["name"], r["source"]): r["in_force"]
                for r in owner.execute("select * from app.list_limits()").fetchall()}
    assert in_force == {("kind:report", "operator"): True, ("kind:report", "code"): False}
    # Per tenant: every tenant 1, this one 2.
    special, plain = new_tenant(), new_tenant()
    set_limit(owner, "kind_tenant", kind="export", concurrency=1)
    set_limit(owner, "kind_tenant", kind="export", tenant=special, concurrency=2)
    enqueue(worker, special, 4, kind="export")
    enqueue(worker, plain, 4, kind="export")
    got = Counter(r["tenant_id"] for r in claim(worker, 20))
    assert got == {special: 2, plain: 1}


def test_removing_or_raising_a_limit_admits_held_jobs_at_once(worker: Conn, owner: Conn) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    enqueue(worker, new_tenant(), 5)
    set_limit(owner, "kind", kind="report", concurrency=3)
    assert len(claim(worker)) == 3
    owner.execute("select app.remove_limit('kind', 'report')")
    assert len(claim(worker)) == 2
    assert held(owner) == set()


def test_tenant_and_key_limits_count_across_kinds_and_tenants(worker: Conn, owner: Conn) -> None:
    tenant, other = new_tenant(), new_tenant()
    set_limit(owner, "tenant", tenant=tenant, concurrency=2)
    set_limit(owner, "key", key="partner-42", concurrency=1)
    enqueue(worker, tenant, 2, kind="a")
    enqueue(worker, tenant, 2, kind="b")
    enqueue(worker, other, 2, kind="c", limit_key="partner-42")
    enqueue(worker, tenant, 1, kind="c", limit_key="partner-42", prefix="k")
    got = claim(worker, 20)
    by_tenant = Counter(r["tenant_id"] for r in got)
    assert by_tenant[tenant] == 2
    keyed = owner.execute("select count(*) as n from app.jobs where limit_key = 'partner-42'"
                          " and state = 'running'").fetchone()
    assert keyed == {"n": 1}


def test_a_held_job_says_which_limit_holds_it(worker: Conn, owner: Conn) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    ids = enqueue(worker, new_tenant(), 2)
    rows = owner.execute("select * from app.job_wait_reasons(%s)", (ids,)).fetchall()
    reasons = {r["job_id"]: (r["reason"], r["held_by"]) for r in rows}
    assert reasons[ids[1]] == ("held_by_limit", "kind:report")
    assert reasons[ids[0]][0] == "ready"


def test_a_backlog_held_behind_a_limit_of_two_gives_the_fan_out_no_full_claim(
    worker: Conn, owner: Conn
) -> None:
    from leaseq.base.pool import ScaleUp  # the worker's scale-up rule, fed the claim's answer

    set_limit(owner, "kind", kind="report", concurrency=2)
    tenant = new_tenant()
    for _ in range(10):
        enqueue(worker, tenant, 1000, batch=True)
    for row in claim(worker, 10):
        finish(worker, row)  # the drain under way: each outcome admits the next
    claimed = claim(worker, 10)
    assert len(claimed) == 2
    jobs = [SimpleNamespace(available_at=r["available_at"]) for r in claimed]
    assert ScaleUp().wanted(jobs, 10) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("claimers", [8])
def test_running_jobs_never_exceed_the_limit_with_many_concurrent_claimers(
    db: Database, owner: Conn, worker: Conn, claimers: int
) -> None:
    limit = 3
    set_limit(owner, "kind", kind="report", concurrency=limit)
    tenants = [new_tenant() for _ in range(4)]
    for t in tenants:
        enqueue(worker, t, 30)
    enqueue(worker, tenants[0], 30, kind="free")
    errors: list[BaseException] = []
    peak = [0]
    stop = threading.Event()

    def run(n: int) -> None:
        try:
            with db.connect(postgres.WORKER) as conn:
                for _ in range(60):
                    rows = claim(conn, 4, owner=f"w{n}")
                    for row in rows:
                        if row["kind"] == "report" and n % 3 == 0:
                            finish(conn, row, "retry", timedelta(0), owner=f"w{n}")
                        else:
                            finish(conn, row, owner=f"w{n}")
        except BaseException as exc:
            errors.append(exc)

    def sample() -> None:
        with db.connect(postgres.OWNER) as conn:
            while not stop.is_set():
                row = conn.execute("select count(*) as n from app.jobs"
                                   " where kind = 'report' and state = 'running'").fetchone()
                assert row is not None
                peak[0] = max(peak[0], row["n"])

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=run, args=(n,)) for n in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sampler.join()
    assert not errors, errors
    assert 1 <= peak[0] <= limit
    # Exact from the audit trail as well: each attempt runs from its claim to its outcome.
    spans = owner.execute(
        "select c.created_at as start, f.created_at as stop from app.job_events c"
        " join app.jobs j on j.id = c.job_id and j.kind = 'report'"
        " join lateral (select e.created_at from app.job_events e where e.job_id = c.job_id"
        "   and e.sequence > c.sequence and e.event_type <> 'claimed'"
        "   order by e.sequence limit 1) f on true"
        " where c.event_type = 'claimed'").fetchall()
    moments = sorted([(s["start"], 1) for s in spans] + [(s["stop"], -1) for s in spans])
    level = most = 0
    for _, step in moments:
        level += step
        most = max(most, level)
    assert most <= limit
    left = owner.execute("select count(*) as n from app.jobs where state not in"
                         " ('succeeded', 'dead')").fetchone()
    assert left is not None


def test_an_unlimited_claim_reads_none_of_the_held_jobs(worker: Conn, owner: Conn) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    for _ in range(5):
        enqueue(worker, tenant, 1000, batch=True)
    enqueue(worker, tenant, 5, kind="email")
    # Held jobs have no claimable entry: the claim's table holds the admitted report job
    # and the 5 emails, whatever waits behind the limit.
    entries = owner.execute("select kind, count(*) as n from app.claimable"
                            " where tenant_id = %s group by kind order by kind",
                            (tenant,)).fetchall()
    assert entries == [{"kind": "email", "n": 5}, {"kind": "report", "n": 1}]
    assert len(held(owner)) == 4999


def test_a_limit_key_longer_than_200_characters_is_refused_with_its_item(
    worker: Conn
) -> None:
    rows = worker.execute(
        "select status, error from app.enqueue_jobs(%s, %s, %s, %s, null, null, null, null,"
        " null, %s)",
        ([new_tenant()], ["x"], ["report"], [Jsonb({})], ["k" * 201])).fetchall()
    assert rows[0]["status"] == "rejected"
    assert "limit_key" in rows[0]["error"]




def test_a_job_due_later_takes_no_slot_before_it_is_due(worker: Conn, owner: Conn) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    (scheduled,) = [r["job_id"] for r in worker.execute(
        "select job_id from app.enqueue_jobs(%s, %s, %s, %s,"
        " array[clock_timestamp() + interval '1 hour'])",
        ([tenant], ["scheduled"], ["report"], [Jsonb({})])).fetchall()]
    (now_job,) = enqueue(worker, tenant, 1)
    assert held(owner) == {scheduled}
    (row,) = claim(worker)
    assert row["id"] == now_job
    # Its due time comes (moved in its held row): the slot freed next is its own.
    owner.execute("update app.held_jobs set available_at = clock_timestamp() - interval '1 second'")
    finish(worker, row)
    (again,) = claim(worker)
    assert again["id"] == scheduled


def test_a_claim_held_open_under_a_rate_limit_never_makes_another_claim_wait(
    db: Database, owner: Conn, worker: Conn
) -> None:
    set_limit(owner, "kind", kind="report", rate=(3, timedelta(seconds=10)), burst=3)
    enqueue(worker, new_tenant(), 8)
    assert len(claim(worker, 1)) == 1  # the first start made the limit's start slots
    with db.connect(postgres.WORKER) as a, db.connect(postgres.WORKER) as b:
        b.execute("set statement_timeout = '5s'")  # a wait would fail the test, not hang it
        a.execute("begin")
        assert len(claim(a, 1, owner="worker-a")) == 1  # and admits the next, uncommitted
        assert len(claim(b, 10, owner="worker-b")) == 1  # the third start of the window
        assert claim(b, 10, owner="worker-b") == []
        a.execute("commit")
    starts = owner.execute("select count(*) as n from app.job_events where event_type = 'claimed'"
                           ).fetchone()
    assert starts is not None
    assert starts["n"] <= 3


def test_starts_per_rate_window_never_exceed_the_rate_with_many_concurrent_claimers(
    db: Database, owner: Conn, worker: Conn
) -> None:
    count, period = 4, timedelta(seconds=1)
    set_limit(owner, "kind", kind="report", rate=(count, period))
    for _ in range(3):
        enqueue(worker, new_tenant(), 20, batch=True)
    errors: list[BaseException] = []
    stop = threading.Event()

    def run(n: int) -> None:
        try:
            with db.connect(postgres.WORKER) as conn:
                while not stop.is_set():
                    for row in claim(conn, 3, owner=f"w{n}"):
                        finish(conn, row, owner=f"w{n}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    stop.wait(3.5)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    starts = sorted(r["created_at"] for r in owner.execute(
        "select created_at from app.job_events where event_type = 'claimed'").fetchall())
    assert len(starts) >= count * 2  # the limit let work through, window after window
    for i, first in enumerate(starts):
        within = [t for t in starts[i:] if t - first < period]
        assert len(within) <= count, (first, within)


def test_enqueue_job_answers_a_held_job_with_its_own_due_time(worker: Conn, owner: Conn) -> None:
    set_limit(owner, "kind", kind="report", concurrency=1)
    tenant = new_tenant()
    first = worker.execute("select * from app.enqueue_job(%s, 'a', 'report', '{}')",
                           (tenant,)).fetchone()
    second = worker.execute("select * from app.enqueue_job(%s, 'b', 'report', '{}')",
                            (tenant,)).fetchone()
    assert first is not None
    assert second is not None
    assert second["id"] in held(owner)
    assert abs((second["available_at"] - first["available_at"]).total_seconds()) < 60


def test_a_retry_of_a_rate_limited_job_counts_as_a_start_of_its_own(
    worker: Conn, owner: Conn
) -> None:
    set_limit(owner, "kind", kind="report", rate=(1, timedelta(seconds=30)))
    (job_id,) = enqueue(worker, new_tenant(), 1)
    (row,) = claim(worker)
    finish(worker, row, "retry", timedelta(0))
    owner.execute("select * from app.repair_tenant_turns(100)")
    assert claim(worker) == []  # the window's one start was its first attempt
    owner.execute("update app.limit_starts set started_at = started_at - interval '30 seconds'")
    owner.execute("update app.jobs set available_at = clock_timestamp() - interval '1 second'"
                  " where id = %s", (job_id,))
    owner.execute("select * from app.repair_tenant_turns(100)")
    (again,) = claim(worker)
    assert again["id"] == job_id
