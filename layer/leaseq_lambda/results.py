"""The enqueue function's second operation: a producer reads what became of its job.

A producer without a database login invokes the enqueue function with::

    {"operation": "result", "tenant_id": "<uuid>", "job_id": "<uuid>", "wait_seconds": 20}

(or ``"operation_key"`` instead of ``"job_id"``; ``wait_seconds`` 0, the default, reads
once). The same function, so the same IAM permission (``lambda:InvokeFunction`` on it,
EnqueueProducerPolicy) and the same login: a producer that may enqueue for a tenant may
read that tenant's jobs, and a door bound to some tenants (EnqueueTenants) reads only
theirs, because its login's binding makes the database refuse any other (42501); this
module checks no tenant itself. The answer::

    {"operation": "result", "job": {...} | null, "finished": true | false}

or, for a query that is refused, ``{"operation": "result", "job": null, "rejected":
{"reason": ..., "errors"?: [...], "sqlstate"?: "42501"}}``. The job's fields are those of
:class:`leaseq.base.results.JobResult` (never the payload or the lease).

Waiting is bounded polling with backoff and jitter (:func:`leaseq.base.results.poll_until_finished`)
for ``wait_seconds``, capped by the invocation's own remaining time less
:data:`ANSWER_MARGIN_SECONDS`, so that the function always answers before its timeout;
an unfinished job is answered as it is (``finished`` false) and the caller asks again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal
from uuid import UUID

from leaseq import PermissionDeniedError
from leaseq.base.results import JobResult, poll_until_finished
from leaseq.store.duties import ProducerCalls
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from leaseq_lambda.events import FieldProblem, describe, problems

__all__ = ["ANSWER_MARGIN_SECONDS", "RESULT_OPERATION", "ResultQuery", "answer_result",
           "is_result_query"]

#: The value of ``operation`` that asks for a job's result instead of enqueueing.
RESULT_OPERATION: Final = "result"
#: Seconds of the invocation kept for answering after a wait.
ANSWER_MARGIN_SECONDS: Final = 2.0
#: The longest wait one invocation takes (Lambda's longest timeout).
MAX_WAIT_SECONDS: Final = 900


class ResultQuery(BaseModel):
    """Which job to read, and how long to wait for it to finish."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operation: Literal["result"]
    tenant_id: UUID
    job_id: UUID | None = None
    operation_key: str | None = Field(default=None, min_length=1, max_length=255)
    wait_seconds: float = Field(default=0.0, ge=0, le=MAX_WAIT_SECONDS)

    @model_validator(mode="after")
    def _one_name(self) -> ResultQuery:
        if (self.job_id is None) == (self.operation_key is None):
            raise ValueError("name the job by job_id or by operation_key (one of them)")
        return self


def is_result_query(event: Any) -> bool:
    """Whether ``event`` asks for a result (``"operation": "result"``), not to enqueue."""
    return isinstance(event, dict) and event.get("operation") == RESULT_OPERATION


@dataclass(frozen=True)
class ResultAnswer:
    """The function's answer, and what it logs."""

    document: dict[str, Any]
    job: JobResult | None = None
    waited_for: float = 0.0


def _rejected(reason: str, *, errors: tuple[FieldProblem, ...] = (),
              sqlstate: str | None = None) -> ResultAnswer:
    rejected: dict[str, Any] = {"reason": reason}
    if errors:
        rejected["errors"] = [{"field": e.field, "type": e.type, "message": e.message}
                              for e in errors]
    if sqlstate is not None:
        rejected["sqlstate"] = sqlstate
    return ResultAnswer({"operation": RESULT_OPERATION, "job": None, "rejected": rejected})


def answer_result(event: Any, connect: Callable[[], ProducerCalls],
                  remaining_seconds: Callable[[], float], **polling: Any) -> ResultAnswer:
    """Read (and wait for) the job ``event`` names; a query that does not validate is
    refused without touching the database, a tenant the login may not read with 42501."""
    try:
        query = ResultQuery.model_validate(event)
    except ValidationError as exc:
        return _rejected(describe(exc), errors=problems(exc))
    client = connect()
    wait = max(0.0, min(query.wait_seconds, remaining_seconds() - ANSWER_MARGIN_SECONDS))

    def read() -> JobResult | None:
        return client.job_result(query.tenant_id, job_id=query.job_id,
                                 operation_key=query.operation_key)

    try:
        job = poll_until_finished(read, wait, **polling)
    except PermissionDeniedError as exc:
        return _rejected(exc.message, sqlstate=exc.sqlstate or "42501")
    return ResultAnswer({"operation": RESULT_OPERATION,
                         "job": None if job is None else job.as_document(),
                         "finished": job is not None and job.finished}, job, wait)
