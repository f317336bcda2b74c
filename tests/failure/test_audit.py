"""The chaos audit itself must be able to fail: each check is shown catching the
defect it exists for, on a log tampered with by the administrator."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from leaseq import EnqueueRequest, JobOutcome, QueueClient, connect

from tests.conftest import Database
from tests.failure.audit import (
    audit_queue,
    create_side_effects_table,
    drop_side_effects_table,
)
from tests.support import postgres
from tests.support.postgres import Conn


@pytest.fixture
def effects(db: Database, admin: Conn) -> Iterator[Conn]:
    create_side_effects_table(admin, postgres.WORKER)
    yield admin
    drop_side_effects_table(admin)


def _one_completed_job(db: Database, admin: Conn, *, with_effect: bool = True) -> uuid.UUID:
    client = QueueClient(lambda: connect(db.worker_dsn))
    tenant = uuid.uuid4()
    client.enqueue_job(EnqueueRequest(tenant_id=tenant, operation_key="a", kind="k"))
    (job,) = client.claim_jobs(tenant, "w1", 1, timedelta(seconds=30))
    if with_effect:
        admin.execute(
            "insert into public.side_effects (job_id, lease_token, attempt, kind, worker)"
            " values (%s, %s, 1, 'k', 'w1')", (job.id, job.lease_token))
    assert client.finish_jobs("w1", [JobOutcome(job, "succeeded", {})])
    client.close()
    return job.id


def test_a_clean_log_passes_the_audit(db: Database, effects: Conn) -> None:
    _one_completed_job(db, effects)
    report = audit_queue(effects)
    assert report.violations == []
    assert (report.jobs, report.claims, report.executions) == (1, 1, 1)


def test_a_second_success_event_is_counted_as_a_double_completion(
    db: Database, effects: Conn
) -> None:
    job_id = _one_completed_job(db, effects)
    effects.execute(
        "insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token)"
        " select tenant_id, job_id, event_type, actor, lease_token from app.job_events"
        " where job_id = %s and event_type = 'succeeded'", (job_id,))
    report = audit_queue(effects)
    assert report.double_completions == 1
    assert report.violations


def test_a_success_no_handler_completed_is_caught(db: Database, effects: Conn) -> None:
    _one_completed_job(db, effects, with_effect=False)
    report = audit_queue(effects)
    assert report.unbacked_successes == 1


def test_attempts_that_disagree_with_the_claims_are_caught(db: Database, effects: Conn) -> None:
    job_id = _one_completed_job(db, effects)
    effects.execute("update app.jobs set attempts = 2 where id = %s", (job_id,))
    assert any("attempts" in v for v in audit_queue(effects).violations)


def test_an_unfinished_job_is_caught(db: Database, effects: Conn) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn))
    client.enqueue_job(EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="a", kind="k"))
    client.close()
    report = audit_queue(effects)
    assert report.states["pending"] == 1
    assert any("terminal" in v for v in report.violations)
