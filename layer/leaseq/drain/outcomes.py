"""Judging a run: from what a handler did to the outcome recorded under its lease.

Before a handler runs, :meth:`Judge.prepare` refuses what running cannot fix (a stored
payload Python cannot decode, an unknown kind, a payload that does not fit the kind's
model). After it ran, :meth:`Judge.judge` turns its :class:`~leaseq.drain.execution.Execution`
into a :class:`~leaseq.base.jobs.JobOutcome`: a result that can be stored, a retry with
backoff, or dead. Every error document is made storable here, so one handler's odd
exception can never make the statement that records a whole batch fail.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from leaseq.base.jobs import ClaimedJob, JobOutcome
from leaseq.base.limits import MAX_RETRY_DELAY
from leaseq.base.storable import MAX_DOCUMENT_BYTES, character_problem, json_size, storage_problem
from leaseq.drain.execution import STOPPED_BY, Execution
from leaseq.kinds.job_context import job_log_fields
from leaseq.kinds.registry import Registration
from leaseq.kinds.retry import RetryPolicy
from leaseq.kinds.signals import DiscardJob, RetryJob

logger = logging.getLogger("leaseq.worker")

#: The SQL contract's result size bound (sql/0003).
MAX_RESULT_BYTES = MAX_DOCUMENT_BYTES


def error_document(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """A ``last_error`` document PostgreSQL will accept, whatever went into it."""
    document: dict[str, Any] = storable({"code": code, "message": message, **extra})
    return document


def storable(value: Any) -> Any:
    """A JSON value PostgreSQL's jsonb accepts: no U+0000, no NaN, only JSON types.

    Error documents are built from whatever a handler raised; one unstorable message
    must not make the statement that records a whole batch fail.
    """
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, dict):
        return {storable(str(key)): storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable(item) for item in value]
    return storable(str(value))


class Prepared(NamedTuple):
    """A claimed job ready to run (its payload, validated) or refused before running."""

    payload: Any = None
    refused: JobOutcome | None = None


class Judge:
    """Turns what happened to a job into its outcome, with the worker's retry policy."""

    def __init__(self, retry: RetryPolicy, rand: Callable[[], float] = random.random) -> None:
        self._default_policy = retry
        self._rand = rand

    def policy(self, registration: Registration | None) -> RetryPolicy:
        if registration is not None and registration.retry is not None:
            return registration.retry
        return self._default_policy

    def prepare(self, job: ClaimedJob, registration: Registration | None) -> Prepared:
        """The payload the handler gets, or the outcome of a job that cannot run."""
        if job.payload_error is not None:
            # Retrying cannot help: every claim would read the same stored text.
            logger.error("payload cannot be decoded", extra=job_log_fields(job))
            undecodable = job.payload_error
            return Prepared(refused=JobOutcome(job, "dead", error_document(
                "UNDECODABLE_PAYLOAD",
                f"the stored payload cannot be decoded as JSON by Python: "
                f"{undecodable.reason}. Enqueue a corrected job under a new operation "
                "key; retrying this one would fail the same way",
                prefix=undecodable.prefix, length=len(undecodable.text))))
        if registration is None and character_problem(job.kind) is not None:
            # Stored before enqueue refused such kinds: no handler can be registered for
            # it (Registry refuses it too), so it dies here like an unknown kind, with
            # the reason, and the drain goes on.
            logger.error("job kind holds characters kinds may not hold",
                         extra=job_log_fields(job))
            return Prepared(refused=JobOutcome(job, "dead", error_document(
                "INVALID_KIND", f"kind {job.kind!r} {character_problem(job.kind)}: no "
                "handler can be registered for it. Enqueue a corrected job under a new "
                "operation key", kind=job.kind)))
        if registration is None:
            logger.error("no handler registered for this kind", extra=job_log_fields(job))
            return Prepared(refused=JobOutcome(job, "dead", error_document(
                "UNKNOWN_KIND", f"no handler is registered for kind {job.kind!r}",
                kind=job.kind)))
        if registration.payload_model is None:
            return Prepared(payload=job.payload)
        try:
            return Prepared(payload=registration.payload_model.model_validate(job.payload))
        except ValidationError as exc:
            logger.error("payload does not match the kind's model", extra=job_log_fields(job))
            return Prepared(refused=JobOutcome(job, "dead", error_document(
                "INVALID_PAYLOAD", f"payload does not match {exc.title}",
                errors=json.loads(exc.json(include_url=False, include_input=False)))))

    def judge(self, job: ClaimedJob, registration: Registration | None,
              execution: Execution) -> JobOutcome:
        """The outcome of one run of the job's handler."""
        exc = execution.error
        if exc is None and not execution.overran:
            return self._success(job, execution.value)
        if execution.stopped_by == "cancel_request":
            logger.info("job stopped after an operator cancelled it",
                        extra=job_log_fields(job))
            return self.cancelled(job)
        policy = self.policy(registration)
        if execution.overran:
            how = STOPPED_BY.get(execution.stopped_by, execution.stopped_by)
            logger.warning(f"job overran its time budget and was {how}",
                           extra={**job_log_fields(job), "budget": execution.budget})
            return self._retry(job, policy, None, error_document(
                "JOB_TIMEOUT",
                f"the handler ran longer than its budget of {execution.budget:g} s"))
        assert exc is not None
        if isinstance(exc, RetryJob):
            logger.info("handler asked for a retry", extra=job_log_fields(job))
            return self._retry(job, policy, exc.delay, error_document(
                "RETRY_REQUESTED", exc.reason))
        if isinstance(exc, DiscardJob):
            logger.warning("handler discarded the job", extra=job_log_fields(job))
            return JobOutcome(job, "dead", error_document("DISCARDED", exc.reason))
        logger.warning("handler failed", extra={**job_log_fields(job), "error": repr(exc)},
                       exc_info=exc)
        return self._retry(job, policy, None, error_document(
            "HANDLER_ERROR", str(exc) or type(exc).__name__, type=type(exc).__qualname__))

    def cancelled(self, job: ClaimedJob) -> JobOutcome:
        """The outcome of a job an operator cancelled while it ran, recorded when its
        handler was stopped (or before it started): never retried, and recorded as
        ``cancelled`` by the database, which holds the request."""
        return JobOutcome(job, "dead", error_document(
            "CANCELLED", "an operator cancelled the job while it was running"))

    def _success(self, job: ClaimedJob, result: Any) -> JobOutcome:
        if result is None:  # most handlers return nothing: nothing to check
            return JobOutcome(job, "succeeded")
        try:
            value = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
            problem = storage_problem(value)
            size = json_size(value) if problem is None else 0
        except (TypeError, ValueError, RecursionError) as exc:
            return JobOutcome(job, "dead", error_document(
                "RESULT_NOT_JSON", "the handler returned a value that is not strict JSON: "
                f"{str(exc) or type(exc).__name__}"))
        if problem is not None:
            return JobOutcome(job, "dead", error_document(
                "RESULT_NOT_JSON", f"the handler's result cannot be stored: {problem}"))
        if size > MAX_RESULT_BYTES:
            return JobOutcome(job, "dead", error_document(
                "RESULT_TOO_LARGE",
                f"the handler's result is {size} bytes; at most {MAX_RESULT_BYTES} are stored"))
        return JobOutcome(job, "succeeded", value)

    def _retry(self, job: ClaimedJob, policy: RetryPolicy, delay: timedelta | None,
               error: dict[str, Any]) -> JobOutcome:
        if not policy.allows_another(job.attempts, job.max_attempts):
            # Attempts used up, by the job's own limit or the kind's stricter one: the
            # queue records it dead with reason max_attempts, which operators tell
            # apart from a discard.
            return JobOutcome(job, "exhausted", {**error, "final": True})
        chosen = delay if delay is not None else policy.delay(job.attempts, rand=self._rand)
        chosen = min(max(chosen, timedelta(0)), MAX_RETRY_DELAY)  # the SQL contract's bounds
        return JobOutcome(job, "retry", error, retry_delay=chosen)
