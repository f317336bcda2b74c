"""A throttled producer call: retried by botocore's standard mode, then a leaseq error.

The clients are real botocore clients in the producers' configuration. What AWS would
answer is served at botocore's ``before-send`` event (the hook moto itself uses), so
botocore parses each answer and runs its own retry handler, backoff included: a scripted
number of throttles (Lambda's HTTP 429 TooManyRequestsException with its Reason,
EventBridge's ThrottlingException), then, for Lambda, the real enqueue function in this
process (tests/support/lambda_service.py) against the test's PostgreSQL.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ClientError
from leaseq import LeaseqError
from leaseq_lambda.producer import (
    MAX_ATTEMPTS,
    EnqueueError,
    EnqueueEventBus,
    EnqueueFunction,
    EnqueueThrottledError,
    EventsNotAccepted,
    producer_config,
)

from tests.library.support import jobs
from tests.support.lambda_service import InProcessLambda
from tests.support.postgres import Conn

TENANT = uuid.UUID("5b0f2f0e-7f6a-4d43-9a3e-0c9a3c2b9d11")
LAMBDA_THROTTLE = (429, {"x-amzn-ErrorType": "TooManyRequestsException",
                         "Content-Type": "application/json"},
                   {"Type": "User", "message": "Rate Exceeded.",
                    "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded"})
EVENTS_THROTTLE = (400, {"Content-Type": "application/x-amz-json-1.1"},
                   {"__type": "ThrottlingException", "message": "Rate exceeded"})


class _Raw(io.BytesIO):
    """The raw body botocore reads an answer from: whole (errors) or as a stream (Invoke's
    Payload)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


def _response(request: AWSPreparedRequest, status: int, headers: dict[str, str],
              body: bytes) -> AWSResponse:
    return AWSResponse(request.url, status, {"x-amzn-RequestId": str(uuid.uuid4()), **headers},
                       _Raw(body))


class ScriptedAws:
    """Answers the calls numbered in ``throttled`` (from 1) with ``throttle``, and hands the
    others to ``forward`` (every call is throttled without one)."""

    def __init__(self, throttle: tuple[int, dict[str, str], dict[str, Any]],
                 throttled: range, forward: InProcessLambda | None = None) -> None:
        self.throttle = throttle
        self.throttled = throttled
        self.forward = forward
        self.sent = 0

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        self.sent += 1
        if self.sent in self.throttled or self.forward is None:
            status, headers, document = self.throttle
            return _response(request, status, headers, json.dumps(document).encode())
        answer = self.forward.invoke(FunctionName=self.forward.function_name,
                                     InvocationType="RequestResponse",
                                     Payload=bytes(request.body or b""))
        headers = {"Content-Type": "application/json"}
        if answer.get("FunctionError"):
            headers["X-Amz-Function-Error"] = answer["FunctionError"]
        return _response(request, answer["StatusCode"], headers, answer["Payload"].read())


def lambda_client(aws: ScriptedAws, max_attempts: int = 2) -> Any:
    client = boto3.client("lambda", config=producer_config(max_attempts))
    client.meta.events.register("before-send.lambda.Invoke", aws)
    return client


def events_client(aws: ScriptedAws, max_attempts: int = 2) -> Any:
    client = boto3.client("events", config=producer_config(max_attempts))
    client.meta.events.register("before-send.events.PutEvents", aws)
    return client


def job(key: str) -> dict[str, Any]:
    return {"tenant_id": str(TENANT), "operation_key": key, "kind": "echo", "payload": {}}


@pytest.fixture
def service(enqueue_app: ModuleType) -> InProcessLambda:
    return InProcessLambda(enqueue_app)


def test_the_producers_default_clients_retry_in_botocores_standard_mode(
    lambda_env: pytest.MonkeyPatch,
) -> None:
    function = EnqueueFunction("leaseq-enqueue")
    bus = EnqueueEventBus("leaseq-bus", "billing")

    for client in (function._client, bus._client):
        assert client.meta.config.retries == {"mode": "standard",
                                              "total_max_attempts": MAX_ATTEMPTS}
    # A synchronous invoke may run as long as the function's timeout.
    assert function._client.meta.config.read_timeout > 900


def test_a_throttle_that_clears_within_the_retries_enqueues_the_jobs(
    service: InProcessLambda, owner: Conn,
) -> None:
    aws = ScriptedAws(LAMBDA_THROTTLE, throttled=range(1, 2), forward=service)
    function = EnqueueFunction(service.function_name, client=lambda_client(aws))

    answer = function.enqueue([job("a"), job("b")])

    assert aws.sent == 2
    assert answer.created == 2
    assert len(jobs(owner)) == 2


def test_an_invoke_throttled_on_every_attempt_raises_a_throttled_error_saying_what_to_do(
    service: InProcessLambda, owner: Conn,
) -> None:
    aws = ScriptedAws(LAMBDA_THROTTLE, throttled=range(1, 100), forward=service)
    function = EnqueueFunction(service.function_name, client=lambda_client(aws))

    with pytest.raises(EnqueueThrottledError, match="throttled") as raised:
        function.enqueue([job("a")])

    error = raised.value
    assert aws.sent == 2
    assert (error.service, error.code, error.attempts) == ("lambda", "TooManyRequestsException",
                                                           2)
    assert error.reason == "ReservedFunctionConcurrentInvocationLimitExceeded"
    assert "reserved concurrency" in error.message
    assert "idempotent" in error.message
    assert isinstance(error, EnqueueError)
    assert isinstance(error, LeaseqError)
    assert isinstance(error.__cause__, ClientError)
    assert error.answered.items == []
    assert jobs(owner) == []


def test_a_throttle_after_earlier_chunks_reports_the_jobs_already_enqueued(
    service: InProcessLambda, owner: Conn,
) -> None:
    # The first invocation (1,000 jobs) goes through, the second is throttled throughout.
    aws = ScriptedAws(LAMBDA_THROTTLE, throttled=range(2, 100), forward=service)
    function = EnqueueFunction(service.function_name, client=lambda_client(aws))

    with pytest.raises(EnqueueThrottledError) as raised:
        function.enqueue([job(f"k{n}") for n in range(1200)])

    assert raised.value.answered.created == 1000
    assert len(jobs(owner)) == 1000


def test_an_asynchronous_invoke_throttled_throughout_raises_the_throttled_error(
    lambda_env: pytest.MonkeyPatch,
) -> None:
    aws = ScriptedAws(LAMBDA_THROTTLE, throttled=range(1, 100))
    function = EnqueueFunction("leaseq-enqueue", client=lambda_client(aws))

    with pytest.raises(EnqueueThrottledError, match="leaseq-enqueue was throttled"):
        function.enqueue_async([job("a")])
    assert aws.sent == 2


def test_another_client_error_is_not_called_a_throttle(lambda_env: pytest.MonkeyPatch) -> None:
    denied = (403, {"x-amzn-ErrorType": "AccessDeniedException",
                    "Content-Type": "application/json"},
              {"Message": "not authorized to perform: lambda:InvokeFunction"})
    aws = ScriptedAws(denied, throttled=range(1, 100))
    function = EnqueueFunction("leaseq-enqueue", client=lambda_client(aws))

    with pytest.raises(ClientError, match="AccessDenied"):
        function.enqueue([job("a")])
    assert aws.sent == 1  # not retryable: no second attempt


def test_puts_throttled_on_every_attempt_raise_the_throttled_error_with_the_accepted_ids(
    lambda_env: pytest.MonkeyPatch,
) -> None:
    aws = ScriptedAws(EVENTS_THROTTLE, throttled=range(1, 100))
    bus = EnqueueEventBus("leaseq-bus", "billing", client=events_client(aws, max_attempts=3))

    with pytest.raises(EnqueueThrottledError,
                       match="enqueue bus leaseq-bus was throttled") as raised:
        bus.put([job("a")])

    assert aws.sent == 3
    assert (raised.value.service, raised.value.code, raised.value.attempts) == (
        "events", "ThrottlingException", 3)
    assert raised.value.accepted == []


def test_entries_the_bus_throttled_one_by_one_are_named_as_throttled() -> None:
    class PartlyThrottled:
        def put_events(self, Entries: list[dict[str, Any]]) -> Any:
            return {"FailedEntryCount": 1, "Entries": [
                {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"}]}

    with pytest.raises(EventsNotAccepted, match="1 of them were throttled: put them again"):
        EnqueueEventBus("bus", "billing", client=PartlyThrottled()).put([job("a")])


def test_resubmit_stops_at_a_throttled_function_and_keeps_every_message(
    lambda_env: pytest.MonkeyPatch,
) -> None:
    from botocore.stub import Stubber
    from leaseq_lambda.dead_letters import resubmit
    from moto import mock_aws

    from tests.functions.test_producer import dead_letter_queue, invocation_record, left_in

    with mock_aws():
        sqs, url = dead_letter_queue(*(invocation_record({"jobs": [job(f"k{n}")]})
                                       for n in range(2)))
        client = boto3.client("lambda", config=producer_config())
        stubber = Stubber(client)
        stubber.add_client_error(
            "invoke", service_error_code="TooManyRequestsException", http_status_code=429,
            service_message="Rate Exceeded.",
            response_meta={"RetryAttempts": MAX_ATTEMPTS - 1})
        with stubber:
            report = resubmit(url, EnqueueFunction("leaseq-enqueue", client=client), sqs=sqs)
        assert left_in(sqs, url) == 2

    assert report.stopped_on_failure
    (outcome,) = report.messages
    assert outcome.outcome == "failed"
    assert f"was throttled (TooManyRequestsException) on all {MAX_ATTEMPTS} attempts" in (
        outcome.detail)
