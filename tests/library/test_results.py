"""What became of a job, read by its producer, and waiting for it without busy-looping:
bounded polling with backoff and jitter, on the producer's connection or a QueueClient,
with the producer logins' privileges (a tenant-bound login reads only its tenants)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from leaseq import (
    DatabaseError,
    EnqueueRequest,
    JobOutcome,
    JobState,
    PermissionDeniedError,
    QueueClient,
    ResultTimeoutError,
    connect,
    enqueue_job,
    wait_for_result,
)
from leaseq.base.results import JobResult, poll_until_finished

from tests.conftest import Database
from tests.support import postgres
from tests.support.fakes import ManualClock
from tests.support.postgres import Conn

TENANT = uuid.UUID("3c1d2e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f")
OTHER = uuid.UUID("9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a")


def request(key: str, tenant: uuid.UUID = TENANT) -> EnqueueRequest:
    return EnqueueRequest(tenant_id=tenant, operation_key=key, kind="echo",
                          payload={"secret": "payload"})


def finish(client: QueueClient, outcome: str = "succeeded", detail: Any = None) -> None:
    """Run every ready job to ``outcome`` as a worker would (claim, then finish)."""
    claimed = client.claim_ready_jobs("results-test-worker", 10, timedelta(seconds=30))
    assert claimed
    client.finish_jobs("results-test-worker",
                       [JobOutcome(job, outcome, detail) for job in claimed])  # type: ignore[arg-type]


@pytest.fixture
def producer(db: Database) -> Iterator[psycopg.Connection[Any]]:
    conn = connect(db.dsn(postgres.PRODUCER))
    yield conn
    conn.close()


@pytest.fixture
def producer_client(db: Database) -> Iterator[QueueClient]:
    queue = QueueClient(lambda: connect(db.dsn(postgres.PRODUCER)))
    yield queue
    queue.close()


@pytest.fixture
def bound_producer(db: Database, owner: Conn) -> Iterator[QueueClient]:
    """A tenant-bound producer login (leaseq_tenant_producer), bound to TENANT only."""
    owner.execute("insert into app.tenant_producers (role_name, tenant_id) values (%s, %s)",
                  (postgres.TENANT_PRODUCER, TENANT))
    queue = QueueClient(lambda: connect(db.dsn(postgres.TENANT_PRODUCER)))
    yield queue
    queue.close()


# ---- the polling -------------------------------------------------------------------------


class Unfinished:
    """A read that never finishes, counting the reads."""

    def __init__(self, job: JobResult) -> None:
        self.job = job
        self.reads = 0

    def __call__(self) -> JobResult:
        self.reads += 1
        return self.job


def _unfinished(client: QueueClient) -> JobResult:
    created = client.enqueue_job(request("unfinished"))
    found = client.job_result(TENANT, job_id=created.job_id)
    assert found is not None
    return found


@pytest.mark.parametrize(("jitter", "reads"), [(1.0, 35), (0.0, 65)])
def test_a_wait_backs_off_to_a_cap_and_never_sleeps_past_its_timeout(
        client: QueueClient, jitter: float, reads: int) -> None:
    clock = ManualClock()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)

    read = Unfinished(_unfinished(client))
    found = poll_until_finished(read, 60, sleep=sleep, clock=clock, jitter=lambda: jitter)

    assert found is read.job
    assert not found.finished
    assert read.reads == reads  # the whole minute: between 35 and 65 reads
    assert sum(sleeps) == pytest.approx(60)
    scale = 0.5 + 0.5 * jitter
    assert sleeps[:5] == pytest.approx([0.1 * scale, 0.2 * scale, 0.4 * scale, 0.8 * scale,
                                        1.6 * scale])
    assert max(sleeps) == pytest.approx(2.0 * scale)


def test_a_wait_ends_at_the_first_read_of_a_finished_job_or_of_no_job(
        client: QueueClient) -> None:
    def never(seconds: float) -> None:
        raise AssertionError("no wait was needed")

    assert poll_until_finished(lambda: None, 60, sleep=never) is None
    created = client.enqueue_job(request("done"))
    finish(client, "succeeded", {"sent": 1})
    done = client.job_result(TENANT, job_id=created.job_id)
    assert done is not None
    assert poll_until_finished(lambda: done, 60, sleep=never) is done


# ---- reads and waits on the database ----------------------------------------------------


def test_a_producer_reads_state_result_and_last_error_but_never_the_payload(
        producer_client: QueueClient, client: QueueClient) -> None:
    ok = producer_client.enqueue_job(request("ok"))
    pending = producer_client.job_result(TENANT, job_id=ok.job_id)
    assert pending is not None
    assert (pending.state, pending.result, pending.finished) == (JobState.PENDING, None, False)
    finish(client, "succeeded", {"sent_to": "ada"})

    done = producer_client.job_result(TENANT, operation_key="ok")
    assert done is not None
    assert (done.id, done.state, done.result, done.finished) == (
        ok.job_id, JobState.SUCCEEDED, {"sent_to": "ada"}, True)
    assert done.completed_at is not None
    assert "payload" not in done.as_document()
    assert JobResult.from_row(done.as_document()) == done
    assert producer_client.job_result(TENANT, job_id=uuid.uuid4()) is None

    failed = producer_client.enqueue_job(request("fails"))
    finish(client, "dead", {"code": "BAD_ADDRESS", "message": "no such mailbox"})
    dead = producer_client.job_result(TENANT, job_id=failed.job_id)
    assert dead is not None
    assert (dead.state, dead.finished) == (JobState.DEAD, True)
    assert dead.last_error["code"] == "BAD_ADDRESS"


def test_waiting_on_the_producers_connection_returns_once_a_worker_finishes_the_job(
        producer: psycopg.Connection[Any], client: QueueClient) -> None:
    with producer.transaction():
        created = enqueue_job(producer, request("wait-1"))
    worker = threading.Timer(0.3, finish, args=(client, "succeeded", {"n": 1}))
    worker.start()
    try:
        done = wait_for_result(producer, TENANT, job_id=created.job_id, timeout=30)
    finally:
        worker.join()

    assert done is not None
    assert (done.state, done.result) == (JobState.SUCCEEDED, {"n": 1})


def test_waiting_inside_the_transaction_that_enqueued_the_job_is_refused(
        producer: psycopg.Connection[Any]) -> None:
    with producer.transaction():
        created = enqueue_job(producer, request("wait-2"))
        with pytest.raises(DatabaseError, match=r"inside an open transaction.*commit first"):
            wait_for_result(producer, TENANT, job_id=created.job_id, timeout=5)


def test_a_wait_that_ends_before_the_job_finishes_raises_a_timeout_that_says_so(
        producer_client: QueueClient) -> None:
    created = producer_client.enqueue_job(request("slow"))

    with pytest.raises(ResultTimeoutError, match=r"was still pending \(attempt 0 of 6\) when "
                                                  r"the wait of 0.3 s ended") as raised:
        producer_client.wait_for_result(TENANT, job_id=created.job_id, timeout=0.3)
    assert raised.value.job.id == created.job_id


def test_a_tenant_bound_producer_reads_its_tenants_jobs_and_the_database_refuses_others(
        bound_producer: QueueClient, client: QueueClient) -> None:
    own = bound_producer.enqueue_job(request("own"))
    other = client.enqueue_job(request("other", OTHER))

    found = bound_producer.job_result(TENANT, job_id=own.job_id)
    assert found is not None
    assert found.id == own.job_id
    with pytest.raises(PermissionDeniedError, match="not bound to tenant"):
        bound_producer.job_result(OTHER, job_id=other.job_id)
    with pytest.raises(PermissionDeniedError):
        bound_producer.job_result(OTHER, operation_key="other")
    # Naming its own tenant does not reach another tenant's job: no row.
    assert bound_producer.job_result(TENANT, job_id=other.job_id) is None
