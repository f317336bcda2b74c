"""The worker pool (sql/functions/pool.sql): places of running and starting worker
invocations, never more than the owner's maximum (plus the one extra place of a
schedule tick), whoever asks, whatever they ask for and however they race.

Each call runs as the role that makes it in production: a worker login (leaseq_worker)
joins, leaves, reserves and releases; a producer login wakes; the schema owner sets the
limits. The administrator only moves expiry times into the past, as time passing or a
killed invocation would.
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
from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate
from psycopg import sql

from tests.conftest import Database
from tests.sql.calls import raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

T = TypeVar("T")

LONG = timedelta(minutes=5)
HOLD = timedelta(seconds=90)
#: What a caller asks for when it wants everything: the old contract's widest values.
WIDEST = 1000
A_DAY = timedelta(days=1)


@pytest.fixture
def pool_worker(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.DUTY_WORKER) as conn:
        yield conn


@pytest.fixture
def tenant_producer(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.TENANT_PRODUCER) as conn:
        yield conn


def set_limits(owner: Conn, *, max_workers: int | None = None,
               start_hold: timedelta | None = None,
               wake_debounce: timedelta | None = None) -> dict[str, Any]:
    """The owner sets the pool's limits (NULL keeps one); the limits now in force."""
    row = owner.execute("select * from app.set_worker_pool_limits(%s, %s, %s)",
                        (max_workers, start_hold, wake_debounce)).fetchone()
    assert row is not None
    return dict(row)


def join(conn: Conn, owner: str, *, max_workers: int = WIDEST,
         reservation: uuid.UUID | None = None, reason: str = "fanout",
         expires_in: timedelta = LONG) -> bool:
    row = conn.execute("select app.join_worker_pool(%s, %s, %s, %s, %s) as joined",
                       (owner, reason, reservation, max_workers, expires_in)).fetchone()
    assert row is not None
    return bool(row["joined"])


def tick(conn: Conn, owner: str, **options: Any) -> bool:
    """A schedule tick's join."""
    return join(conn, owner, reason="schedule", **options)


def leave(conn: Conn, owner: str) -> None:
    conn.execute("select app.leave_worker_pool(%s)", (owner,))


def reserve(conn: Conn, wanted: int, *, max_workers: int = WIDEST,
            hold: timedelta = HOLD) -> list[uuid.UUID]:
    rows = conn.execute("select r.place from app.reserve_worker_places(%s, %s, %s) as r(place)",
                        (wanted, max_workers, hold)).fetchall()
    return [r["place"] for r in rows]


def release(conn: Conn, place: uuid.UUID) -> None:
    conn.execute("select app.release_worker_place(%s)", (place,))


def wake(conn: Conn) -> uuid.UUID | None:
    row = conn.execute("select app.wake_worker_place() as place").fetchone()
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


def wakes(admin: Conn) -> dict[str, dict[str, Any]]:
    """Each login's wake state, by login name."""
    rows = admin.execute("select waker::text as waker, woken_at, ticket, ticket_expires_at"
                         " from app.worker_wakes").fetchall()
    return {row["waker"]: row for row in rows}


def expire(admin: Conn, *, owner: str | None = None, place: uuid.UUID | None = None) -> None:
    """Move a place's expiry into the past: its invocation was killed, or its event
    never arrived."""
    admin.execute("update app.worker_pool set expires_at = clock_timestamp() - interval '1 second'"
                  " where owner = %s or id = %s", (owner, place))


def pass_debounce(admin: Conn, login: str) -> None:
    """Move a login's last wake back past any debounce (at most an hour), as time
    passing would."""
    admin.execute("update app.worker_wakes set woken_at = woken_at - interval '2 hours'"
                  " where waker = %s::regrole", (login,))


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
    db: Database, owner: Conn, admin: Conn
) -> None:
    """The owner's maximum, whatever maximum the callers ask for."""
    maximum = 5
    set_limits(owner, max_workers=maximum)

    def race(conn: Conn, i: int) -> tuple[int, int]:
        joined = reserved = 0
        for n in range(25):
            if (i + n) % 3:
                joined += join(conn, f"racer-{i}-{n}", max_workers=WIDEST)
            else:
                reserved += len(reserve(conn, 2, max_workers=WIDEST))
        return joined, reserved

    results = in_parallel(db, postgres.DUTY_WORKER, 8, race)

    joined = sum(r[0] for r in results)
    reserved = sum(r[1] for r in results)
    assert joined + reserved == maximum
    assert len(places(admin)) == maximum
    assert size(admin) == {"live": joined, "reserved": reserved}


def test_invocations_joining_and_leaving_at_once_never_hold_more_than_the_maximum(
    db: Database, owner: Conn, admin: Conn
) -> None:
    """Eight connections join, leave and reserve in a loop; a ninth keeps counting."""
    maximum = 3
    set_limits(owner, max_workers=maximum)
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
            owner_id = f"churn-{i}-{n}"
            if join(conn, owner_id):
                joins += 1
                leave(conn, owner_id)
            for place in reserve(conn, 1):
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


def test_a_full_pool_refuses_a_join_and_a_reservation(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=2)
    assert join(pool_worker, "a")
    assert reserve(pool_worker, 5) != []

    assert join(pool_worker, "b") is False
    assert reserve(pool_worker, 1) == []
    assert len(places(admin)) == 2


def test_a_callers_lower_maximum_narrows_the_owners_and_removes_nothing(
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


# The schedule's tick ------------------------------------------------------------------------


def test_a_tick_in_a_pool_full_of_reservations_takes_the_oldest_and_its_start_is_refused(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    """Starts asked for and never arrived (lost events) must not keep the schedule from
    draining until their hold ends; the count stays at the maximum."""
    set_limits(owner, max_workers=3)
    assert join(pool_worker, "a")
    (older,) = reserve(pool_worker, 1)
    (newer,) = reserve(pool_worker, 1)

    assert tick(pool_worker, "tick")

    owners = {p["id"]: p["owner"] for p in places(admin)}
    assert len(owners) == 3
    assert owners[older] == "tick"
    assert owners[newer] is None
    # The start the older reservation was for arrives late: no room is left for it.
    assert join(pool_worker, "late", reservation=older) is False
    assert join(pool_worker, "arrived", reservation=newer)
    assert size(pool_worker) == {"live": 3, "reserved": 0}


def test_a_tick_in_a_pool_full_of_running_invocations_takes_the_one_extra_place(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    """Every place held by a running invocation: the tick still drains, in the one
    extra place. Fan-out counts that place too, so it never starts beyond the maximum,
    and a second tick meanwhile is refused: the pool never holds more than max + 1."""
    set_limits(owner, max_workers=2)
    assert join(pool_worker, "running-1")
    assert join(pool_worker, "running-2")

    assert tick(pool_worker, "tick")
    assert tick(pool_worker, "tick-2") is False
    assert join(pool_worker, "manual", reason="manual") is False
    assert reserve(pool_worker, 1) == []
    assert join(pool_worker, "fanout") is False

    assert [(p["owner"], p["extra"]) for p in places(admin)] == [
        ("running-1", False), ("running-2", False), ("tick", True)]
    # The extra place is the tick's until it leaves; meanwhile places that free up go
    # to whoever comes first, and the pool stays within the maximum + 1.
    leave(pool_worker, "running-1")
    assert reserve(pool_worker, 5) == []  # 2 places for a maximum of 2: no room
    leave(pool_worker, "tick")
    assert tick(pool_worker, "tick-3")
    assert [(p["owner"], p["extra"]) for p in places(admin)] == [
        ("running-2", False), ("tick-3", False)]


def test_a_tick_joins_a_pool_that_holds_more_places_than_a_lowered_maximum(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    """The owner lowers the maximum below the places running invocations hold (or a
    worker login filled the pool): a tick still gets in, nothing else does."""
    for n in range(4):
        assert join(pool_worker, f"running-{n}")
    set_limits(owner, max_workers=2)

    assert tick(pool_worker, "tick")
    assert tick(pool_worker, "tick-2") is False
    assert reserve(pool_worker, 1) == []
    assert join(pool_worker, "fanout") is False
    assert sum(p["extra"] for p in places(admin)) == 1

    expire(admin, owner="tick")  # its invocation was killed
    assert tick(pool_worker, "tick-3")
    assert [p["owner"] for p in places(admin) if p["extra"]] == ["tick-3"]


def test_the_database_keeps_at_most_one_extra_place_and_only_for_a_tick(
    pool_worker: Conn, owner: Conn
) -> None:
    """The bound holds in the table, not only in the function: a second extra place,
    or one held by a start that is not a tick, is refused by the schema itself."""
    set_limits(owner, max_workers=1)
    assert join(pool_worker, "running")
    assert tick(pool_worker, "tick")

    with raises_sqlstate("23505"):
        owner.execute("insert into app.worker_pool (owner, reason, expires_at, extra)"
                      " values ('second', 'schedule', clock_timestamp() + interval '1 minute',"
                      " true)")
    owner.execute("delete from app.worker_pool where extra")
    for owner_id, reason in (("fan", "fanout"), (None, "schedule")):
        with raises_sqlstate("23514"):
            owner.execute("insert into app.worker_pool (owner, reason, expires_at, extra)"
                          " values (%s, %s, clock_timestamp() + interval '1 minute', true)",
                          (owner_id, reason))


# Reservations -----------------------------------------------------------------------------


def test_an_invocation_takes_the_place_reserved_for_it_even_in_a_full_pool(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=1)
    (place,) = reserve(pool_worker, 1)

    assert join(pool_worker, "started", reservation=place)

    (row,) = places(admin)
    assert (row["id"], row["owner"], row["reason"]) == (place, "started", "fanout")
    assert size(pool_worker) == {"live": 1, "reserved": 0}


def test_a_second_delivery_of_one_reservation_gets_only_free_room(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=2)
    (place,) = reserve(pool_worker, 1)
    assert join(pool_worker, "first-delivery", reservation=place)

    # The same event again (Lambda delivered it twice, or retried it): the pool has
    # room for one more, so it joins as any invocation would, in a place of its own.
    assert join(pool_worker, "second-delivery", reservation=place)
    # A third delivery finds the pool full: it must return without claiming.
    assert join(pool_worker, "third-delivery", reservation=place) is False

    assert {p["owner"] for p in places(admin)} == {"first-delivery", "second-delivery"}
    assert [p["owner"] for p in places(admin) if p["id"] == place] == ["first-delivery"]


def test_a_duplicate_delivery_into_a_full_pool_is_refused(pool_worker: Conn, owner: Conn) -> None:
    set_limits(owner, max_workers=1)
    (place,) = reserve(pool_worker, 1)
    assert join(pool_worker, "first-delivery", reservation=place)

    assert join(pool_worker, "duplicate", reservation=place) is False


def test_releasing_a_reservation_frees_its_room_but_never_a_taken_place(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=2)
    taken, failed = reserve(pool_worker, 2)
    assert join(pool_worker, "started", reservation=taken)

    release(pool_worker, failed)
    release(pool_worker, taken)  # its invocation did start: the place stays
    release(pool_worker, uuid.uuid4())  # unknown: nothing to do

    assert [(p["id"], p["owner"]) for p in places(admin)] == [(taken, "started")]
    assert join(pool_worker, "next")


def test_an_owner_already_in_the_pool_refreshes_its_place_and_consumes_its_reservation(
    pool_worker: Conn, admin: Conn
) -> None:
    assert join(pool_worker, "env-1", expires_in=timedelta(seconds=30))
    before = places(admin)[0]["expires_at"]
    (place,) = reserve(pool_worker, 1)

    assert join(pool_worker, "env-1", reservation=place, expires_in=LONG)

    (row,) = places(admin)
    assert row["owner"] == "env-1"
    assert row["expires_at"] > before
    assert row["id"] != place


# Expiry and leaving -------------------------------------------------------------------------


def test_a_killed_invocations_expired_place_frees_its_room(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=1)
    assert join(pool_worker, "killed")
    assert join(pool_worker, "waiting") is False

    expire(admin, owner="killed")  # it never left: its deadline passed

    assert size(pool_worker) == {"live": 0, "reserved": 0}
    assert join(pool_worker, "waiting")
    assert [p["owner"] for p in places(admin)] == ["waiting"]


def test_an_expired_reservation_frees_its_room_and_a_late_event_gets_only_free_room(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=1)
    (late,) = reserve(pool_worker, 1)
    expire(admin, place=late)  # its event never arrived within the hold

    (fresh,) = reserve(pool_worker, 1)
    assert join(pool_worker, "late-event", reservation=late) is False
    assert join(pool_worker, "fresh-event", reservation=fresh)

    assert [(p["id"], p["owner"]) for p in places(admin)] == [(fresh, "fresh-event")]


def test_leaving_frees_the_place_at_once(pool_worker: Conn, owner: Conn, admin: Conn) -> None:
    set_limits(owner, max_workers=1)
    assert join(pool_worker, "a")
    assert join(pool_worker, "b") is False

    leave(pool_worker, "a")
    leave(pool_worker, "a")  # again, or an owner that never joined: nothing to do

    assert join(pool_worker, "b")
    assert [p["owner"] for p in places(admin)] == ["b"]


def test_the_pool_size_counts_live_and_reserved_places_and_leaves_out_expired_ones(
    pool_worker: Conn, owner: Conn, db: Database, admin: Conn
) -> None:
    set_limits(owner, max_workers=10)
    assert join(pool_worker, "a")
    assert join(pool_worker, "b")
    reserve(pool_worker, 3)
    expire(admin, owner="b")

    assert size(pool_worker) == {"live": 1, "reserved": 3}
    with db.connect(postgres.OPERATOR) as operator:
        assert size(operator) == {"live": 1, "reserved": 3}


# The owner's limits -------------------------------------------------------------------------


def test_a_new_or_upgraded_database_starts_with_todays_limits(owner: Conn) -> None:
    """Migration 0018 fills the one row with what the pool used before: the template's
    MaxWorkers (4), a hold of 90 s and a debounce of 1 s."""
    row = owner.execute("select max_workers, start_hold, wake_debounce from app.settings"
                        ).fetchone()
    assert row == {"max_workers": 4, "start_hold": HOLD,
                   "wake_debounce": timedelta(seconds=1)}


def test_an_upgraded_database_keeps_its_places_and_its_pool_keeps_working(
    fresh_database: Callable[[], Database],
) -> None:
    """A pool in use when 0018 runs: its places stay (none of them extra), the settings
    get today's limits, and joins, ticks and wakes go on."""
    database = fresh_database()
    before = [m for m in load_migrations() if m.version < 18]
    with connect(database.owner_dsn) as conn:
        migrate(conn, before, [])
    with database.connect(postgres.OWNER) as conn:
        conn.execute("insert into app.worker_pool (owner, reason, expires_at) values"
                     " ('running', 'schedule', clock_timestamp() + interval '1 minute'),"
                     " (null, 'wake', clock_timestamp() + interval '1 minute')")
        conn.execute("update app.worker_pool_state set last_wake_at = clock_timestamp()")
    with connect(database.owner_dsn) as conn:
        migrate(conn)
    postgres.grant_group_roles(database.cluster)

    with database.connect(postgres.OWNER) as owner:
        assert [(p["owner"], p["extra"]) for p in places(owner)] == [
            ("running", False), (None, False)]
        assert owner.execute("select max_workers, start_hold, wake_debounce from app.settings"
                             ).fetchone() == {"max_workers": 4, "start_hold": HOLD,
                                              "wake_debounce": timedelta(seconds=1)}
    with database.connect(postgres.DUTY_WORKER) as worker:
        assert join(worker, "fan")
        assert join(worker, "fan-2")  # four places: the maximum
        assert join(worker, "fan-3") is False
        assert tick(worker, "tick")  # takes the old wake's reservation
        assert tick(worker, "tick-2")  # the extra place
        for owner_id in ("running", "fan", "fan-2", "tick", "tick-2"):
            leave(worker, owner_id)
    with database.connect(postgres.OWNER) as owner:
        assert places(owner) == []
    with database.connect(postgres.PRODUCER) as producer:
        assert wake(producer) is not None


def test_a_worker_asking_for_a_wider_maximum_or_a_longer_hold_gets_the_owners(
    pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, max_workers=3, start_hold=timedelta(seconds=40))

    reserved = reserve(pool_worker, 10, max_workers=WIDEST, hold=A_DAY)

    assert len(reserved) == 3
    assert {p["expires_at"] - p["created_at"] for p in places(admin)} == {
        timedelta(seconds=40)}


def test_a_callers_shorter_hold_is_kept(pool_worker: Conn, admin: Conn) -> None:
    reserve(pool_worker, 2, hold=timedelta(seconds=10))

    assert {p["expires_at"] - p["created_at"] for p in places(admin)} == {
        timedelta(seconds=10)}


def test_the_owner_sets_the_limits_one_at_a_time_and_reads_them_back(owner: Conn) -> None:
    assert set_limits(owner, max_workers=12) == {
        "max_workers": 12, "start_hold": HOLD, "wake_debounce": timedelta(seconds=1)}
    assert set_limits(owner, start_hold=timedelta(minutes=2),
                      wake_debounce=timedelta(0)) == {
        "max_workers": 12, "start_hold": timedelta(minutes=2), "wake_debounce": timedelta(0)}
    assert set_limits(owner) == {
        "max_workers": 12, "start_hold": timedelta(minutes=2), "wake_debounce": timedelta(0)}


BAD_LIMITS = {
    "maximum below 0": ((-1, None, None), "p_max_workers must be between 0 and 1000 (got -1)"),
    "maximum over 1000": ((1001, None, None),
                          "p_max_workers must be between 0 and 1000 (got 1001)"),
    "hold of a day": ((None, A_DAY, None), "p_start_hold must be between 00:00:01 and 00:15:00"),
    "no hold": ((None, timedelta(0), None), "p_start_hold must be between"),
    "negative debounce": ((None, None, timedelta(seconds=-1)),
                          "p_wake_debounce must be between 00:00:00 and 01:00:00"),
    "debounce over an hour": ((None, None, timedelta(hours=2)), "p_wake_debounce must be between"),
}


@pytest.mark.parametrize("case", BAD_LIMITS)
def test_a_bad_limit_is_refused_with_22023_naming_it_and_changes_nothing(
    case: str, owner: Conn
) -> None:
    before = owner.execute("select * from app.settings").fetchall()
    arguments, message = BAD_LIMITS[case]

    with raises_sqlstate("22023", message):
        owner.execute("select * from app.set_worker_pool_limits(%s, %s, %s)", arguments)

    assert owner.execute("select * from app.settings").fetchall() == before


def test_the_table_itself_bounds_the_hold_to_minutes_whoever_writes_it(owner: Conn) -> None:
    for column, value in (("start_hold", A_DAY), ("max_workers", 1001),
                          ("wake_debounce", timedelta(hours=2))):
        with raises_sqlstate("23514"):
            owner.execute(sql.SQL("update app.settings set {} = %s").format(
                sql.Identifier(column)), (value,))


@pytest.mark.parametrize("role", [postgres.DUTY_WORKER, postgres.PRODUCER,
                                  postgres.TENANT_PRODUCER, postgres.OPERATOR, postgres.WORKER])
def test_no_runtime_login_may_read_or_set_the_limits(db: Database, role: str) -> None:
    with db.connect(role) as conn:
        for statement in ("select * from app.set_worker_pool_limits(1000, '1 day', '0 s')",
                          "select * from app.pool_limits()",
                          "update app.settings set max_workers = 1000",
                          "select * from app.settings"):
            with raises_sqlstate("42501"):
                conn.execute(statement.encode())


def test_with_the_owners_maximum_at_zero_only_a_tick_joins_and_nobody_wakes(
    pool_worker: Conn, producer: Conn, owner: Conn
) -> None:
    set_limits(owner, max_workers=0)

    assert wake(producer) is None
    assert reserve(pool_worker, 1) == []
    assert join(pool_worker, "fanout") is False
    assert tick(pool_worker, "tick")  # the extra place: the schedule alone drains
    assert tick(pool_worker, "tick-2") is False


def test_without_the_settings_row_the_pool_refuses_with_55000_saying_how_to_restore_it(
    pool_worker: Conn, producer: Conn, owner: Conn
) -> None:
    owner.execute("delete from app.settings")
    try:
        for conn, statement in (
                (pool_worker, "select app.join_worker_pool('w', 'schedule', null, 4,"
                              " '1 minute')"),
                (pool_worker, "select * from app.reserve_worker_places(1, 4, '90 seconds')"),
                (producer, "select app.wake_worker_place()"),
                (owner, "select * from app.set_worker_pool_limits(4)")):
            with raises_sqlstate("55000", "app.settings has no row"):
                conn.execute(statement.encode())
    finally:
        owner.execute("insert into app.settings default values")


# The attacks of a stolen login (issue: fan-out limits the caller chose) -------------------


def test_a_worker_login_reserving_1000_places_for_a_day_gets_the_owners_maximum_for_the_owners_hold_and_the_tick_still_joins(  # noqa: E501
    pool_worker: Conn, producer: Conn, admin: Conn
) -> None:
    """Before: 1,000 places held for a day, and the tick's join returned false, so the
    schedule stopped draining. Now the owner's 4 places for the owner's 90 s, and the
    tick takes the oldest of them."""
    reserved = reserve(pool_worker, WIDEST, max_workers=WIDEST, hold=A_DAY)

    assert len(reserved) == 4
    assert {p["expires_at"] - p["created_at"] for p in places(admin)} == {HOLD}
    assert reserve(pool_worker, WIDEST, max_workers=WIDEST, hold=A_DAY) == []
    assert tick(pool_worker, "tick", max_workers=8)
    assert tick(pool_worker, "tick-2", max_workers=8)  # every reservation gives way
    assert len(places(admin)) == 4
    assert [p["owner"] for p in places(admin)][:2] == ["tick", "tick-2"]


def test_a_worker_login_filling_the_pool_with_live_places_cannot_hold_them_for_a_day_and_the_tick_still_joins(  # noqa: E501
    pool_worker: Conn, admin: Conn
) -> None:
    with raises_sqlstate("22023", "p_expires_in must be between 00:00:01 and 00:16:00"):
        join(pool_worker, "squatter", expires_in=A_DAY)
    for n in range(WIDEST // 100):
        join(pool_worker, f"squatter-{n}", expires_in=timedelta(minutes=16))
    assert size(pool_worker) == {"live": 4, "reserved": 0}

    assert tick(pool_worker, "tick")
    assert [(p["owner"], p["extra"]) for p in places(admin)][-1] == ("tick", True)
    assert max(p["expires_at"] - p["created_at"] for p in places(admin)) <= timedelta(
        minutes=16)


def test_a_tenant_producer_can_no_longer_choose_the_hold_the_debounce_or_the_maximum_of_a_wake(
    tenant_producer: Conn, admin: Conn
) -> None:
    """Before: wake_worker_place('0 s', '1 day', 1000) reserved a place for a day, and
    every later wake of every tenant answered NULL."""
    with raises_sqlstate("42883"):
        tenant_producer.execute("select app.wake_worker_place('0 s', '1 day', 1000)")

    ticket = wake(tenant_producer)

    assert ticket is not None
    assert places(admin) == []  # a wake's ticket holds no room of the pool
    (state,) = wakes(admin).values()
    assert state["ticket"] == ticket
    assert state["ticket_expires_at"] - state["woken_at"] == HOLD


def test_a_tenant_producers_wakes_never_turn_the_wake_off_for_other_logins(
    tenant_producer: Conn, producer: Conn, pool_worker: Conn, admin: Conn
) -> None:
    """Its ticket, never used, and its wakes after every enqueue hold back only its
    own login; its own wakes work again once the ticket's hold and the debounce end."""
    assert wake(tenant_producer) is not None
    assert [p for p in (wake(tenant_producer) for _ in range(100)) if p] == []

    woken = wake(producer)
    assert woken is not None
    assert join(pool_worker, "woken", reason="wake", reservation=woken)
    leave(pool_worker, "woken")

    admin.execute("update app.worker_wakes set ticket_expires_at = clock_timestamp()"
                  " where waker = %s::regrole", (postgres.TENANT_PRODUCER,))
    pass_debounce(admin, postgres.TENANT_PRODUCER)
    assert wake(tenant_producer) is not None


def test_a_wake_left_open_in_a_producers_transaction_holds_back_neither_other_wakes_nor_the_pool(
    db: Database, producer: Conn, pool_worker: Conn
) -> None:
    """A producer that wakes inside a transaction and never commits (or sleeps in the
    statement) holds its own login's lock only: a wake takes no lock of the pool's, so
    another login wakes and the tick joins without waiting. A wait would end the
    statements by their timeout (57014) and fail the test."""
    producer.execute("set statement_timeout = '5s'")
    pool_worker.execute("set statement_timeout = '5s'")
    with db.connect(postgres.TENANT_PRODUCER) as holder:
        holder.execute("begin")
        held = wake(holder)
        assert held is not None

        assert wake(producer) is not None
        assert reserve(pool_worker, 1) != []
        assert tick(pool_worker, "tick")
        # Even an invocation started for the held ticket joins without waiting.
        assert join(pool_worker, "woken", reason="wake", reservation=held)
        holder.execute("rollback")


# Wake on enqueue ----------------------------------------------------------------------------


def test_a_thousand_wakes_on_an_idle_pool_give_exactly_one_ticket(
    producer: Conn, admin: Conn
) -> None:
    answers = [wake(producer) for _ in range(1000)]

    woken = [a for a in answers if a is not None]
    assert len(woken) == 1
    assert answers[0] == woken[0]
    assert [row["ticket"] for row in wakes(admin).values()] == woken


def test_a_thousand_wakes_from_four_connections_of_one_login_at_once_give_exactly_one_ticket(
    db: Database, admin: Conn
) -> None:
    def stampede(conn: Conn, i: int) -> list[uuid.UUID]:
        return [p for p in (wake(conn) for _ in range(250)) if p is not None]

    woken = [p for found in in_parallel(db, postgres.PRODUCER, 4, stampede) for p in found]

    assert len(woken) == 1
    assert [row["ticket"] for row in wakes(admin).values()] == woken


def test_no_wake_is_given_while_a_worker_holds_a_place_or_a_fan_out_is_starting(
    pool_worker: Conn, producer: Conn, admin: Conn
) -> None:
    assert join(pool_worker, "polling")
    assert [p for p in (wake(producer) for _ in range(100)) if p is not None] == []

    leave(pool_worker, "polling")
    reserve(pool_worker, 1)  # a fan-out's start on its way
    assert wake(producer) is None
    assert wakes(admin) == {}


def test_after_a_wake_no_other_is_given_until_the_debounce_has_passed(
    producer: Conn, owner: Conn, admin: Conn
) -> None:
    set_limits(owner, wake_debounce=timedelta(minutes=1))  # the loop below fits in it
    first = wake(producer)
    assert first is not None
    release(producer, first)  # its invoke failed: the ticket is given back

    # Within the debounce: nothing, however many enqueues ask.
    assert [p for p in (wake(producer) for _ in range(1000)) if p is not None] == []
    assert wakes(admin)[postgres.PRODUCER]["ticket"] is None

    pass_debounce(admin, postgres.PRODUCER)
    second = wake(producer)
    assert second is not None
    assert second != first
    assert wake(producer) is None


def test_a_login_whose_ticket_was_never_used_wakes_again_once_its_hold_ends(
    producer: Conn, owner: Conn, admin: Conn
) -> None:
    """The invoke went out and the event was lost: the owner's hold, not the debounce,
    says when that login may try again."""
    set_limits(owner, wake_debounce=timedelta(0))
    assert wake(producer) is not None
    assert wake(producer) is None  # its start may still be on its way

    admin.execute("update app.worker_wakes set ticket_expires_at = clock_timestamp()")
    assert wake(producer) is not None


def test_the_invocation_a_wake_started_consumes_its_ticket_and_joins_with_free_room(
    producer: Conn, pool_worker: Conn, owner: Conn, admin: Conn
) -> None:
    ticket = wake(producer)
    assert ticket is not None

    assert join(pool_worker, "woken", reason="wake", reservation=ticket)
    assert wakes(admin)[postgres.PRODUCER]["ticket"] is None
    assert [(p["owner"], p["reason"]) for p in places(admin)] == [("woken", "wake")]

    # Woken into a pool that filled meanwhile: refused like any other start.
    leave(pool_worker, "woken")
    pass_debounce(admin, postgres.PRODUCER)
    late = wake(producer)
    assert late is not None
    set_limits(owner, max_workers=1)
    assert join(pool_worker, "busy")
    assert join(pool_worker, "woken-late", reason="wake", reservation=late) is False


def test_a_wake_finds_the_room_of_an_expired_place(producer: Conn, pool_worker: Conn,
                                                    admin: Conn) -> None:
    assert join(pool_worker, "killed")
    expire(admin, owner="killed")

    assert wake(producer) is not None


def test_a_wake_does_not_wait_for_a_change_of_the_pool_under_way(
    db: Database, producer: Conn
) -> None:
    """Another session holds the pool's lock (a join or reservation in flight): the wake
    answers at once, since it takes no lock of the pool's. A wait would end the
    statement by its timeout (57014) and fail the test."""
    producer.execute("set statement_timeout = '5s'")
    with db.connect(None) as holder:
        holder.execute("begin")
        holder.execute("select * from app.worker_pool_state for update")

        assert wake(producer) is not None

        holder.execute("rollback")


def test_a_wake_does_not_wait_for_another_wake_of_its_login_under_way(
    db: Database, producer: Conn
) -> None:
    producer.execute("set statement_timeout = '5s'")
    with db.connect(postgres.PRODUCER) as holder:
        holder.execute("begin")
        assert wake(holder) is not None

        assert wake(producer) is None  # that call is waking a worker

        holder.execute("rollback")
    assert wake(producer) is not None


def test_a_repeatable_read_wake_that_missed_a_wake_of_its_login_is_refused_with_40001(
    db: Database, producer: Conn, admin: Conn
) -> None:
    with db.connect(postgres.PRODUCER) as stale:
        stale.execute("begin isolation level repeatable read")
        stale.execute("select 1")  # takes the snapshot
        first = wake(producer)
        assert first is not None
        pass_debounce(admin, postgres.PRODUCER)
        admin.execute("update app.worker_wakes set ticket = null, ticket_expires_at = null")

        with raises_sqlstate("40001"):
            wake(stale)
        stale.execute("rollback")


def test_workers_and_tenant_bound_producers_may_wake_too_each_login_for_itself(
    db: Database, admin: Conn
) -> None:
    with db.connect(postgres.TENANT_PRODUCER) as tenant_producer:
        assert wake(tenant_producer) is not None
    with db.connect(postgres.DUTY_WORKER) as worker:
        assert wake(worker) is not None
        assert wake(worker) is None
    assert set(wakes(admin)) == {postgres.TENANT_PRODUCER, postgres.DUTY_WORKER}


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
    "join: expiry over 16 minutes": ("select app.join_worker_pool('w', 'wake', null, 4,"
                                     " '17 minutes')",
                                     "p_expires_in must be between 00:00:01 and 00:16:00"),
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
    """Only the functions count: a login that could insert or delete places, or change
    a wake's state, could start invocations past the maximum or hold others' wakes."""
    for conn in (pool_worker, producer):
        for statement in ("select * from app.worker_pool",
                          "delete from app.worker_pool",
                          "update app.worker_pool_state set changed_at = null",
                          "update app.worker_wakes set woken_at = clock_timestamp()"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.encode())
