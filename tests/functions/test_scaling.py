"""leaseq_lambda.scaling on a real PostgreSQL, invoking through the local Lambda service,
whose Probe function stands in for the worker function and records every event."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from leaseq import (
    ClaimedJob,
    EnqueueRequest,
    InvalidRequestError,
    MonotonicDeadline,
    QueueClient,
    ScaleUp,
    connect,
    set_worker_pool_limits,
)
from leaseq.settings import PoolSettings
from leaseq_lambda import wake_worker
from leaseq_lambda.events import InvalidEventError, Tick, parse_tick
from leaseq_lambda.scaling import (
    POOL_EXPIRY_MARGIN,
    FanOut,
    PoolMembership,
    WorkerStartError,
    lambda_starter,
    wake,
)

from tests.conftest import Database
from tests.functions.conftest import LocalInvokes, load_event
from tests.support.fakes import ManualClock
from tests.support.postgres import PRODUCER, Conn

TENANT = uuid.UUID("7d2f3c1e-0000-4000-8000-00000000a001")


def settings(**values: Any) -> PoolSettings:
    return PoolSettings(**{"max_workers": 2, "worker_function": "Probe", **values})


@pytest.fixture
def client(db: Database) -> Iterator[QueueClient]:
    queue = QueueClient(lambda: connect(db.worker_dsn))
    yield queue
    queue.close()


def places(admin: Conn) -> list[dict[str, Any]]:
    """The unexpired places of the pool, oldest first."""
    return admin.execute("select id, owner, reason from app.worker_pool"
                         " where expires_at > clock_timestamp() order by created_at").fetchall()


def tickets(admin: Conn) -> list[UUID]:
    """The wakes' unexpired tickets (a ticket holds no place of the pool)."""
    rows = admin.execute("select ticket from app.worker_wakes where ticket is not null"
                         " and ticket_expires_at > clock_timestamp()").fetchall()
    return [row["ticket"] for row in rows]


def claim(client: QueueClient, jobs: int, limit: int) -> list[ClaimedJob]:
    """Enqueue ``jobs`` ready jobs and claim up to ``limit`` of them, as a worker would."""
    client.enqueue_jobs([EnqueueRequest(tenant_id=TENANT, operation_key=f"job-{uuid.uuid4()}",
                                        kind="send_welcome_email", payload={"n": n})
                         for n in range(jobs)])
    return client.claim_ready_jobs("claimer", limit, timedelta(seconds=30))


def start_event(place: UUID, reason: str = "fanout") -> dict[str, str]:
    return {"source": "leaseq.pool", "reason": reason, "reservation": str(place)}


# Fan-out ------------------------------------------------------------------------------------


def test_a_full_claim_reserves_one_place_and_invokes_the_worker_with_its_pool_start_event(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    fan_out = FanOut(client, settings())
    jobs = claim(client, 3, 2)

    fan_out(jobs, 2)
    report = fan_out.close()

    (event,) = local_invokes.events(1)
    (place,) = places(admin)
    assert event == start_event(place["id"])
    assert (place["owner"], place["reason"]) == (None, "fanout")
    assert (report.started, report.failed, report.pool_full) == (1, 0, 0)


def test_a_claim_neither_full_nor_late_starts_nothing(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    fan_out = FanOut(client, settings())
    jobs = claim(client, 1, 5)

    fan_out(jobs, 5)
    fan_out([], 5)
    report = fan_out.close()

    assert (report.started, places(admin), local_invokes.accepted()) == (0, [], 0)


def test_one_member_asks_for_one_more_place_at_most_once_per_interval(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    clock = ManualClock(time.time())
    fan_out = FanOut(client, settings(max_workers=10), scale_up=ScaleUp(clock=clock))
    jobs = claim(client, 4, 2)

    fan_out(jobs, 2)
    fan_out(jobs, 2)  # the same second: no second place
    clock.advance(1.5)
    fan_out(jobs, 2)
    report = fan_out.close()

    assert report.started == 2
    assert len(local_invokes.events(2)) == 2
    assert len(places(admin)) == 2


def test_fan_out_never_reserves_past_the_maximum(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    for owner in ("worker-a", "worker-b"):
        assert client.join_worker_pool(owner, "schedule", None, 2, 60)
    fan_out = FanOut(client, settings(max_workers=2))

    fan_out(claim(client, 3, 2), 2)
    report = fan_out.close()

    assert (report.started, report.pool_full) == (0, 1)
    assert [p["owner"] for p in places(admin)] == ["worker-a", "worker-b"]
    assert local_invokes.accepted() == 0


def test_a_failed_invoke_gives_its_place_back_and_is_logged_and_counted(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes,
        caplog: pytest.LogCaptureFixture) -> None:
    fan_out = FanOut(client, settings(worker_function="NoSuchFunction"))

    with caplog.at_level(logging.WARNING, logger="leaseq.scaling"):
        fan_out(claim(client, 2, 2), 2)
        report = fan_out.close()

    assert (report.started, report.failed) == (0, 1)
    assert places(admin) == []  # given back: the room is free again at once
    (line,) = [r for r in caplog.records if r.getMessage() == "worker start failed"]
    assert "ResourceNotFoundException" in line.__dict__["error"]
    assert "LEASEQ_WORKER_FUNCTION" in line.__dict__["error"]


def test_close_waits_for_a_start_under_way_and_afterwards_starts_nothing(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    started = threading.Event()
    real = lambda_starter("Probe")

    def slow_invoke(event: Any) -> None:
        started.set()
        time.sleep(0.3)
        real(event)

    fan_out = FanOut(client, settings(), invoke=slow_invoke,
                     scale_up=ScaleUp(interval=0))
    jobs = claim(client, 2, 2)
    fan_out(jobs, 2)
    assert started.wait(10)

    report = fan_out.close(timeout=10)
    fan_out(jobs, 2)

    assert report.started == 1
    assert fan_out.report().started == 1
    assert len(places(admin)) == 1
    assert len(local_invokes.events(1)) == 1


def test_the_hook_never_waits_for_lambda(client: QueueClient, local_invokes: LocalInvokes
                                         ) -> None:
    """The claim thread only hands the start over: the invoke happens in the background."""
    release = threading.Event()
    fan_out = FanOut(client, settings(), invoke=lambda event: release.wait(10))
    jobs = claim(client, 2, 2)

    fan_out(jobs, 2)  # returns while the invoke is still blocked

    assert fan_out.report().started == 0
    release.set()
    assert fan_out.close(timeout=10).started == 1


# Joining the pool -----------------------------------------------------------------------------


def test_a_started_invocation_takes_its_reservation_and_a_second_delivery_gets_only_free_room(
        client: QueueClient, admin: Conn) -> None:
    pool = settings(max_workers=2)
    (reserved,) = client.reserve_worker_places(1, 2, 90)
    assert client.join_worker_pool("worker-a", "schedule", None, 2, 60)
    tick = parse_tick(start_event(reserved), "worker")

    first = PoolMembership(client, pool, "worker-b")
    duplicate = PoolMembership(client, pool, "worker-c")

    assert first.join(tick, MonotonicDeadline(30.0))
    # The same event again: the pool is full.
    assert not duplicate.join(tick, MonotonicDeadline(30.0))
    assert {p["owner"] for p in places(admin)} == {"worker-a", "worker-b"}
    assert [p["id"] for p in places(admin) if p["owner"] == "worker-b"] == [reserved]
    assert duplicate.fan_out is None


def test_after_a_worker_login_reserved_the_pool_for_a_day_the_schedules_invocation_still_joins(
        client: QueueClient, admin: Conn) -> None:
    """The attack of a stolen worker login: reserve_worker_places(1000, 1000, '1 day')
    used to make 1,000 places for a day, and the schedule's join then returned false.
    Now the owner's 4 places for the owner's 90 s, and the tick takes the oldest."""
    stolen = client.reserve_worker_places(1000, 1000, 86_400)
    assert len(stolen) == 4
    assert {p["id"] for p in places(admin)} == set(stolen)

    membership = PoolMembership(client, settings(max_workers=8), "scheduled")

    assert membership.join(Tick("scheduler"), MonotonicDeadline(30.0))
    assert [p["owner"] for p in places(admin)].count("scheduled") == 1
    membership.finish(MonotonicDeadline(30.0))


def test_in_a_pool_full_of_running_invocations_the_tick_drains_in_the_extra_place_and_fans_out_none(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    for n in range(4):  # running invocations, or a worker login squatting every place
        assert client.join_worker_pool(f"running-{n}", "fanout", None, 1000, 960)
    membership = PoolMembership(client, settings(max_workers=4), "scheduled")

    assert membership.join(Tick("scheduler"), MonotonicDeadline(30.0))
    assert membership.fan_out is not None
    membership.fan_out(claim(client, 3, 2), 2)
    report = membership.finish(MonotonicDeadline(30.0))

    assert report is not None
    assert (report.started, report.pool_full) == (0, 1)  # fan-out stays within the maximum
    assert local_invokes.accepted() == 0
    assert len(places(admin)) == 4


def test_a_place_expires_with_its_invocation_and_finish_frees_it_at_once(
        client: QueueClient, admin: Conn) -> None:
    membership = PoolMembership(client, settings(), "worker-a")
    assert membership.join(Tick("scheduler"), MonotonicDeadline(12.0))
    (expires,) = admin.execute(
        "select extract(epoch from expires_at - clock_timestamp()) as left"
        " from app.worker_pool").fetchall()
    assert 12.0 < float(expires["left"]) <= 12.0 + POOL_EXPIRY_MARGIN

    membership.finish(MonotonicDeadline(10.0))

    assert places(admin) == []
    membership.finish(MonotonicDeadline(10.0))  # twice is harmless


def test_with_the_pool_off_every_invocation_is_admitted_and_nothing_is_written(
        client: QueueClient, admin: Conn) -> None:
    membership = PoolMembership(client, settings(max_workers=0, worker_function=None), "w")

    assert membership.join(Tick("scheduler"), MonotonicDeadline(30.0))
    assert (membership.fan_out, membership.poll_idle, membership.size()) == (None, None, None)
    assert membership.finish(MonotonicDeadline(30.0)) is None
    assert places(admin) == []


def test_a_started_invocation_polls_for_the_pool_idle_time_and_a_scheduled_one_for_its_own(
        client: QueueClient) -> None:
    pool = settings(fanout_idle_seconds=3)
    started = PoolMembership(client, pool, "started")
    scheduled = PoolMembership(client, pool, "scheduled")
    started.join(parse_tick(start_event(uuid.uuid4(), "wake"), "worker"),
                 MonotonicDeadline(30.0))
    scheduled.join(parse_tick(load_event("worker_schedule"), "worker"),
                   MonotonicDeadline(30.0))

    assert (started.poll_idle, scheduled.poll_idle) == (3.0, None)


# The pool-start event -----------------------------------------------------------------------


def test_the_pool_start_sample_event_is_a_tick_holding_its_reservation() -> None:
    event = load_event("worker_fanout")

    tick = parse_tick(event, "worker")

    assert (tick.origin, tick.reservation, tick.pool_reason) == (
        "fanout", UUID(event["reservation"]), "fanout")
    assert tick.started
    assert parse_tick(load_event("worker_schedule"), "worker").pool_reason == "schedule"
    assert parse_tick({}, "worker").pool_reason == "manual"


@pytest.mark.parametrize(("event", "problem"), [
    ({"source": "leaseq.pool", "reason": "boredom", "reservation": str(uuid.uuid4())},
     "reason"),
    ({"source": "leaseq.pool", "reason": "fanout", "reservation": "not-a-uuid"}, "reservation"),
    ({"source": "leaseq.pool", "reason": "wake"}, "reservation"),
    ({"source": "leaseq.pool", "reason": "wake", "reservation": str(uuid.uuid4()), "x": 1},
     "x"),
])
def test_a_malformed_pool_start_says_what_is_wrong_and_which_shapes_are_accepted(
        event: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidEventError) as rejected:
        parse_tick(event, "worker")

    message = rejected.value.message
    assert message.startswith(f"invalid pool start: {problem}")
    assert '"source": "leaseq.schedule"' in message
    assert '"source": "leaseq.pool", "reason": "fanout" or "wake"' in message


def test_the_reaper_refuses_a_pool_start_and_names_the_setting_that_sent_it() -> None:
    with pytest.raises(InvalidEventError, match="LEASEQ_WORKER_FUNCTION"):
        parse_tick(load_event("worker_fanout"), "reaper")


# Wake ---------------------------------------------------------------------------------------


def test_a_wake_on_an_empty_pool_takes_one_ticket_and_starts_one_worker(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    assert wake(client, settings())

    (event,) = local_invokes.events(1)
    (ticket,) = tickets(admin)
    assert event == start_event(ticket, "wake")
    assert places(admin) == []  # the woken worker joins with free room


def test_a_thousand_wakes_in_a_burst_start_one_worker(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    woken = [wake(client, settings()) for _ in range(1000)]

    assert woken.count(True) == 1
    assert len(tickets(admin)) == 1
    assert len(local_invokes.events(1)) == 1
    assert local_invokes.accepted() == 1


def test_no_wake_while_a_worker_polls_nor_within_the_owners_debounce(
        client: QueueClient, owner: Conn, admin: Conn, local_invokes: LocalInvokes) -> None:
    set_worker_pool_limits(owner, wake_debounce=30)
    assert client.join_worker_pool("polling", "schedule", None, 2, 60)
    assert not wake(client, settings())  # a worker is polling: it finds the job itself
    client.leave_worker_pool("polling")
    assert wake(client, settings())
    (ticket,) = tickets(admin)
    assert client.join_worker_pool("woken", "wake", ticket, 2, 60)
    client.leave_worker_pool("woken")
    assert tickets(admin) == []  # the woken worker used it

    assert not wake(client, settings())  # the last wake is recent
    assert local_invokes.accepted() == 1


def test_a_failed_wake_gives_its_place_back_and_raises(
        client: QueueClient, admin: Conn, local_invokes: LocalInvokes) -> None:
    with pytest.raises(WorkerStartError, match="NoSuchFunction"):
        wake(client, settings(worker_function="NoSuchFunction"))

    assert (places(admin), tickets(admin)) == ([], [])


def test_with_the_pool_off_a_wake_does_nothing(client: QueueClient, admin: Conn) -> None:
    assert not wake(client, settings(max_workers=0, worker_function=None))
    assert places(admin) == []


# wake_worker: producers that enqueue in their own transaction ---------------------------


def test_wake_worker_after_the_producers_commit_starts_one_worker(
        db: Database, admin: Conn, local_invokes: LocalInvokes) -> None:
    with db.connect(PRODUCER) as conn:
        conn.autocommit = False
        with conn.transaction():
            conn.execute("select 1")  # the producer's own work and its enqueue go here
        assert wake_worker(conn, "Probe")
        assert not wake_worker(conn, "Probe")  # a worker is on its way: nothing more
        assert conn.info.transaction_status.name == "IDLE"  # nothing left uncommitted

    (event,) = local_invokes.events(1)
    (ticket,) = tickets(admin)
    assert event == start_event(ticket, "wake")


def test_wake_worker_inside_an_open_transaction_is_refused_and_reserves_nothing(
        db: Database, admin: Conn, local_invokes: LocalInvokes) -> None:
    with db.connect(PRODUCER) as conn:
        conn.autocommit = False
        conn.execute("select 1")  # a transaction is open: the jobs are not visible yet
        with pytest.raises(InvalidRequestError, match="commit the transaction"):
            wake_worker(conn, "Probe")
        conn.rollback()

    assert (places(admin), tickets(admin)) == ([], [])
    assert local_invokes.accepted() == 0


def test_a_producer_whose_wake_fails_gives_its_ticket_back_so_the_next_wake_can_start_one(
        db: Database, owner: Conn, admin: Conn, local_invokes: LocalInvokes) -> None:
    set_worker_pool_limits(owner, wake_debounce=0)
    with db.connect(PRODUCER) as conn:
        with pytest.raises(WorkerStartError, match="NoSuchFunction"):
            wake_worker(conn, "NoSuchFunction")

        # The failed start's ticket is given back at once, not after its hold: the next
        # wake (here to a function that exists) takes one and starts a worker.
        assert tickets(admin) == []
        assert wake_worker(conn, "Probe")
    (ticket,) = tickets(admin)
    (event,) = local_invokes.events(1)
    assert event == start_event(ticket, "wake")


def test_wake_worker_takes_no_hold_or_debounce_from_the_producer(
        db: Database) -> None:
    """The hold and the debounce are the schema owner's: a producer cannot pass them."""
    with db.connect(PRODUCER) as conn, pytest.raises(TypeError, match="hold"):
        wake_worker(conn, "Probe", hold=86_400)  # type: ignore[call-arg]
