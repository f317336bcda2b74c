"""The worker pool from the library's side: the client's pool calls, the ScaleUp policy
(with a clock the test moves), the on_claim hook of both drains, the per-invocation
poll_idle, and the pool's settings. Drains and pool calls run on a real PostgreSQL."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from leaseq import (
    ClaimedJob,
    ConfigurationError,
    InvalidRequestError,
    JobContext,
    LeaseqSettings,
    MonotonicDeadline,
    PermissionDeniedError,
    PoolLimits,
    PoolSettings,
    PoolSize,
    QueueClient,
    Registry,
    ScaleUp,
    Worker,
    WorkerConfig,
    connect,
    set_worker_pool_limits,
)
from leaseq.drain import config as leaseq_config
from leaseq_lambda.runtime import Runtime

from tests.conftest import Database
from tests.library.support import enqueue
from tests.support.fakes import FakeDeadline, ManualClock
from tests.support.postgres import Conn

DSN = "postgresql://worker@db.internal/leaseq"


def claimed(count: int, *, waited: float, clock: ManualClock) -> list[ClaimedJob]:
    """``count`` claimed jobs that became ready ``waited`` seconds before the clock's now."""
    ready = datetime.fromtimestamp(clock.now - waited, UTC)
    return [ClaimedJob(id=uuid.uuid4(), tenant_id=uuid.uuid4(), operation_key=f"k-{i}",
                       kind="echo", payload={}, attempts=1, max_attempts=6, available_at=ready,
                       created_at=ready, lease_owner="w", lease_token=uuid.uuid4(),
                       lease_expires_at=ready + timedelta(minutes=1))
            for i in range(count)]


# ScaleUp ----------------------------------------------------------------------------------


def test_a_full_claim_asks_for_one_more_place_at_most_once_per_interval() -> None:
    clock = ManualClock()
    policy = ScaleUp(clock=clock)

    answers = [policy.wanted(claimed(10, waited=0.0, clock=clock), 10)]
    clock.advance(0.5)
    answers.append(policy.wanted(claimed(10, waited=0.0, clock=clock), 10))
    clock.advance(0.5)
    answers.append(policy.wanted(claimed(10, waited=0.0, clock=clock), 10))

    assert answers == [1, 0, 1]


def test_a_claim_whose_oldest_job_waited_longer_than_the_lag_asks_for_one_more_place() -> None:
    clock = ManualClock()
    policy = ScaleUp(lag=1.0, interval=1.0, clock=clock)
    jobs = claimed(2, waited=0.2, clock=clock) + claimed(1, waited=1.5, clock=clock)

    assert policy.wanted(jobs, 10) == 1


def test_a_short_claim_of_fresh_jobs_and_an_empty_claim_ask_for_nothing() -> None:
    clock = ManualClock()
    policy = ScaleUp(lag=1.0, clock=clock)

    assert policy.wanted(claimed(3, waited=1.0, clock=clock), 10) == 0
    assert policy.wanted([], 10) == 0
    assert policy.wanted([], 0) == 0


def test_claims_that_ask_for_nothing_do_not_delay_the_next_ask() -> None:
    clock = ManualClock()
    policy = ScaleUp(lag=5.0, interval=10.0, clock=clock)
    assert policy.wanted(claimed(1, waited=0.0, clock=clock), 10) == 0

    clock.advance(0.1)

    assert policy.wanted(claimed(10, waited=0.0, clock=clock), 10) == 1


def test_the_lag_and_interval_are_settable_and_refused_below_zero() -> None:
    clock = ManualClock()
    eager = ScaleUp(lag=0.0, interval=0.0, clock=clock)

    assert [eager.wanted(claimed(1, waited=0.01, clock=clock), 10) for _ in range(3)] == [1, 1, 1]
    with pytest.raises(ConfigurationError, match="lag and interval must be at least 0"):
        ScaleUp(lag=-1.0)
    with pytest.raises(ConfigurationError, match="lag and interval must be at least 0"):
        ScaleUp(interval=float("nan"))


def test_pool_members_asking_once_a_second_double_the_pool_each_second() -> None:
    """The arithmetic the policy is for: each member asks for one place per interval
    while its claims come back full, so 1 member becomes 2, 4, 8 (the maximum caps it
    in the database)."""
    clock = ManualClock()
    members = [ScaleUp(clock=clock)]
    sizes = [len(members)]
    for _ in range(3):
        wanted = sum(m.wanted(claimed(10, waited=0.0, clock=clock), 10) for m in members)
        members += [ScaleUp(clock=clock) for _ in range(wanted)]
        sizes.append(len(members))
        clock.advance(1.0)

    assert sizes == [1, 2, 4, 8]


# The client's pool calls --------------------------------------------------------------------


def test_the_client_joins_reserves_releases_wakes_and_counts_the_pool(
    client: QueueClient, owner: Conn
) -> None:
    set_worker_pool_limits(owner, max_workers=3)
    assert client.worker_pool_size() == PoolSize(live=0, reserved=0)
    woken = client.wake_worker_place()
    assert isinstance(woken, uuid.UUID)
    assert client.wake_worker_place() is None
    assert client.worker_pool_size() == PoolSize(live=0, reserved=0)  # a ticket, no room

    assert client.join_worker_pool("woken", "wake", woken, max_workers=1000, expires_in=65.0)
    reserved = client.reserve_worker_places(5, max_workers=1000, hold=90.0)
    assert len(reserved) == 2
    assert client.worker_pool_size() == PoolSize(live=1, reserved=2)
    assert client.join_worker_pool("duplicate", "fanout", woken, max_workers=3,
                                   expires_in=65.0) is False

    client.release_worker_place(reserved[0])
    assert client.join_worker_pool("tick", "schedule", None, max_workers=3, expires_in=65.0)
    client.leave_worker_pool("woken")
    size = client.worker_pool_size()

    assert size == PoolSize(live=1, reserved=1)
    assert size.total == 2
    rows = owner.execute("select owner, reason from app.worker_pool order by owner").fetchall()
    assert rows == [{"owner": "tick", "reason": "schedule"}, {"owner": None, "reason": "fanout"}]


def test_the_owner_sets_the_pool_limits_and_the_client_cannot(
    client: QueueClient, owner: Conn, db: Database
) -> None:
    assert set_worker_pool_limits(owner, max_workers=6, wake_debounce=0.5) == PoolLimits(
        max_workers=6, start_hold=90.0, wake_debounce=0.5)
    assert set_worker_pool_limits(owner, start_hold=120) == PoolLimits(6, 120.0, 0.5)
    with pytest.raises(InvalidRequestError, match="p_start_hold must be between") as refused:
        set_worker_pool_limits(owner, start_hold=86_400)
    assert refused.value.sqlstate == "22023"

    with connect(db.worker_dsn) as worker, pytest.raises(PermissionDeniedError):
        set_worker_pool_limits(worker, max_workers=1000)
    assert set_worker_pool_limits(owner) == PoolLimits(6, 120.0, 0.5)
    assert len(client.reserve_worker_places(10, max_workers=1000, hold=900)) == 6


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 1e300])
def test_a_duration_no_interval_can_hold_is_refused_naming_it_before_anything_is_sent(
    client: QueueClient, owner: Conn, seconds: float
) -> None:
    with pytest.raises(InvalidRequestError, match="hold must be a finite number of seconds"):
        client.reserve_worker_places(1, max_workers=2, hold=seconds)
    with pytest.raises(InvalidRequestError, match="expires_in must be a finite number"):
        client.join_worker_pool("w", "schedule", None, max_workers=2, expires_in=seconds)
    with pytest.raises(InvalidRequestError, match="wake_debounce must be a finite number"):
        set_worker_pool_limits(owner, wake_debounce=seconds)

    assert client.worker_pool_size() == PoolSize(live=0, reserved=0)


def test_a_duration_out_of_the_contracts_range_is_refused_by_the_database_with_22023(
    client: QueueClient,
) -> None:
    with pytest.raises(InvalidRequestError, match="p_hold must be between") as refused:
        client.reserve_worker_places(1, max_workers=2, hold=0.0)
    assert refused.value.sqlstate == "22023"
    with pytest.raises(InvalidRequestError, match="p_expires_in must be between") as refused:
        client.join_worker_pool("w", "schedule", None, max_workers=2, expires_in=86_400.0)
    assert refused.value.sqlstate == "22023"
    with pytest.raises(InvalidRequestError, match="p_reason must be one of") as refused:
        client.join_worker_pool("w", "cron", None, max_workers=2, expires_in=60.0)
    assert refused.value.sqlstate == "22023"


# The on_claim hook ---------------------------------------------------------------------------


@dataclass
class Claims:
    """What the hook saw: per claim the jobs, the limit, the thread, and whether any of
    those jobs had already started when the hook was told."""

    started: set[uuid.UUID] = field(default_factory=set)
    seen: list[tuple[list[uuid.UUID], int, str, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, jobs: Sequence[ClaimedJob], limit: int) -> None:
        with self.lock:
            ids = [j.id for j in jobs]
            self.seen.append((ids, limit, threading.current_thread().name,
                              bool(self.started & set(ids))))

    def registry(self) -> Registry:
        registry = Registry()

        def echo(payload: Any, ctx: JobContext) -> None:
            with self.lock:
                self.started.add(ctx.job.id)

        registry.register("echo", echo)
        return registry


def drainer(client: QueueClient, registry: Registry, hook: Any, **config: Any) -> Worker:
    config.setdefault("poll_idle", 0)
    return Worker(client, registry, WorkerConfig(owner="pool-1", **config), on_claim=hook,
                  rand=lambda: 0.5)


def test_the_one_at_a_time_drain_tells_on_claim_every_claim_before_its_jobs_start(
    client: QueueClient,
) -> None:
    claims = Claims()
    ids = enqueue(client, uuid.uuid4(), 25)
    worker = drainer(client, claims.registry(), claims.hook, batch_size=10)
    assert not worker.uses_event_loop

    report = worker.drain(FakeDeadline(60))

    assert report.succeeded == 25
    assert [(len(jobs), limit) for jobs, limit, _, _ in claims.seen] == [
        (10, 10), (10, 10), (5, 10), (0, 10)]
    assert {i for jobs, _, _, _ in claims.seen for i in jobs} == set(ids)
    assert {thread for _, _, thread, _ in claims.seen} == {threading.current_thread().name}
    assert [already for _, _, _, already in claims.seen] == [False] * 4


def test_the_event_loop_drain_tells_on_claim_from_its_database_thread(
    client: QueueClient,
) -> None:
    claims = Claims()
    ids = enqueue(client, uuid.uuid4(), 30)
    worker = drainer(client, claims.registry(), claims.hook, concurrency=4, batch_size=4)
    assert worker.uses_event_loop

    report = worker.drain(FakeDeadline(60))

    assert report.succeeded == 30
    assert sorted(i for jobs, _, _, _ in claims.seen for i in jobs) == sorted(ids)
    assert all(len(jobs) <= limit for jobs, limit, _, _ in claims.seen)
    assert claims.seen[-1][0] == []  # the poll that found the queue empty
    assert {thread.split("_")[0] for _, _, thread, _ in claims.seen} == {"leaseq-db"}
    assert not any(already for _, _, _, already in claims.seen)


@pytest.mark.parametrize("concurrency", [1, 4], ids=["one-at-a-time", "event-loop"])
def test_an_on_claim_hook_that_raises_is_logged_and_the_drain_goes_on(
    client: QueueClient, caplog: pytest.LogCaptureFixture, concurrency: int
) -> None:
    calls: list[int] = []

    def broken(jobs: Sequence[ClaimedJob], limit: int) -> None:
        calls.append(len(jobs))
        raise RuntimeError("the fan-out is broken")

    enqueue(client, uuid.uuid4(), 12)
    worker = drainer(client, Claims().registry(), broken, concurrency=concurrency,
                     batch_size=4)

    with caplog.at_level(logging.ERROR, logger="leaseq.worker"):
        report = worker.drain(FakeDeadline(60))

    assert report.succeeded == 12
    assert report.stopped == "queue_empty"
    assert sum(calls) == 12
    failures = [r for r in caplog.records
                if r.getMessage() == "on_claim hook failed; the drain goes on"]
    assert len(failures) == len(calls)
    assert failures[0].exc_info is not None
    assert "the fan-out is broken" in str(failures[0].exc_info[1])


def test_scale_up_as_the_hook_asks_once_for_a_backlog_drained_within_its_interval(
    client: QueueClient,
) -> None:
    clock = ManualClock(start=datetime.now(UTC).timestamp())
    policy = ScaleUp(clock=clock)
    asked: list[int] = []
    enqueue(client, uuid.uuid4(), 25)
    worker = drainer(client, Claims().registry(),
                     lambda jobs, limit: asked.append(policy.wanted(jobs, limit)), batch_size=10)

    worker.drain(FakeDeadline(60))

    assert asked == [1, 0, 0, 0]


# poll_idle per invocation ------------------------------------------------------------------


def test_an_invocation_may_poll_for_less_time_than_the_configured_idle(db: Database) -> None:
    settings = LeaseqSettings.from_env({"DATABASE_URL": db.worker_dsn,
                                        "LEASEQ_POLL_IDLE_SECONDS": "30"})
    registry = Claims().registry()
    queue = QueueClient(lambda: pytest.fail("no statement is sent"))
    runtime = Runtime(settings, queue, _registry=registry)

    started = runtime.worker("started", poll_idle=2.5, deadline=MonotonicDeadline(60))
    scheduled = runtime.worker("scheduled", deadline=MonotonicDeadline(60))

    assert started.config.poll_idle == 2.5
    assert scheduled.config.poll_idle == 30.0
    with pytest.raises(ConfigurationError, match="this invocation's poll_idle"):
        runtime.worker("started", poll_idle=-1.0, deadline=MonotonicDeadline(60))


# Settings -------------------------------------------------------------------------------------


def test_without_pool_settings_there_is_no_pool() -> None:
    pool = LeaseqSettings.from_env({"DATABASE_URL": DSN}).pool

    assert pool == PoolSettings()
    assert (pool.max_workers, pool.enabled, pool.worker_function) == (0, False, None)
    assert (pool.fanout_idle_seconds, pool.start_hold_seconds) == (10.0, 90.0)


def test_every_pool_variable_is_read() -> None:
    pool = LeaseqSettings.from_env({
        "DATABASE_URL": DSN, "LEASEQ_MAX_WORKERS": "8",
        "LEASEQ_WORKER_FUNCTION": "arn:aws:lambda:us-east-1:1:function:leaseq-worker",
        "LEASEQ_FANOUT_IDLE_SECONDS": "5", "LEASEQ_START_HOLD_SECONDS": "120",
    }).pool

    assert pool.enabled
    assert (pool.max_workers, pool.worker_function) == (
        8, "arn:aws:lambda:us-east-1:1:function:leaseq-worker")
    assert (pool.fanout_idle_seconds, pool.start_hold_seconds) == (5.0, 120.0)


def test_the_wake_debounce_is_no_setting_of_a_function_any_more() -> None:
    """It is the schema owner's (app.settings.wake_debounce): a producer's environment
    cannot choose it, and a variable left from an earlier release changes nothing."""
    pool = LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_WAKE_DEBOUNCE_SECONDS": "0"}).pool

    assert pool == PoolSettings()
    assert not hasattr(pool, "wake_debounce_seconds")


def test_a_pool_without_a_worker_function_to_start_is_refused_naming_both_variables() -> None:
    with pytest.raises(ConfigurationError) as refused:
        LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_MAX_WORKERS": "4"})

    message = refused.value.message
    assert "LEASEQ_MAX_WORKERS is 4 but LEASEQ_WORKER_FUNCTION is not set" in message
    assert "set LEASEQ_MAX_WORKERS to 0" in message
    # Empty counts as unset, as for every variable.
    with pytest.raises(ConfigurationError, match="LEASEQ_WORKER_FUNCTION is not set"):
        LeaseqSettings.from_env({"DATABASE_URL": DSN, "LEASEQ_MAX_WORKERS": "4",
                                 "LEASEQ_WORKER_FUNCTION": ""})


@pytest.mark.parametrize(("variable", "value"), [
    ("LEASEQ_MAX_WORKERS", "-1"), ("LEASEQ_MAX_WORKERS", "1001"), ("LEASEQ_MAX_WORKERS", "2.5"),
    ("LEASEQ_FANOUT_IDLE_SECONDS", "-1"), ("LEASEQ_START_HOLD_SECONDS", "0.5"),
    ("LEASEQ_START_HOLD_SECONDS", "901"),
])
def test_a_pool_setting_out_of_its_bounds_is_refused_naming_its_variable(
    variable: str, value: str
) -> None:
    environ = {"DATABASE_URL": DSN, "LEASEQ_WORKER_FUNCTION": "leaseq-worker", variable: value}

    with pytest.raises(ConfigurationError, match=variable):
        LeaseqSettings.from_env(environ)


def test_the_pool_settings_take_their_defaults_and_bounds_from_the_one_table() -> None:
    variables = {"max_workers": "LEASEQ_MAX_WORKERS",
                 "fanout_idle": "LEASEQ_FANOUT_IDLE_SECONDS",
                 "start_hold": "LEASEQ_START_HOLD_SECONDS"}
    assert set(variables) == set(leaseq_config.POOL_BOUNDS)
    named = {"LEASEQ_WORKER_FUNCTION": "leaseq-worker"}
    defaults = PoolSettings.model_validate(named)
    for key, variable in variables.items():
        bounds = leaseq_config.POOL_BOUNDS[key]
        name = str(next(n for n, f in PoolSettings.model_fields.items() if f.alias == variable))
        assert getattr(defaults, name) == bounds.default, variable
        assert getattr(PoolSettings.model_validate({**named, variable: bounds.high}),
                       name) == bounds.high
        assert getattr(PoolSettings.model_validate({**named, variable: bounds.low}),
                       name) == bounds.low
        for outside in (bounds.low - 1, bounds.high + 1):
            with pytest.raises(ValueError, match=variable):
                PoolSettings.model_validate({**named, variable: outside})
