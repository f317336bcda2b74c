"""Enqueue from another Lambda or a script: the enqueue function and the enqueue event bus.

Both AWS calls can fail without raising, which is why a client of its own exists:

* ``lambda:Invoke`` answers HTTP 200 even when the function failed (an unreachable
  database, a timeout): the failure is only in ``FunctionError`` and the payload is
  Lambda's error document. :class:`EnqueueFunction` raises :class:`EnqueueFunctionError`
  then, and :class:`JobsRejected` when the function answered but refused some items
  (bad input, an idempotency conflict), with every item's result on the exception.
* ``events:PutEvents`` answers HTTP 200 when some entries were not accepted; only
  ``FailedEntryCount`` says so. :class:`EnqueueEventBus` raises :class:`EventsNotAccepted`
  naming them, after the accepted ones are on the bus.

Both clients retry a throttled or failed call the way botocore's ``standard`` retry mode
does (exponential backoff with jitter, a retry quota per client, :data:`MAX_ATTEMPTS`
attempts in all). A call still throttled after that raises :class:`EnqueueThrottledError`
with what was enqueued before it, instead of botocore's ``ClientError``; any other
``ClientError`` (a missing permission, a wrong name) is raised as botocore's.

Jobs are :class:`leaseq.EnqueueRequest` objects or plain dicts of the same fields. The
calls are split to fit the services' limits (1,000 jobs and about 6 MB per invoke,
10 entries and 256 KB per PutEvents) so a caller never has to.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

from leaseq import (
    EnqueueRequest,
    EnqueueResult,
    IdempotencyConflictError,
    InvalidRequestError,
    JobState,
    LeaseqError,
    PermissionDeniedError,
    ResultTimeoutError,
)
from leaseq.base.limits import MAX_ENQUEUE
from leaseq.base.results import JobResult

__all__ = [
    "ENQUEUE_DETAIL_TYPE",
    "MAX_ATTEMPTS",
    "EnqueueAnswer",
    "EnqueueError",
    "EnqueueEventBus",
    "EnqueueFunction",
    "EnqueueFunctionError",
    "EnqueueThrottledError",
    "EventsNotAccepted",
    "ItemAnswer",
    "JobsRejected",
    "job_document",
    "producer_config",
]

#: The detail-type the stack's rule routes to the enqueue function.
ENQUEUE_DETAIL_TYPE = "leaseq.enqueue"
#: The SQL contract's bound on one enqueue call (and so on one invocation).
MAX_JOBS_PER_CALL = MAX_ENQUEUE
#: Lambda's synchronous payload limit is 6 MB; keep room for the envelope.
MAX_INVOKE_BYTES = 5_500_000
#: PutEvents takes 10 entries and 256 KB per call; one entry may be at most 256 KB.
MAX_ENTRIES_PER_PUT = 10
MAX_PUT_BYTES = 250_000

#: Attempts per call in botocore's standard retry mode (the first and two retries), the
#: mode's own default; a client passed in keeps its own retry configuration.
MAX_ATTEMPTS = 3
#: The error codes AWS answers a throttled call with (Lambda's TooManyRequestsException,
#: EventBridge's ThrottlingException, and the generic ones botocore's standard mode retries).
THROTTLING_CODES = frozenset({
    "TooManyRequestsException", "ThrottlingException", "Throttling", "ThrottledException",
    "RequestThrottledException", "RequestLimitExceeded", "EC2ThrottledException", "SlowDown",
})

Job = EnqueueRequest | Mapping[str, Any]


class EnqueueError(LeaseqError):
    """Jobs were not (all) enqueued; the subclass says how far it got."""


@dataclass(frozen=True)
class ItemAnswer:
    """The function's answer for one job: created, existing (enqueued before) or rejected."""

    index: int
    status: Literal["created", "existing", "rejected"]
    job_id: str | None = None
    reason: str | None = None
    #: For a rejection the database decided: 22023 (the item), 23505 (an idempotency
    #: conflict, which names no job), 42501 (a tenant this door is not bound to).
    sqlstate: str | None = None


@dataclass(frozen=True)
class EnqueueAnswer:
    """Every job's answer, in the order the jobs were given, across all invocations."""

    items: list[ItemAnswer] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for item in self.items if item.status == status)

    @property
    def created(self) -> int:
        return self.count("created")

    @property
    def existing(self) -> int:
        return self.count("existing")

    @property
    def rejected(self) -> list[ItemAnswer]:
        return [item for item in self.items if item.status == "rejected"]


class EnqueueFunctionError(EnqueueError):
    """The function failed (Lambda's FunctionError): none of this call's jobs is known to be
    enqueued. Retrying the same jobs is safe, because enqueue is idempotent."""

    def __init__(self, function: str, kind: str, document: Any, answered: EnqueueAnswer) -> None:
        detail = document.get("errorMessage") if isinstance(document, dict) else document
        error_type = document.get("errorType") if isinstance(document, dict) else None
        super().__init__(f"the enqueue function {function} failed ({kind}"
                         f"{', ' + str(error_type) if error_type else ''}): {detail}")
        self.function = function
        self.kind = kind
        self.document = document
        #: Answers of the invocations that succeeded before this one (earlier chunks).
        self.answered = answered


class JobsRejected(EnqueueError):
    """The function answered, and refused some jobs; the others are enqueued."""

    def __init__(self, answer: EnqueueAnswer) -> None:
        first = answer.rejected[0]
        super().__init__(f"{len(answer.rejected)} of {len(answer.items)} jobs were rejected "
                         f"(first: job {first.index}: {first.reason})")
        self.answer = answer


class EnqueueThrottledError(EnqueueError):
    """AWS throttled the call (the enqueue function's concurrency, Lambda's or EventBridge's
    request rate) on every attempt botocore's standard retry mode made: this call's jobs
    are not enqueued; those of earlier calls are (``answered``, ``accepted``).

    Retrying the same jobs later is safe (enqueue is idempotent on tenant and operation
    key)."""

    def __init__(self, service: str, target: str, code: str, attempts: int, *,
                 reason: str | None = None, answered: EnqueueAnswer | None = None,
                 accepted: Sequence[str] = ()) -> None:
        why = f"{code}{': ' + reason if reason else ''}"
        remedy = ("raise the function's reserved concurrency (EnqueueReservedConcurrency) or "
                  "the account's concurrency quota, or enqueue asynchronously "
                  "(enqueue_async, the event bus)" if service == "lambda" else
                  "spread the puts over time, or ask for a higher PutEvents quota")
        super().__init__(
            f"{'the enqueue function ' if service == 'lambda' else 'the enqueue bus '}{target} "
            f"was throttled ({why}) on all {attempts} attempts: the jobs of this call are not "
            f"enqueued; send them again later (enqueue is idempotent), or {remedy}")
        self.service = service
        self.target = target
        #: AWS's error code (TooManyRequestsException, ThrottlingException, ...).
        self.code = code
        #: Lambda's reason for a throttle (ReservedFunctionConcurrentInvocationLimitExceeded,
        #: ConcurrentInvocationLimitExceeded, ...), when it gave one.
        self.reason = reason
        self.attempts = attempts
        #: Answers of the function's invocations that succeeded before this one.
        self.answered = answered or EnqueueAnswer()
        #: Event ids of the entries the bus accepted before this call.
        self.accepted = list(accepted)


def _throttled(exc: Exception, service: str, target: str, *,
               answered: EnqueueAnswer | None = None,
               accepted: Sequence[str] = ()) -> EnqueueThrottledError | None:
    """The leaseq error for botocore's ``ClientError`` ``exc`` when AWS throttled the call
    (its code, or HTTP 429), else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    metadata = response.get("ResponseMetadata") or {}
    code = str(error.get("Code") or "")
    if code not in THROTTLING_CODES and metadata.get("HTTPStatusCode") != 429:
        return None
    reason = response.get("Reason") or error.get("Reason")
    attempts = int(metadata.get("RetryAttempts", 0)) + 1
    return EnqueueThrottledError(service, target, code or "HTTP 429", attempts,
                                 reason=str(reason) if reason else None, answered=answered,
                                 accepted=accepted)


class EventsNotAccepted(EnqueueError):
    """PutEvents accepted some entries and not others (FailedEntryCount)."""

    def __init__(self, failed: list[dict[str, Any]], accepted: list[str]) -> None:
        first = failed[0]
        throttled = sum(1 for entry in failed if entry.get("ErrorCode") in THROTTLING_CODES)
        super().__init__(
            f"EventBridge did not accept {len(failed)} of {len(failed) + len(accepted)} "
            f"events (first: {first.get('ErrorCode')}: {first.get('ErrorMessage')}); their "
            "jobs are not enqueued, the accepted events' jobs will be"
            + (f"; {throttled} of them were throttled: put them again later" if throttled
               else ""))
        #: The failed entries as PutEvents answered them, plus the jobs each one carried.
        self.failed = failed
        #: Event ids of the accepted entries.
        self.accepted = accepted


def job_document(job: Job) -> dict[str, Any]:
    """A job as the enqueue function takes it; validated here when it is a model."""
    if isinstance(job, EnqueueRequest):
        document: dict[str, Any] = job.model_dump(mode="json", exclude_none=True)
        return document
    return dict(job)


def _size(document: Any) -> int:
    return len(json.dumps(document, separators=(",", ":")).encode("utf-8"))


def _document(raw: bytes) -> Any:
    """An invocation's payload: its JSON, or its text when it is not JSON."""
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def _chunks(documents: list[dict[str, Any]], max_bytes: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    used = 0
    for document in documents:
        size = _size(document) + 1
        if chunk and (len(chunk) == MAX_JOBS_PER_CALL or used + size > max_bytes):
            yield chunk
            chunk, used = [], 0
        chunk.append(document)
        used += size
    if chunk:
        yield chunk


def producer_config(max_attempts: int = MAX_ATTEMPTS, **options: Any) -> Any:
    """The botocore ``Config`` of the producers' clients: the standard retry mode with
    ``max_attempts`` attempts per call, and ``options`` (timeouts...)."""
    from botocore.config import Config

    # total_max_attempts counts the first attempt; botocore's "max_attempts" counts retries.
    return Config(retries={"mode": "standard", "total_max_attempts": max_attempts}, **options)


def _lambda_client() -> Any:
    import boto3

    from leaseq_lambda.invoker import CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS

    # A synchronous invoke may last as long as the function's timeout: botocore's 60 s
    # read timeout would cut it off and retry a call that is still running.
    return boto3.client("lambda", config=producer_config(
        read_timeout=READ_TIMEOUT_SECONDS, connect_timeout=CONNECT_TIMEOUT_SECONDS))


def _events_client() -> Any:
    import boto3

    return boto3.client("events", config=producer_config())


class EnqueueFunction:
    """The stack's enqueue function (output EnqueueFunctionArn), invoked synchronously.

    Needs ``lambda:InvokeFunction`` on it (the stack's EnqueueProducerPolicy grants it).
    Without ``client``, a Lambda client in botocore's standard retry mode
    (:func:`producer_config`); a client passed in should be configured the same way.
    """

    def __init__(self, function: str, *, client: Any = None) -> None:
        self.function = function
        self._client = client if client is not None else _lambda_client()

    def enqueue(self, jobs: Iterable[Job], *, raise_on_rejected: bool = True) -> EnqueueAnswer:
        """Enqueue ``jobs``; their answers in order. Raises :class:`EnqueueFunctionError`
        when an invocation failed and :class:`JobsRejected` when the function refused
        items (unless ``raise_on_rejected`` is False)."""
        documents = [job_document(job) for job in jobs]
        if not documents:
            return EnqueueAnswer()
        items: list[ItemAnswer] = []
        for chunk in _chunks(documents, MAX_INVOKE_BYTES):
            answer = self.invoke({"jobs": chunk}, answered=EnqueueAnswer(list(items)))
            offset = len(items)
            items.extend(ItemAnswer(offset + item.index, item.status, item.job_id, item.reason,
                                    item.sqlstate)
                         for item in answer.items)
        result = EnqueueAnswer(items)
        if raise_on_rejected and result.rejected:
            raise JobsRejected(result)
        return result

    def enqueue_job(self, request: EnqueueRequest) -> EnqueueResult:
        """Enqueue one job, answered as :func:`leaseq.enqueue_job` answers on a connection
        (so that ``DeclaredKind.defer`` works through the function as in a transaction):
        an idempotency conflict raises IdempotencyConflictError, a tenant this door is not
        bound to PermissionDeniedError, any other rejection InvalidRequestError."""
        (item,) = self.enqueue([request], raise_on_rejected=False).items
        if item.status == "rejected":
            reason = item.reason or "the enqueue function rejected the job"
            error = {"23505": IdempotencyConflictError,
                     "42501": PermissionDeniedError}.get(item.sqlstate or "",
                                                         InvalidRequestError)
            raise error(reason, sqlstate=item.sqlstate)
        assert item.job_id is not None
        state = JobState.PENDING if item.status == "created" else None
        return EnqueueResult(0, UUID(item.job_id), item.status, state)

    def result(self, tenant_id: UUID | str, job_id: UUID | str | None = None, *,
               operation_key: str | None = None, wait: float = 0.0,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> JobResult | None:
        """What became of a job (named by id, or by ``operation_key``), read through the
        function: no database login needed, only ``lambda:InvokeFunction`` on it, and a
        door bound to some tenants reads only theirs (else PermissionDeniedError).

        ``wait`` 0 reads once; more waits up to that many seconds for the job to finish:
        each invocation waits within its own time (bounded polling, backoff and jitter,
        :mod:`leaseq_lambda.results`) and the client invokes again, after a short
        backoff, until the job has finished or the wait is over, then raises
        :class:`leaseq.ResultTimeoutError`. None when the tenant has no such job."""
        deadline = clock() + max(0.0, wait)
        pause = 0.1
        while True:
            left = max(0.0, deadline - clock())
            event: dict[str, Any] = {"operation": "result", "tenant_id": str(tenant_id),
                                     "wait_seconds": round(min(left, 900.0), 3)}
            if job_id is not None:
                event["job_id"] = str(job_id)
            if operation_key is not None:
                event["operation_key"] = operation_key
            found = self._read(event)
            if found is None or found.finished or wait <= 0:
                return found
            left = deadline - clock()
            if left <= 0:
                raise ResultTimeoutError(found, wait)
            sleep(min(left, pause * (0.5 + 0.5 * random.random())))
            pause = min(2.0, pause * 2)

    def _read(self, event: dict[str, Any]) -> JobResult | None:
        response = self._call(None, FunctionName=self.function,
                              InvocationType="RequestResponse",
                              Payload=json.dumps(event).encode("utf-8"))
        document = _document(response["Payload"].read())
        if response.get("FunctionError"):
            raise EnqueueFunctionError(self.function, str(response["FunctionError"]), document,
                                       EnqueueAnswer())
        if not isinstance(document, dict) or document.get("operation") != "result":
            raise EnqueueFunctionError(self.function, "unexpected answer", document,
                                       EnqueueAnswer())
        rejected = document.get("rejected")
        if isinstance(rejected, dict):
            sqlstate = rejected.get("sqlstate")
            error = PermissionDeniedError if sqlstate == "42501" else InvalidRequestError
            raise error(str(rejected.get("reason")), sqlstate=sqlstate)
        job = document.get("job")
        return None if job is None else JobResult.from_row(job)

    def invoke(self, event: Mapping[str, Any], *,
               answered: EnqueueAnswer | None = None) -> EnqueueAnswer:
        """One synchronous invocation with ``event`` as it is (a job, a batch or an
        EventBridge envelope); raises :class:`EnqueueFunctionError` on a function error."""
        response = self._call(answered, FunctionName=self.function,
                              InvocationType="RequestResponse",
                              Payload=json.dumps(event).encode("utf-8"))
        document = _document(response["Payload"].read())
        error = response.get("FunctionError")
        if error:
            raise EnqueueFunctionError(self.function, str(error), document,
                                       answered or EnqueueAnswer())
        if not isinstance(document, dict) or not isinstance(document.get("results"), list):
            raise EnqueueFunctionError(self.function, "unexpected answer", document,
                                       answered or EnqueueAnswer())
        return EnqueueAnswer([
            ItemAnswer(int(r["index"]), r["status"], r.get("job_id"), r.get("reason"),
                       r.get("sqlstate"))
            for r in document["results"]])

    def _call(self, answered: EnqueueAnswer | None, **params: Any) -> Any:
        """``lambda:Invoke`` with ``params``; a throttle that outlasted botocore's retries
        raises :class:`EnqueueThrottledError`."""
        try:
            return self._client.invoke(**params)
        except Exception as exc:
            throttled = _throttled(exc, "lambda", self.function, answered=answered)
            if throttled is not None:
                raise throttled from exc
            raise

    def enqueue_async(self, jobs: Iterable[Job]) -> int:
        """Hand ``jobs`` to Lambda's asynchronous queue (InvocationType Event) and return
        the number of invocations. Nothing comes back: failures after Lambda's retries land
        in the stack's dead-letter queue (see ``leaseq enqueue resubmit``)."""
        calls = 0
        for chunk in _chunks([job_document(job) for job in jobs], 250_000):
            response = self._call(None, FunctionName=self.function, InvocationType="Event",
                                  Payload=json.dumps({"jobs": chunk, "asynchronous": True}
                                                     ).encode("utf-8"))
            if response.get("StatusCode") != 202:
                raise EnqueueError(f"Lambda did not queue the invocation of {self.function} "
                                   f"(HTTP {response.get('StatusCode')})")
            calls += 1
        return calls


class EnqueueEventBus:
    """The stack's enqueue bus (output EnqueueEventBusName), one PutEvents call per batch.

    Needs ``events:PutEvents`` on the bus (EnqueueProducerPolicy grants it). Without
    ``client``, an EventBridge client in botocore's standard retry mode.
    """

    def __init__(self, bus: str, source: str, *, client: Any = None) -> None:
        if not source or source.startswith("aws."):
            raise ValueError("source names your producer, such as 'billing'; 'aws.' is reserved")
        self.bus = bus
        self.source = source
        self._client = client if client is not None else _events_client()

    def _entries(self, jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"EventBusName": self.bus, "Source": self.source,
                 "DetailType": ENQUEUE_DETAIL_TYPE,
                 "Detail": json.dumps({"jobs": chunk}, separators=(",", ":"))}
                for chunk in _chunks(list(jobs), MAX_PUT_BYTES)]

    def put(self, jobs: Iterable[Job]) -> list[str]:
        """Put ``jobs`` on the bus; the accepted event ids. Raises
        :class:`EventsNotAccepted` when some entries were refused (the others went on)."""
        entries = self._entries([job_document(job) for job in jobs])
        accepted: list[str] = []
        failed: list[dict[str, Any]] = []
        batch: list[dict[str, Any]] = []
        used = 0
        for entry in [*entries, None]:
            size = 0 if entry is None else _size(entry)
            if batch and (entry is None or len(batch) == MAX_ENTRIES_PER_PUT
                          or used + size > MAX_PUT_BYTES):
                try:
                    response = self._client.put_events(Entries=batch)
                except Exception as exc:
                    throttled = _throttled(exc, "events", self.bus, accepted=accepted)
                    if throttled is not None:
                        raise throttled from exc
                    raise
                for sent, result in zip(batch, response["Entries"], strict=True):
                    if result.get("EventId") and not result.get("ErrorCode"):
                        accepted.append(str(result["EventId"]))
                    else:
                        failed.append({**result, "Detail": sent["Detail"]})
                if response.get("FailedEntryCount", 0) and not failed:
                    failed.append({"ErrorCode": "Unknown", "ErrorMessage":
                                   f"FailedEntryCount {response['FailedEntryCount']}"})
                batch, used = [], 0
            if entry is not None:
                batch.append(entry)
                used += size
        if failed:
            raise EventsNotAccepted(failed, accepted)
        return accepted
