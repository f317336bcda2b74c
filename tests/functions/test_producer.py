"""leaseq_lambda.producer and leaseq_lambda.dead_letters against the real enqueue function.

The enqueue function runs in this process against the test's PostgreSQL behind a stand-in
of Lambda's Invoke API (tests/support/lambda_service.py); SQS, EventBridge and the bus's
rule are moto's. A partially refused PutEvents, which moto never answers, is botocore's
Stubber with the service's own response shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from leaseq import EnqueueRequest
from leaseq_lambda import runtime
from leaseq_lambda.dead_letters import parse_message, resubmit
from leaseq_lambda.enqueue import EnqueueRejectedError
from leaseq_lambda.producer import (
    EnqueueEventBus,
    EnqueueFunction,
    EnqueueFunctionError,
    EventsNotAccepted,
    JobsRejected,
)
from moto import mock_aws

from tests.library.support import jobs
from tests.support.lambda_service import InProcessLambda
from tests.support.postgres import Conn

TENANT = uuid.UUID("7d0c1c52-4b1f-4bb4-9a53-3f2b5c8e0a11")
#: Nothing listens here: the function's database is unreachable.
UNREACHABLE = "postgresql://nobody@127.0.0.1:9/leaseq?connect_timeout=1"


def request(key: str, **changes: Any) -> EnqueueRequest:
    fields: dict[str, Any] = {"tenant_id": TENANT, "operation_key": key, "kind": "echo",
                              "payload": {"key": key}, **changes}
    return EnqueueRequest(**fields)


@pytest.fixture
def aws(lambda_env: pytest.MonkeyPatch) -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture
def service(enqueue_app: ModuleType) -> InProcessLambda:
    return InProcessLambda(enqueue_app)


@pytest.fixture
def function(service: InProcessLambda) -> EnqueueFunction:
    return EnqueueFunction(service.function_name, client=service)


def database_goes_away(lambda_env: pytest.MonkeyPatch) -> None:
    lambda_env.setenv("DATABASE_URL", UNREACHABLE)
    runtime.reset()


# ---- the enqueue function ------------------------------------------------------------------


def test_jobs_are_created_once_and_found_existing_when_sent_again(
    function: EnqueueFunction, owner: Conn,
) -> None:
    sent = [request("a"), request("b"), {"tenant_id": str(TENANT), "operation_key": "c",
                                         "kind": "echo", "payload": {}}]

    first = function.enqueue(sent)
    again = function.enqueue(sent)

    assert [i.status for i in first.items] == ["created"] * 3
    assert [i.status for i in again.items] == ["existing"] * 3
    assert [i.job_id for i in again.items] == [i.job_id for i in first.items]
    assert sorted(str(row["id"]) for row in jobs(owner)) == sorted(
        str(i.job_id) for i in first.items)


def test_rejected_jobs_raise_with_every_answer_while_the_valid_ones_are_enqueued(
    function: EnqueueFunction, owner: Conn,
) -> None:
    bad = {"tenant_id": "not-a-uuid", "operation_key": "x", "kind": "echo", "payload": {}}

    with pytest.raises(JobsRejected, match="1 of 2 jobs were rejected") as raised:
        function.enqueue([request("ok"), bad])

    answer = raised.value.answer
    assert [i.status for i in answer.items] == ["created", "rejected"]
    assert "tenant_id" in str(answer.items[1].reason)
    assert len(jobs(owner)) == 1
    # Asked not to raise, the same call answers (the valid job exists by now).
    quiet = function.enqueue([request("ok"), bad], raise_on_rejected=False)
    assert [i.status for i in quiet.items] == ["existing", "rejected"]


def test_an_idempotency_conflict_is_a_rejection(function: EnqueueFunction) -> None:
    function.enqueue([request("same")])

    with pytest.raises(JobsRejected, match="idempotency conflict"):
        function.enqueue([request("same", payload={"other": True})])


def test_an_unreachable_database_answers_http_200_and_the_client_raises_function_error(
    function: EnqueueFunction, service: InProcessLambda, lambda_env: pytest.MonkeyPatch,
) -> None:
    database_goes_away(lambda_env)

    with pytest.raises(EnqueueFunctionError, match="DatabaseUnavailableError") as raised:
        function.enqueue([request("a")])

    assert raised.value.kind == "Unhandled"
    assert raised.value.answered.items == []
    assert service.calls[-1]["type"] == "RequestResponse"


def test_more_jobs_than_one_call_takes_are_split_and_answered_in_order(
    function: EnqueueFunction, service: InProcessLambda, owner: Conn,
) -> None:
    sent = [request(f"bulk-{n}") for n in range(2100)]

    answer = function.enqueue(sent)

    assert [len(call["event"]["jobs"]) for call in service.calls] == [1000, 1000, 100]
    assert [i.index for i in answer.items] == list(range(2100))
    assert answer.created == 2100
    assert len(jobs(owner)) == 2100


def test_asynchronous_enqueue_hands_the_batch_to_lambdas_queue(
    function: EnqueueFunction, service: InProcessLambda,
) -> None:
    assert function.enqueue_async([request("a"), request("b")]) == 1

    (event,) = service.queued
    assert [job["operation_key"] for job in event["jobs"]] == ["a", "b"]
    # Marked, because Lambda does not tell the function how it was invoked.
    assert event["asynchronous"] is True


# ---- the event bus ---------------------------------------------------------------------------


def test_jobs_put_on_the_bus_arrive_as_the_event_the_function_enqueues(
    aws: None, service: InProcessLambda, owner: Conn,
) -> None:
    events, sqs = boto3.client("events"), boto3.client("sqs")
    events.create_event_bus(Name="leaseq-test-enqueue")
    queue = sqs.create_queue(QueueName="rule-target")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    events.put_rule(Name="enqueue", EventBusName="leaseq-test-enqueue",
                    EventPattern=json.dumps({"detail-type": ["leaseq.enqueue"]}))
    events.put_targets(Rule="enqueue", EventBusName="leaseq-test-enqueue",
                       Targets=[{"Id": "q", "Arn": queue_arn}])

    ids = EnqueueEventBus("leaseq-test-enqueue", "billing", client=events).put(
        [request("a"), request("b")])

    (message,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    delivered = json.loads(message["Body"])
    assert delivered["id"] == ids[0]
    assert (delivered["source"], delivered["detail-type"]) == ("billing", "leaseq.enqueue")
    # moto's SQS target leaves out the account field every EventBridge event carries.
    delivered.setdefault("account", "123456789012")
    answer = service.app.lambda_handler(delivered, _context())
    assert answer["created"] == 2
    assert {row["correlation_id"] for row in jobs(owner)} == {ids[0]}


def _context() -> Any:
    from tests.support.fakes import FakeLambdaContext

    return FakeLambdaContext(function_name="leaseq-test-EnqueueFunction")


def test_many_large_jobs_are_spread_over_entries_and_calls_within_eventbridges_limits(
    aws: None,
) -> None:
    events = boto3.client("events")
    events.create_event_bus(Name="bus")
    calls: list[list[dict[str, Any]]] = []

    class Recording:
        def put_events(self, Entries: list[dict[str, Any]]) -> Any:
            calls.append(Entries)
            return events.put_events(Entries=Entries)

    big = "x" * 60_000
    ids = EnqueueEventBus("bus", "billing", client=Recording()).put(
        [request(f"big-{n}", payload={"text": big}) for n in range(50)])

    assert len(ids) == sum(len(c) for c in calls) > 10
    for entries in calls:
        assert len(entries) <= 10
        assert sum(len(json.dumps(e)) for e in entries) <= 256_000
    sent = [job["operation_key"] for c in calls for e in c
            for job in json.loads(e["Detail"])["jobs"]]
    assert sent == [f"big-{n}" for n in range(50)]


def test_entries_eventbridge_refuses_raise_naming_them_after_the_others_went_on() -> None:
    client = boto3.client("events", region_name="us-east-1")
    stubber = Stubber(client)
    stubber.add_response("put_events", {
        "FailedEntryCount": 1,
        "Entries": [{"EventId": "11111111-1111-1111-1111-111111111111"},
                    {"ErrorCode": "InternalFailure", "ErrorMessage": "try again"}]})
    bus = EnqueueEventBus("bus", "billing", client=client)

    # 1001 jobs: one event holds at most 1000, so two entries go in one call.
    with stubber, pytest.raises(EventsNotAccepted, match="InternalFailure") as raised:
        bus.put([request(f"k{n}") for n in range(1001)])

    assert raised.value.accepted == ["11111111-1111-1111-1111-111111111111"]
    (failed,) = raised.value.failed
    assert [j["operation_key"] for j in json.loads(failed["Detail"])["jobs"]] == ["k1000"]
    stubber.assert_no_pending_responses()


def test_a_reserved_or_empty_source_is_refused() -> None:
    for source in ("", "aws.events"):
        with pytest.raises(ValueError, match="source"):
            EnqueueEventBus("bus", source, client=object())


# ---- the dead-letter queue ----------------------------------------------------------------


def invocation_record(payload: Any, error: str = "DatabaseUnavailableError",
                      message: str = "connection refused") -> str:
    """A message as Lambda's on-failure destination writes it (the documented record)."""
    return json.dumps({
        "version": "1.0", "timestamp": "2026-12-01T09:00:00.000Z",
        "requestContext": {"requestId": str(uuid.uuid4()),
                           "functionArn": "arn:aws:lambda:us-east-1:123456789012:function:"
                                          "leaseq-test-EnqueueFunction:$LATEST",
                           "condition": "RetriesExhausted", "approximateInvokeCount": 3},
        "requestPayload": payload,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST",
                            "functionError": "Unhandled"},
        "responsePayload": {"errorType": error, "errorMessage": message}})


def eventbridge_event(jobs_: list[dict[str, Any]], event_id: str) -> dict[str, Any]:
    return {"version": "0", "id": event_id, "detail-type": "leaseq.enqueue",
            "source": "billing", "account": "123456789012", "time": "2026-12-01T09:00:00Z",
            "region": "us-east-1", "resources": [], "detail": {"jobs": jobs_}}


def job_doc(key: str, **extra: Any) -> dict[str, Any]:
    return {"tenant_id": str(TENANT), "operation_key": key, "kind": "echo", "payload": {},
            **extra}


def dead_letter_queue(*bodies: str) -> tuple[Any, str]:
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="leaseq-test-EnqueueDeadLetterQueue")["QueueUrl"]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    return sqs, url


def left_in(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"])


def test_the_record_gives_back_the_original_batch_and_keeps_eventbridges_event_id() -> None:
    direct = parse_message(invocation_record({"jobs": [job_doc("a")]}))
    routed = parse_message(invocation_record(eventbridge_event(
        [job_doc("b"), job_doc("c", correlation_id="mine")], "evt-1")))
    single = parse_message(invocation_record(eventbridge_event([], "x") | {
        "detail": job_doc("d")}))

    assert direct.enqueue_event() == {"jobs": [job_doc("a")]}
    assert direct.error == "DatabaseUnavailableError: connection refused"
    assert direct.request_context.condition == "RetriesExhausted"
    assert routed.enqueue_event() == {"jobs": [job_doc("b", correlation_id="evt-1"),
                                               job_doc("c", correlation_id="mine")]}
    assert single.enqueue_event() == job_doc("d", correlation_id="x")
    for body in ("not json", json.dumps({"Records": []}), json.dumps({"hello": 1})):
        with pytest.raises(ValueError, match="not a Lambda invocation record"):
            parse_message(body)


def test_resubmit_enqueues_each_failed_request_and_deletes_its_message(
    aws: None, function: EnqueueFunction, owner: Conn,
) -> None:
    sqs, url = dead_letter_queue(
        invocation_record({"jobs": [job_doc("a"), job_doc("b")]}),
        invocation_record(eventbridge_event([job_doc("c")], "evt-7")))
    function.enqueue([job_doc("a")])  # got in before the failure: found, not duplicated

    report = resubmit(url, function, sqs=sqs)

    assert sorted(m.outcome for m in report.messages) == ["resubmitted", "resubmitted"]
    assert sum(m.created for m in report.messages) == 2
    assert sum(m.existing for m in report.messages) == 1
    assert left_in(sqs, url) == 0
    by_key = {row["operation_key"]: row for row in jobs(owner)}
    assert sorted(by_key) == ["a", "b", "c"]
    assert by_key["c"]["correlation_id"] == "evt-7"


def test_rejected_and_unreadable_messages_stay_in_the_queue(
    aws: None, function: EnqueueFunction, owner: Conn,
) -> None:
    sqs, url = dead_letter_queue(
        invocation_record({"jobs": [job_doc("fine"), {"operation_key": "no tenant"}]}),
        json.dumps({"something": "else"}),
        invocation_record({"jobs": [job_doc("good")]}))

    report = resubmit(url, function, sqs=sqs)

    outcomes = sorted(m.outcome for m in report.messages)
    assert outcomes == ["rejected", "resubmitted", "unreadable"]
    (rejected,) = [m for m in report.messages if m.outcome == "rejected"]
    assert "job 1" in rejected.detail
    assert "tenant_id" in rejected.detail
    assert left_in(sqs, url) == 2
    assert not report.stopped_on_failure
    assert sorted(row["operation_key"] for row in jobs(owner)) == ["fine", "good"]


def test_resubmit_stops_at_the_first_failure_of_the_function_and_deletes_nothing(
    aws: None, function: EnqueueFunction, lambda_env: pytest.MonkeyPatch,
) -> None:
    sqs, url = dead_letter_queue(*(invocation_record({"jobs": [job_doc(f"k{n}")]})
                                   for n in range(3)))
    database_goes_away(lambda_env)

    report = resubmit(url, function, sqs=sqs)

    assert report.stopped_on_failure
    assert [m.outcome for m in report.messages] == ["failed"]
    assert "DatabaseUnavailableError" in report.messages[0].detail
    assert left_in(sqs, url) == 3


def test_an_async_batch_with_a_rejection_fails_into_a_record_resubmit_reads_without_duplicates(
    aws: None, function: EnqueueFunction, service: InProcessLambda, enqueue_app: ModuleType,
    owner: Conn,
) -> None:
    function.enqueue([request("a")])
    function.enqueue_async([request("b"), request("a", payload={"changed": True})])
    (event,) = service.queued

    # What Lambda does with the queued event: run it; the handler raises, and the
    # on-failure destination gets the record of the failure with the error it raised.
    with pytest.raises(EnqueueRejectedError) as raised:
        enqueue_app.lambda_handler(event, _context())
    assert sorted(row["operation_key"] for row in jobs(owner)) == ["a", "b"]
    sqs, url = dead_letter_queue(invocation_record(
        event, error=type(raised.value).__name__, message=str(raised.value)))
    record = parse_message(sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)[
        "Messages"][0]["Body"])
    assert record.error.startswith("EnqueueRejectedError: 1 of 2 jobs rejected")
    assert "job 1: idempotency conflict" in record.error

    report = resubmit(url, function, sqs=sqs)

    # Resubmitted synchronously: answered per job, the stored one found, not duplicated.
    assert "asynchronous" not in service.calls[-1]["event"]
    assert service.calls[-1]["type"] == "RequestResponse"
    (outcome,) = report.messages
    assert (outcome.outcome, outcome.created, outcome.existing) == ("rejected", 0, 1)
    assert "job 1: idempotency conflict" in outcome.detail
    assert left_in(sqs, url) == 1
    assert sorted(row["operation_key"] for row in jobs(owner)) == ["a", "b"]
