"""A running job cancelled by an operator, as its worker and handler see it: the
renewal tells the worker (``ctx.cancelled``), an ``async def`` handler's task is
cancelled after the worker's grace and may clean up, a sync handler may look, and the
job ends cancelled whatever the handler returns. The operator is a login of its own
(leaseq_operator), never the worker's."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from leaseq import (
    JobContext,
    MonotonicDeadline,
    QueueClient,
    Registry,
    Worker,
    WorkerConfig,
    connect,
)

from tests.conftest import Database
from tests.library.support import enqueue, event_types, job
from tests.support import postgres
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn

ACTOR = "leaseq-cli:ada"


@pytest.fixture
def operator(db: Database) -> Iterator[QueueClient]:
    queue = QueueClient(lambda: connect(db.dsn(postgres.OPERATOR)))
    yield queue
    queue.close()


def make_worker(client: QueueClient, registry: Registry, **config: Any) -> Worker:
    config.setdefault("poll_idle", 0)
    return Worker(client, registry, WorkerConfig(owner="cancel-1", **config),
                  rand=lambda: 0.5)


def _cancelled_by_operator(owner: Conn, job_id: uuid.UUID) -> None:
    row = job(owner, job_id)
    assert row["state"] == "cancelled"
    assert row["cancel_requested_by"] == ACTOR
    assert event_types(owner, job_id)[-2:] == ["cancel_requested", "cancelled"]


def test_a_sync_handler_that_renews_sees_ctx_cancelled_and_its_job_ends_cancelled(
        client: QueueClient, operator: QueueClient, owner: Conn) -> None:
    seen: dict[str, Any] = {}
    registry = Registry()

    @registry.handler("export")
    def export(payload: Any, ctx: JobContext) -> dict[str, Any]:
        seen["before"] = ctx.cancelled
        operator.request_job_cancel(ACTOR, [ctx.job.id])  # the operator, meanwhile
        seen["renewed"] = ctx.renew_lease()
        seen["after"] = (ctx.cancelled, ctx.stop_requested, ctx.stop_reason)
        return {"pages": 1}  # stopped early, cleanly

    (job_id,) = enqueue(client, uuid.uuid4(), kind="export")

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert seen == {"before": False, "renewed": True,
                    "after": (True, True, "cancelled")}
    assert (report.cancelled, report.succeeded, report.retried) == (1, 0, 0)
    _cancelled_by_operator(owner, job_id)
    assert job(owner, job_id)["result"] == {"pages": 1}  # the work done is kept


def test_a_sync_handler_that_never_looks_ends_cancelled_at_its_outcome_not_retried(
        client: QueueClient, operator: QueueClient, owner: Conn) -> None:
    registry = Registry()

    @registry.handler("stubborn")
    def stubborn(payload: Any, ctx: JobContext) -> None:
        operator.request_job_cancel(ACTOR, [ctx.job.id])
        raise RuntimeError("failed after the cancel")  # would be retried otherwise

    (job_id,) = enqueue(client, uuid.uuid4(), kind="stubborn")

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.cancelled, report.retried) == (1, 0)
    _cancelled_by_operator(owner, job_id)
    assert job(owner, job_id)["last_error"]["code"] == "HANDLER_ERROR"


def test_a_job_cancelled_before_its_handler_starts_does_not_run(
        client: QueueClient, operator: QueueClient, owner: Conn) -> None:
    ran: list[str] = []
    registry = Registry()

    @registry.handler("first", timeout=2)
    def first(payload: Any, ctx: JobContext) -> None:
        # The operator cancels the batch's second job while the first one runs.
        operator.request_job_cancel(ACTOR, [second_id])
        ran.append("first")

    @registry.handler("second", timeout=2)
    def second(payload: Any, ctx: JobContext) -> None:
        ran.append("second")

    tenant = uuid.uuid4()
    (first_id,) = enqueue(client, tenant, kind="first", prefix="a")
    (second_id,) = enqueue(client, tenant, kind="second", prefix="b")

    # A capped lease ends before the second job's budget would: it is renewed before it
    # starts, and that renewal says it was cancelled.
    report = make_worker(client, registry, max_lease=1, lease_margin=1, batch_size=2).drain(
        FakeDeadline(60))

    assert ran == ["first"]
    assert (report.succeeded, report.cancelled) == (1, 1)
    assert job(owner, first_id)["state"] == "succeeded"
    _cancelled_by_operator(owner, second_id)
    assert job(owner, second_id)["last_error"]["code"] == "CANCELLED"


@pytest.mark.parametrize("grace", [0.0, 0.3])
def test_an_async_handler_is_cancelled_after_the_grace_and_cleans_up(
        client: QueueClient, operator: QueueClient, owner: Conn, grace: float) -> None:
    steps: list[str] = []
    timing: dict[str, float] = {}
    registry = Registry()

    @registry.handler("crawl", timeout=20)
    async def crawl(payload: Any, ctx: JobContext) -> str:
        await asyncio.to_thread(operator.request_job_cancel, ACTOR, [ctx.job.id])
        assert await ctx.renew_lease_async()  # the renewal tells the worker
        steps.append(f"cancelled={ctx.cancelled}")
        timing["seen"] = time.monotonic()
        try:
            await asyncio.sleep(15)  # ignores the flag: the grace ends it
        except asyncio.CancelledError:
            timing["interrupted"] = time.monotonic()
            steps.append("cleanup")
            raise
        return "never"

    (job_id,) = enqueue(client, uuid.uuid4(), kind="crawl")

    report = make_worker(client, registry, concurrency=2, max_lease=10,
                         cancel_grace=grace).drain(MonotonicDeadline(60))

    assert steps == ["cancelled=True", "cleanup"]
    waited = timing["interrupted"] - timing["seen"]
    assert grace <= waited < grace + 5
    assert (report.cancelled, report.retried, report.lost_leases) == (1, 0, 0)
    _cancelled_by_operator(owner, job_id)
    assert job(owner, job_id)["last_error"]["code"] == "CANCELLED"


def test_the_worker_s_own_renewal_tells_an_async_handler_that_waits_for_a_stop(
        client: QueueClient, operator: QueueClient, owner: Conn) -> None:
    seen: dict[str, Any] = {}
    registry = Registry()

    @registry.handler("wait", timeout=20)
    async def wait(payload: Any, ctx: JobContext) -> str:
        await asyncio.to_thread(operator.request_job_cancel, ACTOR, [ctx.job.id])
        # No renewal of its own: the worker renews its 1 s lease every half second.
        seen["stopped"] = await ctx.wait_for_stop_async(timeout=10)
        seen["why"] = (ctx.cancelled, ctx.stop_reason)
        return "stopped early"

    (job_id,) = enqueue(client, uuid.uuid4(), kind="wait")

    report = make_worker(client, registry, concurrency=2, max_lease=1, lease_margin=1,
                         job_timeout=20).drain(MonotonicDeadline(60))

    assert seen == {"stopped": True, "why": (True, "cancelled")}
    assert report.cancelled == 1
    _cancelled_by_operator(owner, job_id)
    assert job(owner, job_id)["result"] == "stopped early"


def test_a_sync_handler_in_a_thread_polls_ctx_cancelled_from_its_own_renewal(
        client: QueueClient, operator: QueueClient, owner: Conn) -> None:
    seen: dict[str, Any] = {}
    registry = Registry()

    @registry.handler("poll", timeout=20)
    def poll(payload: Any, ctx: JobContext) -> str:
        operator.request_job_cancel(ACTOR, [ctx.job.id])
        seen["renewed"] = ctx.renew_lease()
        seen["cancelled"] = ctx.cancelled  # at once, in the handler's own thread
        return "stopped"

    (job_id,) = enqueue(client, uuid.uuid4(), kind="poll")

    report = make_worker(client, registry, concurrency=2, max_lease=10).drain(
        MonotonicDeadline(60))

    assert seen == {"renewed": True, "cancelled": True}
    assert report.cancelled == 1
    _cancelled_by_operator(owner, job_id)


def test_a_worker_login_cannot_cancel_a_job(db: Database, client: QueueClient) -> None:
    from leaseq import PermissionDeniedError

    (job_id,) = enqueue(client, uuid.uuid4())
    worker_only = QueueClient(lambda: connect(db.dsn(postgres.DUTY_WORKER)))
    try:
        with pytest.raises(PermissionDeniedError):
            worker_only.request_job_cancel(ACTOR, [job_id])
    finally:
        worker_only.close()


def test_the_grace_is_an_owner_setting_with_a_documented_default_and_bounds() -> None:
    from leaseq import ConfigurationError, LeaseqSettings, WorkerSettings

    assert WorkerConfig(owner="w").cancel_grace == 10.0
    worker = LeaseqSettings.from_env({"DATABASE_URL": "postgresql://u@h/db",
                                      "LEASEQ_CANCEL_GRACE_SECONDS": "2.5"}).worker
    assert worker.config_values()["cancel_grace"] == 2.5
    with pytest.raises(ConfigurationError, match="LEASEQ_CANCEL_GRACE_SECONDS"):
        WorkerConfig(owner="w", cancel_grace=601,
                     setting_names=WorkerSettings.setting_names())
