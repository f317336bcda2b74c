"""The reason on a dead event is what operators sort dead jobs by (and redrive by):
"discarded" means retrying cannot help, "max_attempts" means retries ran out."""

from __future__ import annotations

import uuid
from typing import Any

from leaseq import (
    DiscardJob,
    EnqueueRequest,
    JobContext,
    QueueClient,
    Registry,
    RetryPolicy,
    Worker,
    WorkerConfig,
    connect,
)

from tests.conftest import Database
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


def _drain_until_finished(db: Database, registry: Registry, kind: str, max_attempts: int) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn))
    client.enqueue_job(EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="op", kind=kind,
                                      max_attempts=max_attempts))
    worker = Worker(client, registry, WorkerConfig(
        owner="w1", job_timeout=5, retry=RetryPolicy(base_delay=0, max_delay=0),
        poll_idle=0))
    for _ in range(max_attempts):
        worker.drain(FakeDeadline(60))
    client.close()


def _dead_event(admin: Conn) -> dict[str, Any]:
    row = admin.execute(
        "select e.details->>'reason' as reason, j.attempts, j.last_error->>'code' as code"
        " from app.job_events e join app.jobs j on j.id = e.job_id"
        " where e.event_type = 'dead'").fetchone()
    assert row is not None
    return row


def test_a_handler_discard_is_recorded_as_discarded(db: Database, admin: Conn) -> None:
    registry = Registry()

    def discard(payload: Any, context: JobContext) -> None:
        raise DiscardJob("never")

    registry.register("k", discard)
    _drain_until_finished(db, registry, "k", 3)
    assert _dead_event(admin) == {"reason": "discarded", "attempts": 1, "code": "DISCARDED"}


def test_a_job_that_fails_every_attempt_dies_with_reason_max_attempts(
    db: Database, admin: Conn
) -> None:
    registry = Registry()

    def fail(payload: Any, context: JobContext) -> None:
        raise RuntimeError(f"attempt {context.attempt} failed")

    registry.register("k", fail)
    _drain_until_finished(db, registry, "k", 3)
    assert _dead_event(admin) == {"reason": "max_attempts", "attempts": 3,
                                  "code": "HANDLER_ERROR"}
