"""reap_once(): give every tenant's expired leases back to the queue.

Each call of app.release_all_expired_jobs is bounded (``limit`` rows, oldest expiry
first), and the pass repeats it only while whole pages come back and time remains,
so one reaper invocation can never run past its own deadline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from leaseq.client import QueueClient
from leaseq.deadline import Deadline

logger = logging.getLogger("leaseq.reaper")


@dataclass
class ReapReport:
    released: int = 0
    calls: int = 0
    complete: bool = False
    time_left: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def reap_once(client: QueueClient, deadline: Deadline, *, limit: int = 1000,
              max_calls: int = 100, margin: float = 2.0) -> ReapReport:
    """Release expired leases of every tenant until none are left or time is short."""
    if not 1 <= limit <= 10_000:
        raise ValueError("limit must be between 1 and 10000")
    report = ReapReport()
    while report.calls < max_calls and deadline.remaining() > margin:
        released = client.release_all_expired_jobs(limit)
        report.calls += 1
        report.released += released
        if released < limit:
            report.complete = True
            break
    report.time_left = deadline.remaining()
    if report.released:
        logger.info("released expired leases", extra={"released": report.released})
    return report
