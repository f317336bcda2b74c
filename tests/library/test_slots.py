"""The event-loop drain (leaseq.drain.slots) on a real PostgreSQL: async handlers at once,
sync handlers in threads, budgets per job, slots refilled by claims, leases renewed,
outcomes recorded on time, a blocked loop reported, and polling."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

import pytest
from leaseq import (
    ConfigurationError,
    JobContext,
    JobRecord,
    LeaseqError,
    MonotonicDeadline,
    QueueClient,
    Registry,
    RetryJob,
    RetryPolicy,
    Worker,
    WorkerConfig,
    connect,
)

from tests.conftest import Database
from tests.library.support import enqueue, event_types, job, states
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


def make_worker(client: QueueClient, registry: Registry, *,
                records: list[JobRecord] | None = None, **config: Any) -> Worker:
    config.setdefault("poll_idle", 0)
    return Worker(client, registry, WorkerConfig(owner="slots-1", **config),
                  on_job=records.append if records is not None else None, rand=lambda: 0.5)


class InFlight:
    """Counts handlers running at once, sync (threads) or async alike."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


@pytest.mark.parametrize("style", ["async", "sync in threads"])
def test_never_more_than_concurrency_jobs_are_in_flight_and_all_of_them_run(
        client: QueueClient, owner: Conn, style: str) -> None:
    flight = InFlight()
    registry = Registry()
    if style == "async":
        @registry.handler("echo")
        async def work(payload: Any, ctx: JobContext) -> None:
            flight.enter()
            try:
                await asyncio.sleep(0.03)
            finally:
                flight.leave()
    else:
        @registry.handler("echo")
        def work_in_thread(payload: Any, ctx: JobContext) -> None:
            flight.enter()
            try:
                time.sleep(0.03)
            finally:
                flight.leave()
    enqueue(client, uuid.uuid4(), 60)

    report = make_worker(client, registry, concurrency=5, batch_size=10).drain(
        FakeDeadline(60))

    assert (report.claimed, report.succeeded, report.concurrency) == (60, 60, 5)
    assert flight.most == 5  # never more, and the slots were really used together
    assert states(owner) == {"succeeded": 60}


def test_a_slow_job_holds_only_its_own_slot(client: QueueClient) -> None:
    finished: dict[str, float] = {}
    registry = Registry()

    @registry.handler("slow", timeout=10)
    async def slow(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(1.5)
        finished["slow"] = time.monotonic()

    @registry.handler("echo")
    async def fast(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0.02)
        finished[f"fast-{payload['i']}"] = time.monotonic()

    tenant = uuid.uuid4()
    enqueue(client, tenant, kind="slow", prefix="slow")
    enqueue(client, tenant, 40)

    report = make_worker(client, registry, concurrency=4).drain(FakeDeadline(60))

    assert report.succeeded == 41
    fast_done = [t for name, t in finished.items() if name.startswith("fast")]
    assert len(fast_done) == 40
    # All 40 fast jobs went through the 3 other slots while the slow one ran.
    assert max(fast_done) < finished["slow"]


def test_a_hung_async_handler_is_cancelled_at_its_budget_and_retried(
        client: QueueClient, owner: Conn, admin: Conn) -> None:
    seen: list[tuple[bool, str | None]] = []
    registry = Registry()

    @registry.handler("hang", timeout=0.2)
    async def hang(payload: Any, ctx: JobContext) -> str:
        if ctx.attempt == 1:
            try:
                await asyncio.Event().wait()  # for ever
            finally:
                seen.append((ctx.stop_requested, ctx.stop_reason))
        return "second time lucky"

    (job_id,) = enqueue(client, uuid.uuid4(), kind="hang")
    worker = make_worker(client, registry, concurrency=2,
                         retry=RetryPolicy(base_delay=0, max_delay=0))

    started = time.monotonic()
    first = worker.drain(FakeDeadline(60))

    assert time.monotonic() - started < 5
    assert seen == [(True, "budget")]  # cancelled, and told why
    assert first.retried == 1
    timeline = owner.execute("select details from app.job_events where job_id = %s"
                             " and event_type = 'retry_scheduled'", (job_id,)).fetchone()
    assert timeline is not None
    assert timeline["details"]["error"]["code"] == "JOB_TIMEOUT"
    assert "0.2 s" in timeline["details"]["error"]["message"]
    worker.drain(FakeDeadline(60))
    assert job(owner, job_id)["result"] == "second time lucky"


def test_a_sync_handler_past_its_budget_is_recorded_at_once_and_its_late_return_discarded(
        client: QueueClient, owner: Conn) -> None:
    flight = InFlight()
    release = threading.Event()
    registry = Registry()

    @registry.handler("stuck", timeout=0.2)
    def stuck(payload: Any, ctx: JobContext) -> str:
        flight.enter()
        try:
            release.wait(0.8)  # ignores its budget, returns late with a value
            return "too late"
        finally:
            flight.leave()

    @registry.handler("echo")
    def quick(payload: Any, ctx: JobContext) -> None:
        flight.enter()
        try:
            time.sleep(0.02)
        finally:
            flight.leave()

    tenant = uuid.uuid4()
    (stuck_id,) = enqueue(client, tenant, kind="stuck", prefix="stuck")
    enqueue(client, tenant, 20)
    records: list[JobRecord] = []

    report = make_worker(client, registry, concurrency=2, records=records).drain(
        FakeDeadline(60))

    row = job(owner, stuck_id)
    assert (row["state"], row["last_error"]["code"]) == ("retry_wait", "JOB_TIMEOUT")
    assert row["result"] is None  # "too late" was never recorded
    assert report.late_returns == 1
    assert (report.succeeded, report.retried) == (20, 1)
    # The abandoned thread kept its slot until it returned: never three at once.
    assert flight.most == 2
    (stuck_record,) = [r for r in records if r.job.id == stuck_id]
    assert stuck_record.duration < 0.8


def test_an_async_handler_that_blocks_the_event_loop_is_reported_with_its_job(
        client: QueueClient, caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()

    @registry.handler("blocking", timeout=5)
    async def blocking(payload: Any, ctx: JobContext) -> None:
        time.sleep(0.8)  # sync work inside async def: the mistake the watchdog names

    @registry.handler("echo", timeout=5)
    async def polite(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0.3)

    tenant = uuid.uuid4()
    (blocking_id,) = enqueue(client, tenant, kind="blocking", prefix="b")
    (polite_id,) = enqueue(client, tenant, prefix="p")

    with caplog.at_level(logging.WARNING, logger="leaseq"):
        report = make_worker(client, registry, concurrency=4, loop_stall=0.2).drain(
            FakeDeadline(60))

    assert report.succeeded == 2
    assert report.loop_stalls == 1
    (blocked,) = [r for r in caplog.records if r.getMessage().startswith("event loop blocked")]
    assert blocked.__dict__["job_id"] == str(blocking_id)
    assert blocked.__dict__["kind"] == "blocking"
    assert str(polite_id) in blocked.__dict__["jobs_held_up"]
    (again,) = [r for r in caplog.records if r.getMessage() == "event loop ran again"]
    assert again.__dict__["job_id"] == str(blocking_id)
    assert again.__dict__["blocked_for"] >= 0.5


def test_a_capped_lease_is_renewed_while_a_long_job_runs(
        client: QueueClient, owner: Conn) -> None:
    ends: list[Any] = []
    registry = Registry()

    @registry.handler("long", timeout=10)
    async def long(payload: Any, ctx: JobContext) -> None:
        for _ in range(5):
            ends.append(job(owner, ctx.job.id)["lease_expires_at"])
            await asyncio.sleep(0.6)

    (job_id,) = enqueue(client, uuid.uuid4(), kind="long")

    # A 1 s lease for a 3 s job: without renewals it would expire under it.
    report = make_worker(client, registry, concurrency=2, max_lease=1, lease_margin=1,
                         job_timeout=5).drain(
        MonotonicDeadline(30))

    assert (report.succeeded, report.lost_leases) == (1, 0), (report, event_types(owner, job_id))
    assert len(set(ends)) >= 3  # renewed along the way
    assert event_types(owner, job_id) == ["created", "claimed", "succeeded"]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_finished_outcome_is_recorded_within_the_interval_while_another_job_runs(
        client: QueueClient, owner: Conn, concurrency: int) -> None:
    """One job at a time (the sync path's recorder thread) and several at once."""
    seen: dict[str, str] = {}
    registry = Registry()
    tenant = uuid.uuid4()
    (quick_id,) = enqueue(client, tenant, kind="quick", prefix="q")
    enqueue(client, tenant, kind="long", prefix="l")

    @registry.handler("quick")
    def quick(payload: Any, ctx: JobContext) -> None:
        pass

    @registry.handler("long", timeout=10)
    def long(payload: Any, ctx: JobContext) -> None:
        time.sleep(1.0)  # the quick job's outcome must not wait for this one
        seen["quick while long ran"] = job(owner, quick_id)["state"]

    report = make_worker(client, registry, concurrency=concurrency, record_interval=0.3,
                         batch_size=10).drain(FakeDeadline(60))

    assert report.succeeded == 2
    assert seen == {"quick while long ran": "succeeded"}


@pytest.mark.parametrize("concurrency", [1, 4])
def test_polling_picks_up_a_job_enqueued_while_the_worker_polls(
        client: QueueClient, db: Database, owner: Conn, concurrency: int) -> None:
    registry = Registry()
    registry.register("echo", lambda payload, ctx: None)
    producer = QueueClient(lambda: connect(db.worker_dsn))
    late = threading.Timer(0.7, lambda: enqueue(producer, uuid.uuid4(), prefix="late"))

    late.start()
    try:
        report = make_worker(client, registry, concurrency=concurrency, poll_idle=2.5,
                             poll_min=0.05, poll_max=0.2).drain(FakeDeadline(60))
    finally:
        late.join()
        producer.close()

    assert (report.claimed, report.succeeded, report.stopped) == (1, 1, "queue_empty")
    assert report.polls >= 4
    row = owner.execute(
        "select c.created_at - e.created_at as waited from app.job_events c"
        " join app.job_events e on e.job_id = c.job_id and e.event_type = 'created'"
        " where c.event_type = 'claimed'").fetchone()
    assert row is not None
    # Claimed by the next poll: within one interval (0.2 s) of its arrival, plus the
    # claim statement's own time.
    assert row["waited"].total_seconds() < 0.5


@pytest.mark.parametrize("concurrency", [1, 4])
def test_polling_ends_after_the_idle_limit_or_when_no_job_would_fit_any_more(
        client: QueueClient, concurrency: int) -> None:
    registry = Registry()
    registry.register("echo", lambda payload, ctx: None)
    worker = make_worker(client, registry, concurrency=concurrency, poll_idle=0.6,
                         poll_min=0.05, poll_max=0.2, job_timeout=1, lease_margin=1)

    started = time.monotonic()
    idle = worker.drain(FakeDeadline(60))
    idle_for = time.monotonic() - started
    started = time.monotonic()
    # 3.3 s left: a job needs 1 + 1 + 1 s, so polls go on for about 0.3 s only.
    short = make_worker(client, registry, concurrency=concurrency, poll_idle=60,
                        poll_min=0.05, poll_max=0.2, job_timeout=1, lease_margin=1).drain(
        MonotonicDeadline(3.3))
    short_for = time.monotonic() - started

    assert (idle.stopped, idle.claimed) == ("queue_empty", 0)
    assert idle_for >= 0.6
    assert idle.polls >= 4  # 0.05, 0.1, 0.2, 0.2, ... then the last poll at 0.6 s
    assert short.stopped in ("queue_empty", "deadline")
    assert short_for < 2.5


def test_a_retry_with_no_delay_runs_again_in_the_same_drain(
        client: QueueClient, owner: Conn) -> None:
    registry = Registry()

    @registry.handler("echo")
    async def twice(payload: Any, ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise RetryJob(delay=0)
        return ctx.attempt

    (job_id,) = enqueue(client, uuid.uuid4())

    report = make_worker(client, registry, concurrency=3).drain(FakeDeadline(60))

    assert (report.retried, report.succeeded) == (1, 1)
    assert job(owner, job_id)["result"] == 2


def test_an_async_handler_renews_and_learns_its_time_without_blocking_the_loop(
        client: QueueClient, owner: Conn) -> None:
    seen: list[Any] = []
    registry = Registry()

    @registry.handler("echo", timeout=4)
    async def handler(payload: Any, ctx: JobContext) -> None:
        before = job(owner, ctx.job.id)["lease_expires_at"]
        seen.append(await ctx.renew_lease_async())
        seen.append(job(owner, ctx.job.id)["lease_expires_at"] > before)
        seen.append(0 < ctx.remaining() <= 4 == ctx.budget)
        seen.append(await ctx.wait_for_stop_async(0.05))

    enqueue(client, uuid.uuid4())

    # A capped lease, so that a renewal moves its end.
    assert make_worker(client, registry, concurrency=2, max_lease=10).drain(
        MonotonicDeadline(60)).succeeded == 1
    assert seen == [True, True, True, False]


def test_an_async_registry_with_concurrency_one_runs_on_the_event_loop(
        client: QueueClient) -> None:
    registry = Registry()

    @registry.handler("echo")
    async def handler(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0)

    enqueue(client, uuid.uuid4(), 3)
    worker = make_worker(client, registry)

    assert worker.uses_event_loop
    assert worker.drain(FakeDeadline(60)).succeeded == 3


def test_drain_inside_a_running_event_loop_names_drain_async_which_works_there(
        client: QueueClient) -> None:
    registry = Registry()
    registry.register("echo", lambda payload, ctx: None)
    worker = make_worker(client, registry, concurrency=2)
    enqueue(client, uuid.uuid4(), 2)

    async def inside_a_loop() -> int:
        with pytest.raises(LeaseqError, match="drain_async"):
            worker.drain(FakeDeadline(60))
        return (await worker.drain_async(FakeDeadline(60))).succeeded

    assert asyncio.run(inside_a_loop()) == 2


def test_a_kind_no_invocation_can_fit_is_refused_when_the_worker_knows_its_timeout(
        client: QueueClient) -> None:
    registry = Registry()
    registry.register("report", lambda payload, ctx: None, timeout=120)

    with pytest.raises(ConfigurationError) as refused:
        make_worker(client, registry, worker_timeout=60)

    assert "kind 'report' needs 126 s (its timeout 120 s + lease_margin 5 s" in (
        refused.value.message)
    assert "the worker's invocation leaves 60 s" in refused.value.message
    make_worker(client, registry)  # not known: given back and counted instead


# Sync handlers' own limit (sync_concurrency) ----------------------------------------------


def test_sync_handlers_only_with_a_sync_limit_of_one_run_in_turn_whatever_the_concurrency(
        client: QueueClient, owner: Conn) -> None:
    flight = InFlight()
    registry = Registry()

    @registry.handler("echo")
    def work(payload: Any, ctx: JobContext) -> None:
        flight.enter()
        try:
            time.sleep(0.01)
        finally:
            flight.leave()

    enqueue(client, uuid.uuid4(), 12)
    worker = make_worker(client, registry, concurrency=10, sync_concurrency=1)

    # The way sync handlers ran before: this thread, interrupted by SIGALRM at the budget.
    assert not worker.uses_event_loop
    report = worker.drain(FakeDeadline(60))
    assert report.succeeded == 12
    assert flight.most == 1
    assert states(owner) == {"succeeded": 12}


def test_a_mixed_registry_runs_async_jobs_up_to_concurrency_and_sync_ones_up_to_their_limit(
        client: QueueClient, owner: Conn) -> None:
    sync_flight, async_flight, every = InFlight(), InFlight(), InFlight()
    registry = Registry()

    @registry.handler("blocking")
    def blocking(payload: Any, ctx: JobContext) -> None:
        sync_flight.enter()
        every.enter()
        try:
            time.sleep(0.05)
        finally:
            every.leave()
            sync_flight.leave()

    @registry.handler("echo")
    async def waiting(payload: Any, ctx: JobContext) -> None:
        async_flight.enter()
        every.enter()
        try:
            await asyncio.sleep(0.05)
        finally:
            every.leave()
            async_flight.leave()

    tenant = uuid.uuid4()
    enqueue(client, tenant, 12, kind="blocking", prefix="b")
    enqueue(client, tenant, 30)
    worker = make_worker(client, registry, concurrency=6, sync_concurrency=2, batch_size=10)

    assert worker.uses_event_loop
    report = worker.drain(FakeDeadline(60))

    assert report.succeeded == 42
    assert sync_flight.most == 2  # never more sync jobs than their limit, and both used
    assert every.most == 6
    assert async_flight.most >= 4  # the async jobs took the slots the sync ones left
    assert states(owner) == {"succeeded": 42}


def test_without_a_sync_limit_sync_handlers_share_every_slot_as_before(
        client: QueueClient) -> None:
    flight = InFlight()
    registry = Registry()

    @registry.handler("echo")
    def work(payload: Any, ctx: JobContext) -> None:
        flight.enter()
        try:
            time.sleep(0.03)
        finally:
            flight.leave()

    enqueue(client, uuid.uuid4(), 20)
    worker = make_worker(client, registry, concurrency=4)

    assert worker.config.sync_limit == 4
    assert worker.drain(FakeDeadline(60)).succeeded == 20
    assert flight.most == 4


def test_a_sync_limit_above_the_concurrency_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError, match=r"sync_concurrency \(3\) is more than "
                                                 r"concurrency \(2\)"):
        WorkerConfig(owner="w", concurrency=2, sync_concurrency=3)


def test_a_sync_job_waiting_behind_a_hung_sync_thread_is_given_back_and_the_drain_ends(
        client: QueueClient, owner: Conn) -> None:
    """The only sync slot is held by a thread past its budget that will not return in this
    invocation: the sync job behind it must not wait for it until Lambda kills the
    invocation, but go back to the queue once its budget no longer fits the time left."""
    registry = Registry()
    release = threading.Event()

    @registry.handler("hang", timeout=1)
    def hang(payload: Any, ctx: JobContext) -> None:
        release.wait(30)

    @registry.handler("blocking", timeout=3)
    def blocking(payload: Any, ctx: JobContext) -> None:
        return None

    @registry.handler("echo")
    async def unused(payload: Any, ctx: JobContext) -> None:
        return None

    tenant = uuid.uuid4()
    enqueue(client, tenant, kind="hang", prefix="h")
    enqueue(client, tenant, kind="blocking", prefix="b")
    worker = make_worker(client, registry, concurrency=4, sync_concurrency=1, job_timeout=3)
    started = time.monotonic()
    try:
        # 3 s budget + 5 s margin + 1 s to record: it fits only in the first 2 seconds.
        report = worker.drain(MonotonicDeadline(11))
        elapsed = time.monotonic() - started
    finally:
        release.set()

    assert (report.retried, report.given_back) == (1, 1)  # the hung one: JOB_TIMEOUT
    assert elapsed < 8
    assert states(owner) == {"pending": 1, "retry_wait": 1}
