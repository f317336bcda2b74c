"""The worker pool (sql/functions/pool.sql): places of running and starting worker
invocations, never more than the maximum, whoever asks and however they race.

Each call runs as the role that makes it in production: a worker login (leaseq_worker)
joins, leaves, reserves and releases; a producer login wakes. The administrator only
moves expiry times into the past, as time passing or a killed invocation would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest

from tests.conftest import Database
from tests.sql.calls import raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

T = TypeVar("T")

LONG = timedelta(minutes=5)
HOLD = timedelta(seconds=90)
DEBOUNCE = timedelta(seconds=1)


@pytest.fixture
def pool_worker(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.DUTY_WORKER) as conn:
        yield conn


@pytest.fixture
def producer(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.PRODUCER) as conn:
        yield conn


def join(conn: Conn, owner: str, *, max_workers: int, reservation: uuid.UUID | None = None,
         reason: str = "schedule", expires_in: timedelta = LONG) -> bool:
    row = conn.execute("select app.join_worker_pool(%s, %s, %s, %s, %s) as joined",
                       (owner, reason, reservation, max_workers, expires_in)).fetchone()
    assert row is not None
    return bool(row["joined"])


def leave(conn: Conn, owner: str) -> None:
    conn.execute("select app.leave_worker_pool(%s)", (owner,))


def reserve(conn: Conn, wanted: int, *, max_workers: int,
            hold: timedelta = HOLD) -> list[uuid.UUID]:
    rows = conn.execute("select r.place from app.reserve_worker_places(%s, %s, %s) as r(place)",
                        (wanted, max_workers, hold)).fetchall()
    return [r["place"] for r in rows]


def release(conn: Conn, place: uuid.UUID) -> None:
    conn.execute("select app.release_worker_place(%s)", (place,))


def wake(conn: Conn, *, max_workers: int = 4, debounce: timedelta = DEBOUNCE,
         hold: timedelta = HOLD) -> uuid.UUID | None:
    row = conn.execute("select app.wake_worker_place(%s, %s, %s) as place",
                       (debounce, hold, max_workers)).fetchone()
    assert row is not None
    place: uuid.UUID | None = row["place"]
    return place


def size(conn: Conn) -> dict[str, int]:
    row = conn.execute("select live, reserved from app.worker_pool_size()").fetchone()
    assert row is not None
    return {"live": row["live"], "reserved": row["reserved"]}


def places(admin: Conn) -> list[dict[str, Any]]:
    """Every row of the pool, expired or not, as the administrator sees it."""
    return admin.execute("select * from app.worker_pool order by created_at, id").fetchall()


def expire(admin: Conn, *, owner: str | None = None, place: uuid.UUID | None = None) -> None:
    """Move a place's expiry into the past: its invocation was killed, or its event
    never arrived."""
    admin.execute("update app.worker_pool set expires_at = clock_timestamp() - interval '1 second'"
                  " where owner = %s or id = %s", (owner, place))


def in_parallel(db: Database, role: str, connections: int,
                work: Callable[[Conn, int], T]) -> list[T]:
    """Run ``work(conn, i)`` on ``connections`` connections of ``role`` at once (all
    released by one barrier); their results, and any failure re-raised."""
    start = threading.Barrier(connections)

    def run(i: int) -> T:
        with db.connect(role) as conn:
            start.wait(timeout=30)
            return work(conn, i)

    with ThreadPoolExecutor(connections) as pool:
        futures = [pool.submit(run, i) for i in range(connections)]
        return [f.result() for f in futures]


# The maximum ------------------------------------------------------------------------------


def test_racing_joins_and_reservations_from_eight_connections_fill_the_pool_exactly_to_the_maximum(
    db: Database, admin: Conn
) -> None:
    maximum = 5

    def race(conn: Conn, i: int) -> tuple[int, int]:
        joined = reserved = 0
        for n in range(25):
            if (i + n) % 3:
                joined += join(conn, f"racer-{i}-{n}", max_workers=maximum)
            else:
                reserved += len(reserve(conn, 2, max_workers=maximum))
        return joined, reserved

    results = in_parallel(db, postgres.DUTY_WORKER, 8, race)

    joined = sum(r[0] for r in results)
    reserved = sum(r[1] for r in results)
    assert joined + reserved == maximum
    assert len(places(admin)) == maximum
    assert size(admin) == {"live": joined, "reserved": reserved}


def test_invocations_joining_and_leaving_at_once_never_hold_more_than_the_maximum(
    db: Database, admin: Conn
) -> None:
    """Eight connections join, leave and reserve in a loop; a ninth keeps counting."""
    maximum = 3
    done = threading.Event()
    seen: list[int] = []

    def count() -> None:
        while not done.is_set():
            row = admin.execute("select count(*) as n from app.worker_pool"
                                " where expires_at > clock_timestamp()").fetchone()
            assert row is not None
            seen.append(int(row["n"]))

    def churn(conn: Conn, i: int) -> int:
        joins = 0
        for n in range(40):
            owner = f"churn-{i}-{n}"
            if join(conn, owner, max_workers=maximum, reason="fanout"):
                joins += 1
                leave(conn, owner)
            for place in reserve(conn, 1, max_workers=maximum):
                release(conn, place)
        return joins

    counter = threading.Thread(target=count)
    counter.start()
    try:
        joins = in_parallel(db, postgres.DUTY_WORKER, 8, churn)
    finally:
        done.set()
        counter.join()

    assert sum(joins) > 0
    assert seen
    assert max(seen) <= maximum
    assert places(admin) == []


def test_a_full_pool_refuses_a_join_and_a_reservation(pool_worker: Conn, admin: Conn) -> None:
    assert join(pool_worker, "a", max_workers=2)
    assert reserve(pool_worker, 5, max_workers=2) != []

    assert join(pool_worker, "b", max_workers=2) is False
    assert reserve(pool_worker, 1, max_workers=2) == []
    assert len(places(admin)) == 2


def test_reservations_are_capped_by_the_room_left_and_none_are_made_for_zero(
    pool_worker: Conn,
) -> None:
    assert join(pool_worker, "a", max_workers=4)

    assert reserve(pool_worker, 0, max_workers=4) == []
    first = reserve(pool_worker, 2, max_workers=4)
    second = reserve(pool_worker, 5, max_workers=4)

    assert len(first) == 2
    assert len(second) == 1
    assert len(set(first + second)) == 3
    assert size(pool_worker) == {"live": 1, "reserved": 3}
    # A lower maximum than the places already held leaves no room, and removes nothing.
    assert reserve(pool_worker, 1, max_workers=2) == []
    assert join(pool_worker, "b", max_workers=2) is False
    assert size(pool_worker) == {"live": 1, "reserved": 3}


def test_a_caller_whose_snapshot_misses_a_change_of_the_pool_is_refused_not_miscounted(
    db: Database, pool_worker: Conn, admin: Conn
) -> None:
    """A REPEATABLE READ transaction cannot count places committed after its snapshot."""
    with db.connect(postgres.DUTY_WORKER) as stale:
        stale.execute("begin isolation level repeatable read")
        stale.execute("select app.worker_pool_size()")  # takes the snapshot
        assert join(pool_worker, "a", max_workers=1)

        with raises_sqlstate("40001"):
            join(stale, "b", max_workers=1)
        stale.execute("rollback")

    assert [p["owner"] for p in places(admin)] == ["a"]


# Reservations -----------------------------------------------------------------------------


def test_an_invocation_takes_the_place_reserved_for_it_even_in_a_full_pool(
    pool_worker: Conn, admin: Conn
) -> None:
    (place,) = reserve(pool_worker, 1, max_workers=1)

    assert join(pool_worker, "started", max_workers=1, reservation=place, reason="fanout")

    (row,) = places(admin)
    assert (row["id"], row["owner"], row["reason"]) == (place, "started", "fanout")
    assert size(pool_worker) == {"live": 1, "reserved": 0}


def test_a_second_delivery_of_one_reservation_gets_only_free_room(
    pool_worker: Conn, admin: Conn
) -> None:
    (place,) = reserve(pool_worker, 1, max_workers=2)
    assert join(pool_worker, "first-delivery", max_workers=2, reservation=place)

    # The same event again (Lambda delivered it twice, or retried it): the pool has
    # room for one more, so it joins as any invocation would, in a place of its own.
    assert join(pool_worker, "second-delivery", max_workers=2, reservation=place)
    # A third delivery finds the pool full: it must return without claiming.
    assert join(pool_worker, "third-delivery", max_workers=2, reservation=place) is False

    assert {p["owner"] for p in places(admin)} == {"first-delivery", "second-delivery"}
    assert [p["owner"] for p in places(admin) if p["id"] == place] == ["first-delivery"]


def test_a_duplicate_delivery_into_a_full_pool_is_refused(pool_worker: Conn) -> None:
    (place,) = reserve(pool_worker, 1, max_workers=1)
    assert join(pool_worker, "first-delivery", max_workers=1, reservation=place)

    assert join(pool_worker, "duplicate", max_workers=1, reservation=place) is False


def test_releasing_a_reservation_frees_its_room_but_never_a_taken_place(
    pool_worker: Conn, admin: Conn
) -> None:
    taken, failed = reserve(pool_worker, 2, max_workers=2)
    assert join(pool_worker, "started", max_workers=2, reservation=taken)

    release(pool_worker, failed)
    release(pool_worker, taken)  # its invocation did start: the place stays
    release(pool_worker, uuid.uuid4())  # unknown: nothing to do

    assert [(p["id"], p["owner"]) for p in places(admin)] == [(taken, "started")]
    assert join(pool_worker, "next", max_workers=2)


def test_an_owner_already_in_the_pool_refreshes_its_place_and_consumes_its_reservation(
    pool_worker: Conn, admin: Conn
) -> None:
    assert join(pool_worker, "env-1", max_workers=2, expires_in=timedelta(seconds=30))
    before = places(admin)[0]["expires_at"]
    (place,) = reserve(pool_worker, 1, max_workers=2)

    assert join(pool_worker, "env-1", max_workers=2, reservation=place, expires_in=LONG)

    (row,) = places(admin)
    assert row["owner"] == "env-1"
    assert row["expires_at"] > before
    assert row["id"] != place


# Expiry and leaving -------------------------------------------------------------------------


def test_a_killed_invocations_expired_place_frees_its_room(
    pool_worker: Conn, admin: Conn
) -> None:
    assert join(pool_worker, "killed", max_workers=1)
    assert join(pool_worker, "waiting", max_workers=1) is False

    expire(admin, owner="killed")  # it never left: its deadline passed

    assert size(pool_worker) == {"live": 0, "reserved": 0}
    assert join(pool_worker, "waiting", max_workers=1)
    assert [p["owner"] for p in places(admin)] == ["waiting"]


def test_an_expired_reservation_frees_its_room_and_a_late_event_gets_only_free_room(
    pool_worker: Conn, admin: Conn
) -> None:
    (late,) = reserve(pool_worker, 1, max_workers=1)
    expire(admin, place=late)  # its event never arrived within the hold

    (fresh,) = reserve(pool_worker, 1, max_workers=1)
    assert join(pool_worker, "late-event", max_workers=1, reservation=late) is False
    assert join(pool_worker, "fresh-event", max_workers=1, reservation=fresh)

    assert [(p["id"], p["owner"]) for p in places(admin)] == [(fresh, "fresh-event")]


def test_leaving_frees_the_place_at_once(pool_worker: Conn, admin: Conn) -> None:
    assert join(pool_worker, "a", max_workers=1)
    assert join(pool_worker, "b", max_workers=1) is False

    leave(pool_worker, "a")
    leave(pool_worker, "a")  # again, or an owner that never joined: nothing to do

    assert join(pool_worker, "b", max_workers=1)
    assert [p["owner"] for p in places(admin)] == ["b"]


def test_the_pool_size_counts_live_and_reserved_places_and_leaves_out_expired_ones(
    pool_worker: Conn, db: Database, admin: Conn
) -> None:
    assert join(pool_worker, "a", max_workers=10)
    assert join(pool_worker, "b", max_workers=10)
    reserve(pool_worker, 3, max_workers=10)
    expire(admin, owner="b")

    assert size(pool_worker) == {"live": 1, "reserved": 3}
    with db.connect(postgres.OPERATOR) as operator:
        assert size(operator) == {"live": 1, "reserved": 3}


# Wake on enqueue ----------------------------------------------------------------------------


def test_a_thousand_wakes_on_an_idle_pool_reserve_exactly_one_place(
    producer: Conn, admin: Conn
) -> None:
    answers = [wake(producer) for _ in range(1000)]

    woken = [a for a in answers if a is not None]
    assert len(woken) == 1
    assert answers[0] == woken[0]
    (row,) = places(admin)
    assert (row["id"], row["owner"], row["reason"]) == (woken[0], None, "wake")


def test_a_thousand_wakes_from_four_connections_at_once_reserve_exactly_one_place(
    db: Database, admin: Conn
) -> None:
    def stampede(conn: Conn, i: int) -> list[uuid.UUID]:
        return [p for p in (wake(conn) for _ in range(250)) if p is not None]

    woken = [p for found in in_parallel(db, postgres.PRODUCER, 4, stampede) for p in found]

    assert len(woken) == 1
    assert [p["id"] for p in places(admin)] == woken


def test_no_wake_reserves_a_place_while_a_worker_holds_one(
    pool_worker: Conn, producer: Conn, admin: Conn
) -> None:
    assert join(pool_worker, "polling", max_workers=4)

    assert [p for p in (wake(producer) for _ in range(1000)) if p is not None] == []
    assert len(places(admin)) == 1


def test_after_a_wake_no_other_is_reserved_until_the_debounce_has_passed(
    producer: Conn, pool_worker: Conn, admin: Conn
) -> None:
    first = wake(producer)
    assert first is not None
    release(pool_worker, first)  # its invoke failed: the pool is empty again

    # Within the debounce: nothing, however many enqueues ask.
    assert [p for p in (wake(producer) for _ in range(1000)) if p is not None] == []
    assert places(admin) == []

    admin.execute("update app.worker_pool_state"
                  " set last_wake_at = last_wake_at - interval '2 seconds'")
    second = wake(producer)
    assert second is not None
    assert second != first
    assert wake(producer) is None


def test_a_wake_finds_the_room_of_an_expired_place(producer: Conn, pool_worker: Conn,
                                                    admin: Conn) -> None:
    assert join(pool_worker, "killed", max_workers=1)
    expire(admin, owner="killed")

    place = wake(producer, max_workers=1)

    assert place is not None
    assert [p["id"] for p in places(admin)] == [place]


def test_a_wake_does_not_wait_for_a_change_of_the_pool_under_way(
    db: Database, producer: Conn, admin: Conn
) -> None:
    """Another session holds the state row (a join or reservation in flight): the wake
    answers NULL at once instead of queueing behind it. A wait would end the statement
    by its timeout (57014) and fail the test."""
    producer.execute("set statement_timeout = '5s'")
    with db.connect(None) as holder:
        holder.execute("begin")
        holder.execute("select * from app.worker_pool_state for update")

        assert wake(producer) is None

        holder.execute("rollback")
    assert wake(producer) is not None


def test_workers_and_tenant_bound_producers_may_wake_too(db: Database) -> None:
    with db.connect(postgres.TENANT_PRODUCER) as tenant_producer:
        assert wake(tenant_producer) is not None
    with db.connect(postgres.DUTY_WORKER) as worker:
        assert wake(worker) is None  # the place just reserved is not taken yet


# Bad arguments ------------------------------------------------------------------------------

BAD_CALLS = {
    "join: blank owner": ("select app.join_worker_pool('\u200b', 'schedule', null, 4,"
                          " '1 minute')", "p_owner must be a non-blank text"),
    "join: NULL owner": ("select app.join_worker_pool(null, 'schedule', null, 4, '1 minute')",
                         "p_owner must be a non-blank text"),
    "join: unknown reason": ("select app.join_worker_pool('w', 'cron', null, 4, '1 minute')",
                             "p_reason must be one of schedule, manual, fanout, wake"
                             " (got 'cron')"),
    "join: NULL reason": ("select app.join_worker_pool('w', null, null, 4, '1 minute')",
                          "p_reason must be one of schedule, manual, fanout, wake (got NULL)"),
    "join: maximum 0": ("select app.join_worker_pool('w', 'wake', null, 0, '1 minute')",
                        "p_max_workers must be between 1 and 1000 (got 0)"),
    "join: maximum NULL": ("select app.join_worker_pool('w', 'wake', null, null, '1 minute')",
                           "p_max_workers must be between 1 and 1000 (got NULL)"),
    "join: no expiry": ("select app.join_worker_pool('w', 'wake', null, 4, '0 seconds')",
                        "p_expires_in must be between"),
    "join: expiry over a day": ("select app.join_worker_pool('w', 'wake', null, 4, '2 days')",
                                "p_expires_in must be between"),
    "leave: blank owner": ("select app.leave_worker_pool(E'\\t')",
                           "p_owner must be a non-blank text"),
    "reserve: negative": ("select * from app.reserve_worker_places(-1, 4, '90 seconds')",
                          "p_wanted must be between 0 and 1000 (got -1)"),
    "reserve: too many": ("select * from app.reserve_worker_places(1001, 4, '90 seconds')",
                          "p_wanted must be between 0 and 1000 (got 1001)"),
    "reserve: maximum over 1000": ("select * from app.reserve_worker_places(1, 1001,"
                                   " '90 seconds')",
                                   "p_max_workers must be between 1 and 1000 (got 1001)"),
    "reserve: NULL hold": ("select * from app.reserve_worker_places(1, 4, null)",
                           "p_hold must be between"),
    "release: NULL place": ("select app.release_worker_place(null)",
                            "p_place is required (got NULL)"),
    "wake: negative debounce": ("select app.wake_worker_place('-1 second', '90 seconds', 4)",
                                "p_debounce must be between"),
    "wake: debounce over an hour": ("select app.wake_worker_place('2 hours', '90 seconds', 4)",
                                    "p_debounce must be between"),
    "wake: no hold": ("select app.wake_worker_place('1 second', '0 seconds', 4)",
                      "p_hold must be between"),
    "wake: maximum 0": ("select app.wake_worker_place('1 second', '90 seconds', 0)",
                        "p_max_workers must be between 1 and 1000 (got 0)"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_a_bad_argument_is_refused_with_22023_naming_it_and_changes_nothing(
    case: str, pool_worker: Conn, admin: Conn
) -> None:
    assert join(pool_worker, "present", max_workers=4)
    before = places(admin), admin.execute("select * from app.worker_pool_state").fetchall()
    statement, message = BAD_CALLS[case]

    with raises_sqlstate("22023", message):
        pool_worker.execute(statement.encode())

    after = places(admin), admin.execute("select * from app.worker_pool_state").fetchall()
    assert after == before


def test_runtime_roles_cannot_touch_the_pool_tables(pool_worker: Conn, producer: Conn) -> None:
    """Only the functions count: a login that could insert or delete places could start
    invocations past the maximum."""
    for conn in (pool_worker, producer):
        for statement in ("select * from app.worker_pool",
                          "delete from app.worker_pool",
                          "update app.worker_pool_state set last_wake_at = null"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
