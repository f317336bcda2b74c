"""What became of a job, as its producer reads it, and waiting for it to finish.

A producer reads its job through ``app.get_job_result`` (by id) or
``app.get_job_result_by_key`` (by operation key): its state, attempts, result and last
error, never the payload or the lease. A tenant-bound producer login can read only its
tenants' jobs: the database refuses any other with 42501 before the lookup.

Waiting is bounded polling, never a busy loop: the first read at once, then reads
``first`` seconds apart, doubling up to ``cap``, each wait drawn between half and all of
its interval (jitter, so that many producers waiting for one batch do not read in step),
and never past the caller's timeout. Waiting 60 s for a job that does not finish reads it
35 to 65 times (by the jitter) with the defaults, each read an index lookup by primary key
(or by the operation key's unique index).

A job's result is at most 256 KiB of JSON (the finish functions refuse a larger one, and
the worker records such a job dead instead: :data:`leaseq.drain.outcomes.MAX_RESULT_BYTES`), and
is readable until the job is pruned: the reaper deletes finished jobs
``LEASEQ_RETENTION_DAYS`` (14 unless set) after they finished.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from leaseq.base.jobs import JobState

#: The states a job does not leave: its result (or last error) is final.
FINISHED_STATES = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})
#: Seconds between the first reads of a wait, and the most between two.
FIRST_INTERVAL = 0.1
MAX_INTERVAL = 2.0


@dataclass(frozen=True)
class JobResult:
    """A job as its producer sees it: what it is, where it is, and how it ended."""

    id: UUID
    tenant_id: UUID
    operation_key: str
    kind: str
    state: JobState
    attempts: int
    max_attempts: int
    available_at: datetime
    #: The handler's return value (JSON) once the job succeeded, else None.
    result: Any
    #: What went wrong last (``{"code": ..., "message": ...}``), if anything did.
    last_error: Any
    correlation_id: str | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether the job is done for good (succeeded, dead or cancelled)."""
        return self.state in FINISHED_STATES

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobResult:
        """From a row of ``app.get_job_result`` (or a document of :meth:`as_document`)."""
        def moment(value: Any) -> datetime:
            return value if isinstance(value, datetime) else datetime.fromisoformat(value)

        return cls(
            id=UUID(str(row["id"])), tenant_id=UUID(str(row["tenant_id"])),
            operation_key=row["operation_key"], kind=row["kind"], state=JobState(row["state"]),
            attempts=int(row["attempts"]), max_attempts=int(row["max_attempts"]),
            available_at=moment(row["available_at"]), result=row["result"],
            last_error=row["last_error"], correlation_id=row["correlation_id"],
            created_at=moment(row["created_at"]), updated_at=moment(row["updated_at"]),
            completed_at=None if row["completed_at"] is None else moment(row["completed_at"]))

    def as_document(self) -> dict[str, Any]:
        """The job as JSON (ids and times as text): the enqueue function's answer."""
        return {
            "id": str(self.id), "tenant_id": str(self.tenant_id),
            "operation_key": self.operation_key, "kind": self.kind,
            "state": self.state.value, "attempts": self.attempts,
            "max_attempts": self.max_attempts, "available_at": self.available_at.isoformat(),
            "result": self.result, "last_error": self.last_error,
            "correlation_id": self.correlation_id, "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "completed_at": None if self.completed_at is None
            else self.completed_at.isoformat(),
        }


def poll_until_finished(read: Callable[[], JobResult | None], timeout: float, *,
                        first: float = FIRST_INTERVAL, cap: float = MAX_INTERVAL,
                        sleep: Callable[[float], None] = time.sleep,
                        clock: Callable[[], float] = time.monotonic,
                        jitter: Callable[[], float] = random.random) -> JobResult | None:
    """Read until the job has finished or ``timeout`` seconds have passed (see the module
    docstring for the intervals); the last read: None when there is no such job (at
    once: a job that is not there does not finish), unfinished when the time ran out."""
    deadline = clock() + max(0.0, timeout)
    interval = first
    while True:
        found = read()
        if found is None or found.finished:
            return found
        left = deadline - clock()
        if left <= 0:
            return found
        sleep(min(left, interval * (0.5 + 0.5 * jitter())))
        interval = min(cap, interval * 2)
