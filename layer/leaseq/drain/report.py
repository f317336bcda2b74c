"""What one drain did: the counts both drains keep (:class:`DrainReport`), why the drain
stopped (:data:`Stopped`), and the line logged as each job starts (:func:`log_start`).

Its own module because three others share it and none should need the rest of another:
the one-at-a-time drain (:mod:`leaseq.drain.worker`) and the event-loop drain
(:mod:`leaseq.drain.slots`) fill a report, and the recorder (:mod:`leaseq.drain.recorder`) counts
each recorded outcome into it. It imports none of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from leaseq.base.jobs import ClaimedJob
from leaseq.kinds.job_context import job_log_fields

logger = logging.getLogger("leaseq.worker")

__all__ = ["DrainReport", "Stopped", "log_start"]

#: Why a drain stopped: the queue stayed empty for ``poll_idle``; the time left could not
#: fit another job (or a job had to be given back); or every slot is still held by a
#: handler thread that overran its budget in an earlier drain.
Stopped = Literal["queue_empty", "deadline", "no_free_slot", "not_started"]


@dataclass
class DrainReport:
    """What one drain did, counted per job (the worker function logs it and turns it
    into metrics)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    #: Jobs recorded as cancelled: an operator cancelled them while they ran.
    cancelled: int = 0
    lost_leases: int = 0
    given_back: int = 0
    #: Claims that found work; claims that found nothing (polls of an empty queue).
    batches: int = 0
    polls: int = 0
    #: Handlers that returned after their budget (result discarded, JOB_TIMEOUT kept).
    late_returns: int = 0
    #: Times a handler held the event loop longer than ``loop_stall``.
    loop_stalls: int = 0
    concurrency: int = 1
    time_left: float = 0.0
    stopped: Stopped = "not_started"

    def as_dict(self) -> dict[str, Any]:
        """The report as a log line's or a trace annotation's fields."""
        return dict(self.__dict__)


def log_start(job: ClaimedJob, budget: float) -> None:
    """The line that says which job an invocation is running, without the database."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("job started", extra={**job_log_fields(job), "budget": budget})
