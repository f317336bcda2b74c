"""What a running handler can see and do about its own job, and which job is running.

The worker marks the job it is running in a context variable, so any log line written
while a handler runs (by leaseq, by the handler, by a library it calls) can carry the
job's identity: :class:`JobLogFields` copies it onto log records. This stays standard
``logging``; the Lambda adapter attaches the filter to its JSON handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from leaseq.jobs import ClaimedJob

_current_job: ContextVar[ClaimedJob | None] = ContextVar("leaseq_current_job", default=None)


@dataclass
class JobContext:
    job: ClaimedJob
    _remaining: Callable[[], float]
    _renew: Callable[[], bool]

    @property
    def attempt(self) -> int:
        return self.job.attempts

    @property
    def correlation_id(self) -> str | None:
        return self.job.correlation_id

    def remaining(self) -> float:
        """Seconds this handler may still run before it is interrupted."""
        return self._remaining()

    def renew_lease(self) -> bool:
        """Extend the lease as far as the invocation's budget allows.

        Returns False when the lease was lost (another worker may now own the job);
        a handler should then stop without side effects it cannot repeat.
        """
        return self._renew()


def current_job() -> ClaimedJob | None:
    """The job whose handler is running in this context, if any."""
    return _current_job.get()


class running:
    """Mark ``job`` as the one running in this context for the length of a block.

    A class rather than a generator-based context manager: it is entered once per job.
    """

    __slots__ = ("_job", "_token")
    _token: Token[ClaimedJob | None]

    def __init__(self, job: ClaimedJob) -> None:
        self._job = job

    def __enter__(self) -> None:
        self._token = _current_job.set(self._job)

    def __exit__(self, *exc_info: object) -> None:
        _current_job.reset(self._token)


def job_log_fields(job: ClaimedJob) -> dict[str, Any]:
    """The fields every log line about ``job`` carries (None values are left out)."""
    fields: dict[str, Any] = {
        "job_id": str(job.id),
        "tenant_id": str(job.tenant_id),
        "kind": job.kind,
        "attempt": job.attempts,
    }
    if job.correlation_id is not None:
        fields["correlation_id"] = job.correlation_id
    return fields


class JobLogFields(logging.Filter):
    """Add the running job's fields to every record that does not already carry them."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = _current_job.get()
        if job is not None:
            for key, value in job_log_fields(job).items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True
