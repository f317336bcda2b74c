"""The enqueue function's result operation (events/enqueue_result.json): a producer without
a database login reads, and waits for, what became of its job; the wait is bounded by the
invocation's own remaining time; the login's tenant binding decides what it may read.
And EnqueueFunction.result, the producers' client of it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from leaseq import (
    EnqueueRequest,
    JobOutcome,
    JobState,
    PermissionDeniedError,
    QueueClient,
    ResultTimeoutError,
    connect,
)
from leaseq_lambda import runtime
from leaseq_lambda.producer import EnqueueFunction

from tests.conftest import Database
from tests.functions.conftest import Output, load_app, load_event
from tests.support import postgres
from tests.support.fakes import FakeLambdaContext
from tests.support.lambda_service import InProcessLambda
from tests.support.postgres import Conn

SAMPLE_TENANT = uuid.UUID("5b1f0c64-2f7e-4a53-9d3e-0c1a2b3c4d5e")
OTHER_TENANT = uuid.UUID("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d")
UNREACHABLE = "postgresql://nobody@127.0.0.1:9/leaseq?connect_timeout=1"


def invoke(app: ModuleType, event: Any, remaining_ms: float = 60_000) -> dict[str, Any]:
    answer: dict[str, Any] = app.lambda_handler(
        event, FakeLambdaContext(function_name="leaseq-enqueue", remaining_ms=remaining_ms))
    return answer


def result_event(job_id: Any, **changes: Any) -> dict[str, Any]:
    event = load_event("enqueue_result")
    event["job_id"] = str(job_id)
    return {**event, **changes}


@pytest.fixture
def queue(db: Database) -> Iterator[QueueClient]:
    """A QueueClient as a worker (and producer), to enqueue and finish jobs."""
    client = QueueClient(lambda: connect(db.worker_dsn))
    yield client
    client.close()


def enqueued(app: ModuleType) -> uuid.UUID:
    answer = invoke(app, load_event("enqueue_direct"))
    return uuid.UUID(answer["results"][0]["job_id"])


def finish(queue: QueueClient, result: Any = None) -> None:
    claimed = queue.claim_ready_jobs("results-worker", 10, timedelta(seconds=30))
    assert claimed
    queue.finish_jobs("results-worker", [JobOutcome(job, "succeeded", result) for job in claimed])


@pytest.fixture
def producer_door(db: Database, lambda_env: pytest.MonkeyPatch) -> ModuleType:
    """The function as the stack deploys it by default: its login in leaseq_producer."""
    lambda_env.setenv("DATABASE_URL", db.dsn(postgres.PRODUCER))
    runtime.reset()
    return load_app("enqueue")


@pytest.fixture
def bound_door(db: Database, lambda_env: pytest.MonkeyPatch, owner: Conn) -> ModuleType:
    """With EnqueueTenants: its login in leaseq_tenant_producer, bound to SAMPLE_TENANT."""
    owner.execute("insert into app.tenant_producers (role_name, tenant_id) values (%s, %s)",
                  (postgres.TENANT_PRODUCER, SAMPLE_TENANT))
    lambda_env.setenv("DATABASE_URL", db.dsn(postgres.TENANT_PRODUCER))
    lambda_env.setenv("LEASEQ_ENQUEUE_TENANTS", str(SAMPLE_TENANT))
    runtime.reset()
    return load_app("enqueue")


def test_a_producer_reads_its_jobs_state_then_its_result_through_the_function(
        producer_door: ModuleType, queue: QueueClient, read_output: Callable[[], Output]) -> None:
    job_id = enqueued(producer_door)

    pending = invoke(producer_door, result_event(job_id, wait_seconds=0))
    finish(queue, {"sent_to": "ada@example.com"})
    done = invoke(producer_door, result_event(job_id, wait_seconds=0))

    assert (pending["operation"], pending["finished"]) == ("result", False)
    assert pending["job"]["state"] == "pending"
    assert done["finished"] is True
    job = done["job"]
    assert (job["id"], job["state"], job["result"], job["kind"]) == (
        str(job_id), "succeeded", {"sent_to": "ada@example.com"}, "send_welcome_email")
    assert job["correlation_id"] == "signup-4711"
    assert not {"payload", "lease_token", "lease_owner"} & set(job)
    by_key = invoke(producer_door, {"operation": "result", "tenant_id": str(SAMPLE_TENANT),
                                    "operation_key": "signup-4711/welcome-email"})
    assert by_key["job"] == job
    (line, *_) = read_output().messages("job result read")
    assert (line["job_id"], line["state"], line["found"]) == (str(job_id), "pending", True)


def test_the_function_waits_for_the_job_to_finish(
        producer_door: ModuleType, queue: QueueClient) -> None:
    job_id = enqueued(producer_door)
    worker = threading.Timer(0.3, finish, args=(queue, {"n": 1}))
    worker.start()
    try:
        answer = invoke(producer_door, result_event(job_id, wait_seconds=30))
    finally:
        worker.join()

    assert answer["finished"] is True
    assert answer["job"]["result"] == {"n": 1}


def test_the_wait_is_capped_by_the_invocations_remaining_time(
        producer_door: ModuleType, read_output: Callable[[], Output]) -> None:
    job_id = enqueued(producer_door)
    read_output()

    answer = invoke(producer_door, result_event(job_id, wait_seconds=600), remaining_ms=2_400)

    assert answer["finished"] is False
    assert answer["job"]["state"] == "pending"
    (line,) = read_output().messages("job result read")
    # 2.4 s left less the 2 s kept for answering: the function waits at most 0.4 s.
    assert line["waited_up_to"] <= 0.4


def test_no_such_job_is_answered_as_null(producer_door: ModuleType) -> None:
    answer = invoke(producer_door, result_event(uuid.uuid4(), wait_seconds=5))

    assert answer == {"operation": "result", "job": None, "finished": False}


@pytest.mark.parametrize(("changes", "field"), [
    ({"job_id": None}, "event"),
    ({"operation_key": "k"}, "event"),
    ({"tenant_id": "tenant-7"}, "tenant_id"),
    ({"wait_seconds": 901}, "wait_seconds"),
    ({"payload": {}}, "payload"),
])
def test_a_query_that_does_not_validate_is_refused_without_the_database(
        lambda_env: pytest.MonkeyPatch, changes: dict[str, Any], field: str) -> None:
    lambda_env.setenv("DATABASE_URL", UNREACHABLE)
    runtime.reset()
    event = {k: v for k, v in {**result_event(uuid.uuid4()), **changes}.items()
             if v is not None}

    answer = invoke(load_app("enqueue"), event)

    assert answer["job"] is None
    assert [e["field"] for e in answer["rejected"]["errors"]] == [field]
    assert "sqlstate" not in answer["rejected"]


def test_a_bound_door_reads_its_tenants_jobs_and_the_database_refuses_another_tenants(
        bound_door: ModuleType, queue: QueueClient, lambda_env: pytest.MonkeyPatch) -> None:
    own = enqueued(bound_door)
    other = queue.enqueue_job(EnqueueRequest(tenant_id=OTHER_TENANT, operation_key="other",
                                             kind="echo"))
    # The setting names the other tenant too: the database's binding decides, not it.
    lambda_env.setenv("LEASEQ_ENQUEUE_TENANTS", f"{SAMPLE_TENANT},{OTHER_TENANT}")
    runtime.reset()
    door = load_app("enqueue")

    mine = invoke(door, result_event(own))
    refused = invoke(door, {"operation": "result", "tenant_id": str(OTHER_TENANT),
                            "job_id": str(other.job_id)})

    assert mine["job"]["id"] == str(own)
    assert refused["job"] is None
    assert refused["rejected"]["sqlstate"] == "42501"
    assert f"not bound to tenant {OTHER_TENANT}" in refused["rejected"]["reason"]
    assert str(other.job_id) not in str(refused)


# ---- EnqueueFunction.result ----------------------------------------------------------------


@pytest.fixture
def function(producer_door: ModuleType) -> tuple[EnqueueFunction, InProcessLambda]:
    service = InProcessLambda(producer_door)
    return EnqueueFunction(service.function_name, client=service), service


def test_the_client_waits_for_the_result_through_the_function(
        function: tuple[EnqueueFunction, InProcessLambda], queue: QueueClient) -> None:
    client, service = function
    (item,) = client.enqueue([load_event("enqueue_direct")]).items
    worker = threading.Timer(0.3, finish, args=(queue, {"sent": True}))
    worker.start()
    try:
        done = client.result(SAMPLE_TENANT, item.job_id, wait=30)
    finally:
        worker.join()

    assert done is not None
    assert (str(done.id), done.state, done.result) == (item.job_id, JobState.SUCCEEDED,
                                                        {"sent": True})
    # One invocation waited for it, in the function: the client did not poll.
    assert [call["event"].get("operation") for call in service.calls] == [None, "result"]
    by_key = client.result(SAMPLE_TENANT, operation_key="signup-4711/welcome-email")
    assert by_key == done
    assert client.result(SAMPLE_TENANT, uuid.uuid4()) is None


def test_the_clients_wait_ends_with_a_timeout_error_that_says_so(
        function: tuple[EnqueueFunction, InProcessLambda]) -> None:
    client, _ = function
    (item,) = client.enqueue([load_event("enqueue_direct")]).items

    with pytest.raises(ResultTimeoutError, match=r"was still pending .* when the wait of 0.5 s "
                                                  r"ended; the job goes on") as raised:
        client.result(SAMPLE_TENANT, item.job_id, wait=0.5)
    assert str(raised.value.job.id) == item.job_id
    unfinished = client.result(SAMPLE_TENANT, item.job_id)  # wait 0: one read, no error
    assert unfinished is not None
    assert unfinished.state == JobState.PENDING


def test_the_client_raises_permission_denied_for_a_tenant_the_door_may_not_read(
        bound_door: ModuleType, queue: QueueClient) -> None:
    service = InProcessLambda(bound_door)
    client = EnqueueFunction(service.function_name, client=service)

    with pytest.raises(PermissionDeniedError, match="not bound to tenant") as raised:
        client.result(OTHER_TENANT, uuid.uuid4(), wait=10)
    assert raised.value.sqlstate == "42501"
