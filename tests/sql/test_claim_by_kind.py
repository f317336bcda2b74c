"""Claims with a kind filter: a worker of some kinds only, and a worker of every kind but
those (sql/README.md, "Kinds' turns").

What they must keep: a filtered claim takes only its kinds and never reads or locks a
job of another kind; two workers of disjoint kinds drain a mixed queue exactly once
between them; tenants whose ready jobs are all of the other worker's kinds cost a claim
nothing; neither worker's round robin delays the other's (a tenant the main worker
serves on every round still gets its slow jobs within the slow worker's bound); the
wake-up rules and the repair sweep hold for the kinds' turns as for the tenants'.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import WORKER_NAME, enqueue, new_tenant, raises_sqlstate, snapshot
from tests.sql.test_fair_claim import _waiting_for_an_advisory_lock, every_path_to_claimable
from tests.support import postgres
from tests.support.postgres import Conn

QUICK = "email.send"  # the kind the shared test helpers enqueue
SLOW = "report.build"
OTHER = "invoice.render"

Filter = tuple[list[str] | None, list[str] | None]
#: The slow worker's filter and the main worker's, as the template sets them.
SLOW_WORKER: Filter = ([SLOW], None)
MAIN_WORKER: Filter = (None, [SLOW])


def enqueue_kinds(conn: Conn, tenant: uuid.UUID, kinds: list[str], *,
                  prefix: str = "job") -> list[uuid.UUID]:
    """One job per element of ``kinds``, in that order, one enqueue each (so that their
    available_at, and so their claim order, follow the list)."""
    return [enqueue(conn, tenant, f"{prefix}-{n}", kind=kind)["id"]
            for n, kind in enumerate(kinds)]


def enqueue_for(conn: Conn, tenants: list[uuid.UUID], kind: str, *, per_tenant: int = 1,
                prefix: str = "job") -> None:
    """``per_tenant`` jobs of ``kind`` for every tenant, 1,000 per call."""
    items = [(t, f"{prefix}-{i}") for i in range(per_tenant) for t in tenants]
    for start in range(0, len(items), 1000):
        chunk = items[start:start + 1000]
        conn.execute(
            "select 1 from app.enqueue_jobs(%s, %s, %s, %s)",
            ([t for t, _ in chunk], [k for _, k in chunk], [kind] * len(chunk),
             [Jsonb({"k": k}) for _, k in chunk]),
        )


def claim_ready(conn: Conn, limit: int = 10, kinds: Filter = (None, None), *,
                owner: str = WORKER_NAME) -> list[dict[str, Any]]:
    return conn.execute(
        "select id, tenant_id, kind, lease_token from app.claim_ready_jobs(%s, %s,"
        " '5 minutes', %s, %s)", (owner, limit, *kinds),
    ).fetchall()


def claim_tenant(conn: Conn, tenant: uuid.UUID, limit: int,
                 kinds: Filter) -> list[dict[str, Any]]:
    return conn.execute(
        "select id, tenant_id, kind, lease_token from app.claim_jobs(%s, %s, %s,"
        " '5 minutes', %s, %s)", (tenant, WORKER_NAME, limit, *kinds),
    ).fetchall()


def finish(conn: Conn, jobs: list[dict[str, Any]], *, owner: str = WORKER_NAME) -> None:
    conn.execute(
        "select 1 from app.finish_jobs(%s, %s, %s, %s, %s, %s, %s)",
        (owner, [j["tenant_id"] for j in jobs], [j["id"] for j in jobs],
         [j["lease_token"] for j in jobs], ["succeeded"] * len(jobs), [None] * len(jobs),
         [None] * len(jobs)),
    )


def ready_kinds(owner: Conn) -> Counter[str]:
    rows = owner.execute("select kind from app.jobs where state in ('pending', 'retry_wait')"
                         " and available_at <= clock_timestamp()").fetchall()
    return Counter(r["kind"] for r in rows)


def kind_turn(owner: Conn, tenant: uuid.UUID, kind: str) -> dict[str, Any] | None:
    return owner.execute("select turn_at from app.kind_turns where tenant_id = %s and kind = %s",
                         (tenant, kind)).fetchone()


# Only the named kinds, never the excluded ones -----------------------------------------


def test_a_claim_of_some_kinds_takes_only_those_and_leaves_the_others_ready(
    worker: Conn, owner: Conn,
) -> None:
    a, b = new_tenant(), new_tenant()
    enqueue_kinds(worker, a, [QUICK, SLOW, QUICK, SLOW, OTHER, SLOW])
    enqueue_kinds(worker, b, [OTHER, SLOW, SLOW, OTHER])

    claimed = claim_ready(worker, 100, SLOW_WORKER)

    assert Counter(r["kind"] for r in claimed) == {SLOW: 5}
    assert ready_kinds(owner) == {QUICK: 2, OTHER: 3}
    assert claim_ready(worker, 100, SLOW_WORKER) == []


def test_a_claim_excluding_kinds_never_takes_them_however_long_they_wait(
    worker: Conn, owner: Conn,
) -> None:
    a, b = new_tenant(), new_tenant()
    enqueue_kinds(worker, a, [SLOW, SLOW, QUICK, OTHER])  # the slow ones are oldest
    enqueue_kinds(worker, b, [SLOW, OTHER])

    first = claim_ready(worker, 2, MAIN_WORKER)
    rest = claim_ready(worker, 100, MAIN_WORKER)

    assert {r["kind"] for r in first + rest} == {QUICK, OTHER}
    assert len(first + rest) == 3
    assert claim_ready(worker, 100, MAIN_WORKER) == []
    assert ready_kinds(owner) == {SLOW: 3}


def test_a_filter_of_several_kinds_claims_them_in_claim_order_across_kinds(
    worker: Conn,
) -> None:
    tenant = new_tenant()
    ids = enqueue_kinds(worker, tenant, [QUICK, SLOW, OTHER, QUICK, SLOW, OTHER])

    by_kinds = claim_tenant(worker, tenant, 3, ([OTHER, QUICK, OTHER], None))
    by_exclusion = claim_tenant(worker, tenant, 10, (None, [SLOW]))

    assert [r["id"] for r in by_kinds] == [ids[0], ids[2], ids[3]]
    assert [r["id"] for r in by_exclusion] == [ids[5]]
    assert claim_tenant(worker, tenant, 10, (None, [SLOW])) == []
    assert [r["id"] for r in claim_tenant(worker, tenant, 10, (None, None))] == [ids[1], ids[4]]


def test_finish_and_claim_records_every_outcome_and_claims_only_the_filters_kinds(
    worker: Conn, owner: Conn,
) -> None:
    tenant = new_tenant()
    enqueue_kinds(worker, tenant, [QUICK, SLOW, QUICK, SLOW])
    (held,) = claim_tenant(worker, tenant, 1, ([QUICK], None))

    rows = worker.execute(
        "select claimed, id, kind, state from app.finish_and_claim_jobs(%s, %s, %s, %s,"
        " '{succeeded}', '{null}', '{null}', 10, '30 seconds', %s, %s)",
        (WORKER_NAME, [tenant], [held["id"]], [held["lease_token"]], *SLOW_WORKER),
    ).fetchall()

    assert [(r["claimed"], r["id"], r["state"]) for r in rows if not r["claimed"]] == [
        (False, held["id"], "succeeded")]
    assert [r["kind"] for r in rows if r["claimed"]] == [SLOW, SLOW]
    assert ready_kinds(owner) == {QUICK: 1}


def test_a_kind_nobody_enqueued_may_be_named_and_claims_nothing(worker: Conn) -> None:
    enqueue_kinds(worker, new_tenant(), [QUICK])

    assert claim_ready(worker, 10, (["never.enqueued"], None)) == []
    assert claim_tenant(worker, new_tenant(), 10, (["never.enqueued"], None)) == []
    assert len(claim_ready(worker, 10, (None, ["never.enqueued"]))) == 1


# The filter's bounds ---------------------------------------------------------------------


def _claim_calls(worker: Conn, kinds: Any, exclude: Any) -> dict[str, Callable[[], Any]]:
    tenant = new_tenant()
    return {
        "claim_jobs": lambda: worker.execute(
            "select * from app.claim_jobs(%s, 'w', 10, '30 seconds', %s, %s)",
            (tenant, kinds, exclude)).fetchall(),
        "claim_ready_jobs": lambda: worker.execute(
            "select * from app.claim_ready_jobs('w', 10, '30 seconds', %s, %s)",
            (kinds, exclude)).fetchall(),
        # p_limit 0: no claim, and the filter is still checked.
        "finish_and_claim_jobs": lambda: worker.execute(
            "select * from app.finish_and_claim_jobs('w', '{}', '{}', '{}', '{}', '{}', '{}',"
            " 0, '30 seconds', %s, %s)", (kinds, exclude)).fetchall(),
    }


BAD_FILTERS = {
    "both": ([SLOW], [QUICK], "p_kinds and p_exclude_kinds cannot both be set"),
    "empty": ([], None, "p_kinds must name 1 to 100 kinds (got 0)"),
    "empty-exclusion": (None, [], "p_exclude_kinds must name 1 to 100 kinds (got 0)"),
    "101-kinds": ([f"k{n}" for n in range(101)], None, "must name 1 to 100 kinds (got 101)"),
    "null-element": (None, [SLOW, None], "p_exclude_kinds element 2 must be a job kind"),
    "empty-element": (["", SLOW], None, "p_kinds element 1 must be a job kind"),
    "zero-width-space": ([SLOW, "\u200b"], None, "p_kinds element 2 must be a job kind"),
    "tab": (None, ["\t"], "p_exclude_kinds element 1 must be a job kind"),
    "129-characters": (["k" * 129], None, "p_kinds element 1 must be a job kind"),
}


@pytest.mark.parametrize("function", ["claim_jobs", "claim_ready_jobs", "finish_and_claim_jobs"])
@pytest.mark.parametrize("bad", list(BAD_FILTERS), ids=list(BAD_FILTERS))
def test_a_bad_kind_filter_is_refused_with_22023_and_changes_nothing(
    worker: Conn, owner: Conn, function: str, bad: str,
) -> None:
    kinds, exclude, message = BAD_FILTERS[bad]
    enqueue_kinds(worker, new_tenant(), [SLOW, QUICK])
    before = snapshot(owner)

    with raises_sqlstate("22023", message):
        _claim_calls(worker, kinds, exclude)[function]()

    assert snapshot(owner) == before


@pytest.mark.parametrize("function", ["claim_jobs", "claim_ready_jobs", "finish_and_claim_jobs"])
def test_a_filter_of_100_kinds_of_128_characters_is_accepted(worker: Conn, function: str) -> None:
    kinds = [f"{n:03d}".ljust(128, "k") for n in range(100)]
    _claim_calls(worker, kinds, None)[function]()
    _claim_calls(worker, None, kinds)[function]()


def test_finish_and_claim_with_a_bad_filter_records_no_outcome(
    worker: Conn, owner: Conn,
) -> None:
    tenant = new_tenant()
    enqueue_kinds(worker, tenant, [QUICK])
    (held,) = claim_tenant(worker, tenant, 1, (None, None))
    before = snapshot(owner)

    with raises_sqlstate("22023", "cannot both be set"):
        worker.execute(
            "select * from app.finish_and_claim_jobs(%s, %s, %s, %s, '{succeeded}', '{null}',"
            " '{null}', 10, '30 seconds', %s, %s)",
            (WORKER_NAME, [tenant], [held["id"]], [held["lease_token"]], [SLOW], [QUICK]))

    assert snapshot(owner) == before


# Two workers of disjoint kinds -----------------------------------------------------------


def _drain(db: Database, name: str, kinds: Filter, first_claims: threading.Barrier,
           claimed: list[dict[str, Any]]) -> None:
    """Claim with one filter until nothing of it is ready; finish every job claimed.

    Every worker holds its first batch until all have claimed one, so that all of them
    claim side by side; otherwise one thread the scheduler favours may drain its kinds
    before another has started."""
    with db.connect(postgres.DUTY_WORKER) as conn:
        batch = claim_ready(conn, 7, kinds, owner=name)
        first_claims.wait(timeout=30)
        while batch:
            claimed.extend(batch)
            finish(conn, batch, owner=name)
            batch = claim_ready(conn, 7, kinds, owner=name)


def test_two_main_and_two_slow_workers_drain_a_mixed_queue_each_job_exactly_once(
    db: Database, worker: Conn, owner: Conn,
) -> None:
    tenants = [new_tenant() for _ in range(12)]
    for kind, per_tenant in ((QUICK, 30), (SLOW, 10), (OTHER, 20)):
        enqueue_for(worker, tenants, kind, per_tenant=per_tenant, prefix=kind)
    filters = {"main-1": MAIN_WORKER, "main-2": MAIN_WORKER,
               "slow-1": SLOW_WORKER, "slow-2": SLOW_WORKER}
    claimed: dict[str, list[dict[str, Any]]] = {name: [] for name in filters}
    first_claims = threading.Barrier(len(filters))
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            _drain(db, name, filters[name], first_claims, claimed[name])
        except BaseException as exc:  # re-raised below, in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in filters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []

    everyone = [job for jobs in claimed.values() for job in jobs]
    assert len(everyone) == len({job["id"] for job in everyone}) == 12 * 60
    for name, jobs in claimed.items():
        expected = {SLOW} if name.startswith("slow") else {QUICK, OTHER}
        assert {job["kind"] for job in jobs} <= expected, name
        assert jobs, f"{name} claimed nothing"
    rows = owner.execute(
        "select j.state, (select count(*) from app.job_events e where e.job_id = j.id"
        " and e.event_type = 'claimed') as claims from app.jobs j").fetchall()
    assert Counter((r["state"], r["claims"]) for r in rows) == {("succeeded", 1): 12 * 60}


# Tenants whose ready work is of other kinds ----------------------------------------------


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


@pytest.mark.parametrize("kinds", [MAIN_WORKER, ([QUICK], None)], ids=["exclude", "kinds"])
def test_tenants_whose_ready_jobs_are_all_of_other_kinds_cost_a_claim_nothing(
    worker: Conn, owner: Conn, kinds: Filter,
) -> None:
    """3,000 tenants whose ready jobs are all slow, first in turn order, and three whose
    quick jobs wait behind a slow backlog of their own: the main worker's claim neither
    spins on the first nor walks the backlogs, and its first claim gets its jobs."""
    enqueue_for(worker, [new_tenant() for _ in range(3_000)], SLOW, per_tenant=2)
    busy = [new_tenant() for _ in range(3)]
    enqueue_for(worker, busy, SLOW, per_tenant=300, prefix="slow")
    enqueue_for(worker, busy, QUICK, per_tenant=5)
    # The tables the claim reads, so that no earlier test's statistics choose its plans.
    owner.execute("analyze app.jobs, app.claimable, app.kind_turns, app.tenant_turns")

    with worker.transaction():
        before = _app_reads(worker)
        rows = claim_ready(worker, 10, kinds)
        after = _app_reads(worker)

    assert len(rows) == 10
    assert {r["kind"] for r in rows} == {QUICK}
    read = {name: after.get(name, 0) - n for name, n in before.items()}
    assert {name: n for name, n in read.items() if name.startswith("seq_scan") and n} == {}
    # A few entries per ready tenant and per claimed job; 3,000 tenants would be 3,000,
    # one backlog 300.
    assert sum(read.values()) < 200, {name: n for name, n in read.items() if n}
    # And the slow worker still gets its work.
    assert {r["kind"] for r in claim_ready(worker, 10, SLOW_WORKER)} == {SLOW}


def test_a_tenant_the_main_worker_serves_every_round_gets_its_slow_jobs_within_the_bound(
    worker: Conn,
) -> None:
    """With one turn per tenant, every round of the main worker would move this tenant's
    turn to now, behind every tenant with only slow work, and the slow worker, which
    serves the oldest turns first, would never reach it."""
    slow_only = [new_tenant() for _ in range(30)]
    enqueue_for(worker, slow_only, SLOW, per_tenant=10)  # busy for ten slow rounds
    quick = [new_tenant() for _ in range(15)]  # more than a batch: the main worker rotates
    enqueue_for(worker, quick, QUICK, per_tenant=20)
    busy = new_tenant()
    enqueue_kinds(worker, busy, [QUICK] * 40 + [SLOW], prefix="busy")
    limit = 10
    bound = math.ceil((len(slow_only) + 1) / limit)

    served_in = None
    for n in range(1, bound + 1):
        served_by_main = 0
        for _ in range(3):  # the main worker claims more often than the slow one
            batch = claim_ready(worker, limit, MAIN_WORKER)
            served_by_main += busy in {r["tenant_id"] for r in batch}
            finish(worker, batch)
        assert served_by_main >= 1  # 16 tenants, batches of 10: at least every other claim
        batch = claim_ready(worker, limit, SLOW_WORKER)
        assert len(batch) == limit
        assert {r["kind"] for r in batch} == {SLOW}
        finish(worker, batch)
        if busy in {r["tenant_id"] for r in batch}:
            served_in = n
            break
    assert served_in is not None, f"{busy} got no slow job within {bound} slow claims"


def test_tenants_beyond_one_batch_take_turns_in_a_filtered_claim(worker: Conn) -> None:
    tenants = [new_tenant() for _ in range(25)]
    enqueue_for(worker, tenants, SLOW, per_tenant=4)
    enqueue_for(worker, tenants[:5], QUICK, per_tenant=4, prefix="quick")

    first_round = [r["tenant_id"] for _ in range(3) for r in claim_ready(worker, 10, SLOW_WORKER)]

    # 25 tenants, batches of 10: three claims serve every tenant, as without a filter.
    assert set(first_round) == set(tenants)


def test_each_kind_of_claim_leaves_no_stale_due_turn_of_an_idle_tenant_for_the_other(
    worker: Conn, owner: Conn,
) -> None:
    """A claim that takes a tenant's last ready job settles both of its turns."""
    first, then = [new_tenant() for _ in range(5)], [new_tenant() for _ in range(5)]
    enqueue_for(worker, first, SLOW)
    enqueue_for(worker, first, QUICK, prefix="quick")
    assert len(claim_ready(worker, 100)) == 10  # without a filter: the kinds' turns settle
    enqueue_for(worker, then, SLOW)
    enqueue_for(worker, then, QUICK, prefix="quick")
    assert len(claim_ready(worker, 100, MAIN_WORKER)) == 5
    assert len(claim_ready(worker, 100, SLOW_WORKER)) == 5  # the last jobs: tenants' turns too

    due = owner.execute(
        "select (select count(*) from app.tenant_turns where turn_at is not null) as tenants,"
        " (select count(*) from app.kind_turns where turn_at is not null) as kinds").fetchone()
    assert due == {"tenants": 0, "kinds": 0}


# Every path that makes a job claimable wakes its kind ------------------------------------


@every_path_to_claimable
def test_a_kind_without_a_turn_gets_one_when_a_job_of_it_becomes_claimable(
    worker: Conn, owner: Conn, admin: Conn,
    make_claimable: Callable[[Conn, Conn, Conn, uuid.UUID, Any], None],
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "first")  # of kind QUICK, as the helpers enqueue
    (held,) = claim_ready(worker, 10, ([QUICK], None))
    assert kind_turn(owner, tenant, QUICK) == {"turn_at": None}  # nothing left: no turn

    make_claimable(worker, owner, admin, tenant, held)

    assert [r["tenant_id"] for r in claim_ready(worker, 10, ([QUICK], None))] == [tenant]


def test_a_busy_kinds_producers_do_not_write_its_turn(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "first", kind=SLOW)
    version = ("select xmin::text as version, turn_at from app.kind_turns"
               " where tenant_id = %s and kind = %s")
    before = owner.execute(version, (tenant, SLOW)).fetchone()

    for n in range(5):
        enqueue(worker, tenant, f"more-{n}", kind=SLOW)

    assert owner.execute(version, (tenant, SLOW)).fetchone() == before


def test_a_filtered_claim_keeps_the_turn_of_a_kind_whose_producer_has_not_committed(
    db: Database, worker: Conn,
) -> None:
    """Producer first: its job is invisible to the claim, so the claim must not clear."""
    tenant = new_tenant()
    first = enqueue(worker, tenant, "first", kind=SLOW)

    with db.connect(postgres.WORKER) as producer, producer.transaction():
        enqueue(producer, tenant, "second", kind=SLOW)
        assert [r["id"] for r in claim_ready(worker, 10, SLOW_WORKER)] == [first["id"]]
    # The producer has committed.

    batch = claim_ready(worker, 10, SLOW_WORKER)
    assert [r["tenant_id"] for r in batch] == [tenant]


def test_a_producer_waits_for_a_filtered_claim_clearing_its_kinds_turn(
    db: Database, worker: Conn, admin: Conn,
) -> None:
    """Claim first: it cleared the kind's turn but has not committed; the producer must
    not read the old turn and skip its write."""
    tenant = new_tenant()
    enqueue(worker, tenant, "first", kind=SLOW)
    produced: list[BaseException | None] = []

    with db.connect(postgres.WORKER) as claimer, db.connect(postgres.WORKER) as producer:
        producer_pid = producer.info.backend_pid

        def produce() -> None:
            try:
                enqueue(producer, tenant, "second", kind=SLOW)
                produced.append(None)
            except BaseException as exc:  # reported by the assertion below
                produced.append(exc)

        with claimer.transaction():
            assert len(claim_ready(claimer, 10, SLOW_WORKER)) == 1
            thread = threading.Thread(target=produce)
            thread.start()
            deadline = time.monotonic() + 10
            while (thread.is_alive() and time.monotonic() < deadline
                   and not _waiting_for_an_advisory_lock(admin, producer_pid)):
                time.sleep(0.01)
        thread.join(timeout=30)

    assert produced == [None]
    assert [r["tenant_id"] for r in claim_ready(worker, 10, SLOW_WORKER)] == [tenant]


def test_repair_gives_back_a_lost_kind_turn_so_the_job_is_delayed_not_lost(
    worker: Conn, owner: Conn,
) -> None:
    tenant = new_tenant()
    (job,) = enqueue_kinds(worker, tenant, [SLOW])
    owner.execute("delete from app.kind_turns where tenant_id = %s", (tenant,))  # a defect
    assert claim_ready(worker, 10, SLOW_WORKER) == []

    row = worker.execute("select * from app.repair_tenant_turns(100)").fetchone()

    assert row == {"tenants_checked": 1, "turns_repaired": 1}
    assert [r["id"] for r in claim_ready(worker, 10, SLOW_WORKER)] == [job]


def test_a_filtered_claim_reads_and_writes_no_turn_of_a_tenant_that_has_no_job_of_its_kinds(
    worker: Conn, owner: Conn,
) -> None:
    tenants = [new_tenant() for _ in range(3)]
    enqueue_for(worker, tenants, QUICK, per_tenant=3)
    claim_ready(worker, 2)  # two of three served: their tenants' turns move to now
    before = owner.execute("select * from app.tenant_turns order by tenant_id").fetchall()
    kinds_before = owner.execute("select * from app.kind_turns order by tenant_id").fetchall()

    assert claim_ready(worker, 10, SLOW_WORKER) == []

    assert owner.execute("select * from app.tenant_turns order by tenant_id").fetchall() == before
    assert owner.execute("select * from app.kind_turns order by tenant_id").fetchall() == (
        kinds_before)
