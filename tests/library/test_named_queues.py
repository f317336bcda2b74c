"""Named queues in the library: a request's queue, a kind declared with one, a worker of
one queue, and the operator's pause, resume and overview, on a real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from leaseq import (
    ConfigurationError,
    EnqueueRequest,
    JobContext,
    QueueClient,
    Registry,
    Worker,
    WorkerConfig,
    connect,
)
from leaseq.store.duties import OperatorClient
from pydantic import BaseModel, ValidationError

from tests.conftest import Database
from tests.support import postgres
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn

TENANT = uuid.UUID("7d2f3c1e-0000-4000-8000-00000000b001")
LEASE = timedelta(seconds=30)


class Report(BaseModel):
    month: str


@pytest.fixture
def operator(db: Database) -> Iterator[OperatorClient]:
    client = QueueClient(lambda: connect(db.dsn(postgres.OPERATOR)))
    yield OperatorClient(client)
    client.close()


def request(key: str, queue: str | None = None, kind: str = "echo") -> EnqueueRequest:
    return EnqueueRequest(tenant_id=TENANT, operation_key=key, kind=kind, queue=queue)


def queues_of(owner: Conn) -> dict[str, str]:
    rows = owner.execute("select operation_key, queue from app.jobs").fetchall()
    return {row["operation_key"]: row["queue"] for row in rows}


@pytest.mark.parametrize("name", ["Reports", "", "9lives", "a" * 41, "re ports"])
def test_a_request_refuses_a_queue_name_before_anything_is_sent(name: str) -> None:
    with pytest.raises(ValidationError, match="must be a queue name"):
        request("k", queue=name)


def test_a_kinds_declared_queue_is_its_jobs_unless_the_producer_names_another(
        client: QueueClient, owner: Conn) -> None:
    registry = Registry()

    @registry.handler("report.build", payload=Report, queue="reports")
    def build(report: Report, ctx: JobContext) -> None: ...

    build.defer(client, TENANT, "declared", Report(month="2026-11"))
    build.defer(client, TENANT, "named", Report(month="2026-11"), queue="urgent")
    routed = registry.routed(request("door", kind="report.build"))
    assert routed.queue == "reports"
    assert registry.routed(request("other", kind="unknown")).queue is None
    assert queues_of(owner) == {"declared": "reports", "named": "urgent"}


def test_a_kind_declared_with_a_bad_queue_is_refused_at_registration() -> None:
    with pytest.raises(ConfigurationError, match="queue of kind 'x'"):
        Registry().register("x", lambda payload, ctx: None, queue="No Queue")


def test_a_worker_of_one_queue_runs_its_jobs_only_and_leaves_the_others(
        client: QueueClient, owner: Conn) -> None:
    registry = Registry()
    registry.register("echo", lambda payload, ctx: {"queue": ctx.job.id is not None})
    client.enqueue_jobs([request("r1", "reports"), request("r2", "reports"),
                         request("d1")])
    config = WorkerConfig(owner="reports-1", queue="reports", poll_idle=0)
    report = Worker(client, registry, config).drain(FakeDeadline(60))
    assert report.succeeded == 2
    states = {r["operation_key"]: r["state"] for r in owner.execute(
        "select operation_key, state::text from app.jobs").fetchall()}
    assert states == {"r1": "succeeded", "r2": "succeeded", "d1": "pending"}


def test_a_worker_refuses_a_queue_name_no_queue_can_have() -> None:
    with pytest.raises(ConfigurationError, match="queue must be a queue name"):
        WorkerConfig(owner="w", queue="Bad")


def test_an_operator_pauses_and_resumes_a_queue_and_sees_it_in_the_overview(
        client: QueueClient, operator: OperatorClient) -> None:
    client.enqueue_jobs([request("r1", "reports"), request("d1")])
    state = operator.pause_queue("reports", "ada", "incident")
    assert state.paused
    assert state.paused_by == "ada"
    assert client.claim_ready_jobs("w", 10, LEASE, queue="reports") == []
    views = {v.queue: v for v in operator.queue_overview()}
    assert views["reports"].paused
    assert views["reports"].ready == 1
    assert not views["default"].paused
    resumed = operator.resume_queue("reports", "ada")
    assert not resumed.paused
    history: list[dict[str, Any]] = operator.queue_history("reports")
    assert [e["event_type"] for e in history] == ["resumed", "paused"]
    assert len(client.claim_ready_jobs("w", 10, LEASE, queue="reports")) == 1
