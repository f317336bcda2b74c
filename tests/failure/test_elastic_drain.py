"""The elastic drain under failure, on the local Lambda service with the real functions:
invocations killed mid-flight, asynchronous starts lost or delivered twice, a database
that refuses connections past its budget, and a stampede of enqueues. Each time nothing
is lost, nothing is completed twice, and the pool never exceeds MaxWorkers (with a
schedule, a tick may drain in the one extra place beside MaxWorkers running invocations)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from leaseq_lambda_local import LocalLambda
from psycopg import sql

from tests.conftest import Database
from tests.lambda_local.conftest import Start, client_for, wait_for
from tests.lambda_local.elastic.stack import (
    WORKER_FUNCTION,
    PoolWatch,
    assert_exactly_once,
    audit,
    drainers_at_once,
    enqueue,
    jobs,
    messages,
    side_effects,
    start_elastic,
    wait_until_drained,
    wait_until_idle,
    watch_pool,
)

pytestmark = pytest.mark.usefixtures(side_effects.__name__)

MAX_WORKERS = 3


def _stats(service: LocalLambda, function: str = WORKER_FUNCTION) -> dict[str, Any]:
    found: dict[str, Any] = service.service.stats()["functions"][function]
    return found


def _finished(service: LocalLambda) -> list[dict[str, Any]]:
    return messages(service, "drain finished")


def test_invocations_killed_mid_flight_lose_nothing_and_complete_nothing_twice(
    start_service: Start, db: Database,
) -> None:
    """Crashes (the process dies in a handler) and deadline kills (a handler that ignores
    its interruption until Lambda's timeout) while the backlog fans out; the reaper and
    the tick, every 3 s here, take the killed invocations' jobs back."""
    service = start_elastic(start_service, db, schedules=True, schedule_every=3.0,
                            parameters={"MaxWorkers": str(MAX_WORKERS),
                                        "WorkerTimeoutSeconds": "6"})
    with watch_pool(db) as seen:
        enqueue(service, jobs(2, "elastic.stubborn") + jobs(80, sleep=0.03))
        _wait_until_started(service, "elastic.stubborn")  # its invocation runs out its time
        enqueue(service, jobs(3, "elastic.crash") + jobs(40, sleep=0.03))
        wait_until_drained(db, service)
        # The stubborn job's second attempt may finish the queue before its first one's
        # invocation reaches the deadline that kills it.
        wait_until_idle(service)

    report = audit(db)
    assert_exactly_once(report)
    # A crash that ran its handler runs it again (allowed: at-least-once); one claimed in
    # a batch another crash killed first never ran on its first attempt.
    assert report.jobs_executed_twice >= 1
    assert report.events["lease_expired"] >= 5  # the killed invocations' jobs came back
    stats = _stats(service)
    assert stats["timeouts"] >= 1  # a deadline kill
    assert stats["function_errors"] >= stats["timeouts"] + 1  # and a crash at least
    _assert_within_the_maximum_and_the_ticks_place(seen)
    assert drainers_at_once(db) <= MAX_WORKERS + 1


def test_starts_that_fail_to_invoke_lose_nothing_and_the_schedule_drains_everything(
    start_service: Start, db: Database,
) -> None:
    """Every Invoke raises (the worker function's name is wrong): no wake, no fan-out;
    every place is given back at once and the scheduled tick drains the backlog."""
    service = start_elastic(start_service, db, schedules=True, schedule_every=2.0,
                            parameters={"MaxWorkers": str(MAX_WORKERS)},
                            env={"Parameters": {"LEASEQ_WORKER_FUNCTION": "NoSuchFunction"}})
    with watch_pool(db) as seen:
        enqueue(service, jobs(60, sleep=0.02))
        wait_until_drained(db, service)
        wait_until_idle(service)

    assert_exactly_once(audit(db))
    finished = _finished(service)
    assert {line["trigger"] for line in finished} == {"scheduler"}
    assert sum(line["worker_starts_failed"] for line in finished) >= 1
    assert sum(line["workers_started"] for line in finished) == 0
    assert messages(service, "waking a worker failed; the scheduled worker runs the jobs",
                    "EnqueueFunction")
    _assert_within_the_maximum_and_the_ticks_place(seen)
    _assert_no_reservation_left(db)  # each failed start gave its place back at once


def test_start_events_dropped_unrun_hold_their_place_only_until_the_hold_ends(
    start_service: Start, db: Database,
) -> None:
    """One execution at a time and events that expire after a second: every fan-out
    event waits behind the running worker and is dropped unrun, as Lambda drops an
    event past its maximum age. Its place frees itself after the start hold."""
    service = start_elastic(start_service, db, schedules=True, schedule_every=3.0,
                            parameters={"MaxWorkers": str(MAX_WORKERS),
                                        "WorkerReservedConcurrency": "1",
                                        "MaximumEventAgeInSeconds": "1",
                                        "StartHoldSeconds": "3"})
    with watch_pool(db) as seen:
        enqueue(service, jobs(120, sleep=0.03))
        wait_until_drained(db, service)
        wait_until_idle(service)

    assert_exactly_once(audit(db))
    assert _stats(service)["async_dropped_age"] >= 1
    assert sum(line["workers_started"] for line in _finished(service)) >= 1
    _assert_within_the_maximum_and_the_ticks_place(seen)
    assert seen.live == 1  # one execution at a time: never two draining
    time.sleep(3.5)  # the hold of the last dropped event's place
    _assert_no_reservation_left(db)


@contextmanager
def _deliver_twice(service: LocalLambda, db: Database) -> Iterator[list[str]]:
    """Every reservation that appears in the pool gets its start event delivered two
    more times, as an at-least-once delivery may: the duplicates race the original."""
    sent: list[str] = []
    stop = threading.Event()
    client = client_for(service.url)

    def run() -> None:
        with db.connect(None) as admin:
            while not stop.is_set():
                rows = admin.execute("select id from app.worker_pool where owner is null"
                                     " and expires_at > clock_timestamp()").fetchall()
                for row in rows:
                    place = str(row["id"])
                    if place in sent:
                        continue
                    sent.append(place)
                    event = {"source": "leaseq.pool", "reason": "fanout", "reservation": place}
                    for _ in range(2):
                        client.invoke(FunctionName=WORKER_FUNCTION, InvocationType="Event",
                                      Payload=json.dumps(event))
                stop.wait(0.01)

    thread = threading.Thread(target=run, name="deliver-twice", daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(timeout=10)


def test_start_events_delivered_three_times_never_exceed_the_maximum(
    start_service: Start, db: Database,
) -> None:
    service = start_elastic(start_service, db,
                            parameters={"MaxWorkers": str(MAX_WORKERS),
                                        "WorkerReservedConcurrency": str(MAX_WORKERS + 4)})
    with watch_pool(db) as seen, _deliver_twice(service, db) as duplicated:
        enqueue(service, jobs(240, sleep=0.05))
        wait_until_drained(db, service)
        wait_until_idle(service)

    assert_exactly_once(audit(db))
    assert duplicated  # reservations were seen and delivered again
    refused = messages(service, "worker pool full: not draining")
    assert refused  # duplicates that found the pool full returned without claiming
    assert all(line["pool_live"] <= MAX_WORKERS for line in refused)
    assert seen.places <= MAX_WORKERS
    assert seen.live <= MAX_WORKERS
    assert 1 < drainers_at_once(db) <= MAX_WORKERS
    assert _stats(service)["peak_concurrency"] > MAX_WORKERS  # more ran than may drain


@pytest.fixture
def budget_role(db: Database) -> Iterator[str]:
    """A worker login whose connections the database caps at two (CONNECTION LIMIT)."""
    role = "leaseq_test_budget_worker"
    with db.connect(None) as admin:
        admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("create role {} login connection limit 2 in role leaseq_worker")
                      .format(sql.Identifier(role)))
    yield db.dsn(role)
    with db.connect(None) as admin:
        admin.execute("select pg_terminate_backend(pid) from pg_stat_activity"
                      " where usename = %s", (role,))
        admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


def test_a_database_refusing_connections_past_its_budget_loses_nothing(
    start_service: Start, db: Database, budget_role: str,
) -> None:
    """The worker may start four invocations but its login may hold two connections:
    the others fail to connect, fail their invocation, and their places expire."""
    service = start_elastic(start_service, db, schedules=True, schedule_every=4.0,
                            parameters={"MaxWorkers": "4", "WorkerReservedConcurrency": "5",
                                        "StartHoldSeconds": "5"},
                            env={WORKER_FUNCTION: {"DATABASE_URL": budget_role}})
    with watch_pool(db) as seen:
        enqueue(service, jobs(240, sleep=0.05))
        wait_until_drained(db, service)
        wait_until_idle(service)

    assert_exactly_once(audit(db))
    refusals = [line for line in messages(service, "drain failed")
                if "too many connections" in line["error"]]
    assert refusals  # the database said no, and the invocation failed with that reason
    assert seen.connections <= 2
    assert seen.regular <= 4
    assert seen.places <= 4 + 1  # the tick's extra place


def test_an_enqueue_stampede_on_an_idle_queue_wakes_one_worker(
    start_service: Start, db: Database,
) -> None:
    """Two hundred enqueue invocations from eight callers at once, each with one ready
    job: one wake; the other enqueues find it on its way or polling."""
    service = start_elastic(start_service, db,
                            parameters={"MaxWorkers": str(MAX_WORKERS),
                                        "FanOutIdleSeconds": "5"})
    items = jobs(200)

    def one(item: dict[str, Any]) -> None:
        enqueue(service, [item])

    with watch_pool(db) as seen, ThreadPoolExecutor(max_workers=8) as callers:
        list(callers.map(one, items))
        wait_until_drained(db, service)
        wait_until_idle(service)

    assert_exactly_once(audit(db))
    (woken,) = messages(service, "worker woken", "EnqueueFunction")
    assert woken["level"] == "INFO"
    started_by_wake = [line for line in _finished(service) if line["trigger"] == "wake"]
    assert len(started_by_wake) == 1
    assert seen.places <= MAX_WORKERS


def _assert_within_the_maximum_and_the_ticks_place(seen: PoolWatch) -> None:
    """With schedules on: never more than MaxWorkers places, but for the one extra place a
    tick takes when running invocations hold every place."""
    assert seen.regular <= MAX_WORKERS
    assert seen.places <= MAX_WORKERS + 1


def _wait_until_started(service: LocalLambda, kind: str) -> None:
    """Until a handler has started the first attempt of a job of ``kind`` (its worker's
    ``job started`` line). Claimed is not enough: a claimed job may still be given back,
    or lose its first attempt to a crash of its batch, and never run out its invocation."""
    wait_for(lambda: any(line.get("kind") == kind and line.get("attempt") == 1
                         for line in messages(service, "job started")),
             f"the first attempt of a {kind} job to start")


def _assert_no_reservation_left(db: Database) -> None:
    """No place waits for an invocation (a tick's worker may be draining meanwhile)."""
    with db.connect(None) as admin:
        left = admin.execute("select id, reason from app.worker_pool where owner is null"
                             " and expires_at > clock_timestamp()").fetchall()
    assert left == []
