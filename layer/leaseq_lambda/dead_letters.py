"""The enqueue dead-letter queue: what its messages are, and resubmitting them after a fix.

Every asynchronous enqueue that failed on all of Lambda's attempts (invoked with
InvocationType Event, or by the enqueue bus's rule, which invokes asynchronously) reaches
the stack's EnqueueDeadLetterQueue as the on-failure destination's invocation record, a
JSON document of this shape (only these fields are read):

.. code-block:: json

    {"version": "1.0", "timestamp": "2026-12-01T09:00:00.000Z",
     "requestContext": {"requestId": "...", "functionArn": "...",
                        "condition": "RetriesExhausted", "approximateInvokeCount": 3},
     "requestPayload": {"jobs": [...]},
     "responseContext": {"statusCode": 200, "functionError": "Unhandled"},
     "responsePayload": {"errorType": "DatabaseUnavailableError", "errorMessage": "..."}}

``requestPayload`` is the event exactly as the function got it: a job, a batch, or the
EventBridge event whose ``detail`` is one of those. SQS's own redrive cannot send these
back (the queue is a destination, not a source queue), so :func:`resubmit` invokes the
function synchronously with each payload and deletes a message only once every one of its
jobs is created or found existing. Enqueue is idempotent on (tenant, operation key), so
jobs that did get in before the failure are found, not duplicated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from leaseq_lambda.producer import (
    ENQUEUE_DETAIL_TYPE,
    EnqueueFunction,
    EnqueueFunctionError,
    EnqueueThrottledError,
)

__all__ = [
    "FailedInvocation",
    "MessageOutcome",
    "ResubmitReport",
    "parse_message",
    "resubmit",
]


class _RequestContext(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    request_id: str | None = Field(default=None, alias="requestId")
    function_arn: str | None = Field(default=None, alias="functionArn")
    condition: str | None = None
    approximate_invoke_count: int | None = Field(default=None, alias="approximateInvokeCount")


class FailedInvocation(BaseModel):
    """One message of the dead-letter queue: Lambda's record of a failed async invocation."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    request_context: _RequestContext = Field(alias="requestContext")
    request_payload: Any = Field(alias="requestPayload")
    response_payload: Any = Field(default=None, alias="responsePayload")
    timestamp: str | None = None

    @property
    def error(self) -> str:
        """Why the last attempt failed, as the function reported it."""
        payload = self.response_payload
        if isinstance(payload, dict):
            return f"{payload.get('errorType', 'error')}: {payload.get('errorMessage', '')}"
        return str(payload or self.request_context.condition or "unknown")

    def enqueue_event(self) -> dict[str, Any]:
        """The event to send again: the batch itself, taken out of an EventBridge envelope.

        Jobs of an EventBridge event that had no correlation id got the event's id as theirs
        in the function; they keep it here, so a resubmitted job traces back to the event.
        """
        payload = self.request_payload
        if not isinstance(payload, dict):
            raise ValueError("requestPayload is not a JSON object")
        if payload.get("detail-type") != ENQUEUE_DETAIL_TYPE:
            if "jobs" not in payload:
                return payload
            # Sent synchronously, so the function answers for each job instead of raising.
            return {k: v for k, v in payload.items() if k != "asynchronous"}
        detail = payload.get("detail")
        if not isinstance(detail, dict):
            raise ValueError(f"the {ENQUEUE_DETAIL_TYPE} event has no detail object")
        event_id = payload.get("id")

        def traced(job: Any) -> Any:
            if isinstance(job, dict) and job.get("correlation_id") is None and event_id:
                return {**job, "correlation_id": str(event_id)}
            return job

        if isinstance(detail.get("jobs"), list):
            batch = {k: v for k, v in detail.items() if k != "asynchronous"}
            return {**batch, "jobs": [traced(job) for job in detail["jobs"]]}
        traced_detail: dict[str, Any] = traced(detail)
        return traced_detail


def parse_message(body: str) -> FailedInvocation:
    """A queue message's body as a :class:`FailedInvocation`; ValueError if it is not one."""
    try:
        return FailedInvocation.model_validate_json(body)
    except ValidationError as exc:
        raise ValueError(f"not a Lambda invocation record: {exc.errors()[0]['msg']}") from exc


@dataclass(frozen=True)
class MessageOutcome:
    """What happened to one message."""

    message_id: str
    outcome: Literal["resubmitted", "rejected", "unreadable", "failed"]
    detail: str
    created: int = 0
    existing: int = 0


@dataclass
class ResubmitReport:
    """Every message looked at, and whether the run stopped because the function failed."""

    messages: list[MessageOutcome] = field(default_factory=list)
    stopped_on_failure: bool = False

    def count(self, outcome: str) -> int:
        return sum(1 for m in self.messages if m.outcome == outcome)


def resubmit(queue_url: str, function: EnqueueFunction, *, sqs: Any,
             limit: int | None = None, visibility_timeout: int = 120,
             on_message: Callable[[MessageOutcome], None] | None = None) -> ResubmitReport:
    """Resubmit the queue's messages to the enqueue function until the queue is empty.

    * every job created or existing: the message is deleted;
    * some jobs rejected (bad input, an idempotency conflict): the message stays, and is
      reported with the function's reasons; resubmitting it unchanged cannot succeed;
    * not a Lambda invocation record: it stays, reported as unreadable;
    * the function failed again (the cause is not fixed), or is still throttled after
      botocore's retries: the message stays and the run stops, so a broken database
      does not cycle the whole queue.

    A message that stays becomes visible again after ``visibility_timeout`` seconds, so a
    run never looks at the same message twice.
    """
    report = ResubmitReport()
    while limit is None or len(report.messages) < limit:
        wanted = 10 if limit is None else min(10, limit - len(report.messages))
        received = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=wanted,
                                       WaitTimeSeconds=1, VisibilityTimeout=visibility_timeout)
        messages = received.get("Messages", [])
        if not messages:
            break
        for message in messages:
            outcome = _resubmit_one(message, function)
            report.messages.append(outcome)
            if on_message is not None:
                on_message(outcome)
            if outcome.outcome == "resubmitted":
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            if outcome.outcome == "failed":
                report.stopped_on_failure = True
                return report
    return report


def _resubmit_one(message: dict[str, Any], function: EnqueueFunction) -> MessageOutcome:
    message_id = str(message.get("MessageId", ""))
    try:
        record = parse_message(str(message.get("Body", "")))
        event = record.enqueue_event()
    except ValueError as exc:
        return MessageOutcome(message_id, "unreadable", str(exc))
    try:
        answer = function.invoke(event)
    except (EnqueueFunctionError, EnqueueThrottledError) as exc:
        return MessageOutcome(message_id, "failed", str(exc))
    if answer.rejected:
        reasons = "; ".join(f"job {item.index}: {item.reason}" for item in answer.rejected)
        return MessageOutcome(message_id, "rejected", reasons, answer.created, answer.existing)
    return MessageOutcome(message_id, "resubmitted",
                          f"first failure: {record.error}", answer.created, answer.existing)
