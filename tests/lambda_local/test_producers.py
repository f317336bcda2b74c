"""The producers' client against the real enqueue and worker functions in the local
Lambda service, over boto3's real HTTP client in the producers' configuration: a result
waited for through the function, and a throttle at the function's reserved concurrency
retried by botocore's standard mode and then raised as a leaseq error."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest
from leaseq import JobState, ResultTimeoutError
from leaseq_lambda.producer import EnqueueFunction, EnqueueThrottledError, producer_config
from leaseq_lambda_local import LocalLambda

from tests.conftest import Database
from tests.lambda_local.conftest import REPO, Start, client_for
from tests.support.postgres import OWNER

TENANT = "5b1f0c64-2f7e-4a53-9d3e-0c1a2b3c4d5e"


def producer_client(url: str, attempts: int = 2) -> Any:
    return boto3.client("lambda", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=producer_config(attempts, read_timeout=60))


def the_stack(start_service: Start, db: Database, **overrides: str) -> LocalLambda:
    return start_service(template=REPO / "template.yaml", schedules=False,
                         database_url=db.worker_dsn, owner_database_url=db.owner_dsn,
                         handlers="leaseq_lambda.demo_handlers", parameter_overrides=overrides,
                         env_vars={"Parameters": {"LEASEQ_MAX_WORKERS": "0"}})


def welcome(key: str) -> dict[str, Any]:
    return {"tenant_id": TENANT, "operation_key": key, "kind": "send_welcome_email",
            "payload": {"to": "ada@example.com"}}


def test_a_producer_waits_for_its_result_through_the_enqueue_function(
    start_service: Start, db: Database,
) -> None:
    service = the_stack(start_service, db)
    function = EnqueueFunction("EnqueueFunction", client=producer_client(service.url))
    (item,) = function.enqueue([welcome("welcome-ada")]).items
    tick = (REPO / "events" / "worker_schedule.json").read_bytes()
    worker = threading.Timer(0.5, client_for(service.url).invoke,
                             kwargs={"FunctionName": "WorkerFunction", "Payload": tick})
    worker.start()
    try:
        done = function.result(TENANT, item.job_id, wait=30)
    finally:
        worker.join()

    assert done is not None
    assert (str(done.id), done.state, done.result) == (
        item.job_id, JobState.SUCCEEDED, {"delivered_to": "ada@example.com"})


def test_an_enqueue_throttled_at_the_reserved_concurrency_raises_after_the_retries(
    start_service: Start, db: Database,
) -> None:
    service = the_stack(start_service, db, EnqueueReservedConcurrency="1")
    holder = EnqueueFunction("EnqueueFunction", client=producer_client(service.url))
    (pending,) = holder.enqueue([welcome("pending")]).items

    def busy() -> bool:
        environments = service.service.stats()["functions"]["EnqueueFunction"]["environments"]
        return any(e["state"] == "busy" for e in environments)

    with ThreadPoolExecutor(1) as pool:
        # A result wait holds the function's one execution for 6 s (the job never runs).
        waiting = pool.submit(holder.result, TENANT, pending.job_id, wait=6)
        deadline = time.monotonic() + 20
        while not busy():
            assert time.monotonic() < deadline, "the wait never started"
            time.sleep(0.05)
        producer = EnqueueFunction("EnqueueFunction", client=producer_client(service.url, 2))
        with pytest.raises(EnqueueThrottledError) as raised:
            producer.enqueue([welcome(f"throttled-{uuid.uuid4()}")])
        with pytest.raises(ResultTimeoutError):
            waiting.result(timeout=30)

    error = raised.value
    assert (error.code, error.attempts) == ("TooManyRequestsException", 2)
    assert error.reason == "ReservedFunctionConcurrentInvocationLimitExceeded"
    assert "EnqueueReservedConcurrency" in error.message
    with db.connect(OWNER) as conn:
        keys = [row["operation_key"] for row in conn.execute(
            "select operation_key from app.jobs").fetchall()]
    assert keys == ["pending"]
    assert error.answered.items == []
