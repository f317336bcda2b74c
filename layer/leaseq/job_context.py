"""What a running handler can see and do about its own job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from leaseq.jobs import ClaimedJob


@dataclass
class JobContext:
    job: ClaimedJob
    _remaining: Callable[[], float]
    _renew: Callable[[], bool]

    @property
    def attempt(self) -> int:
        return self.job.attempts

    def remaining(self) -> float:
        """Seconds this handler may still run before it is interrupted."""
        return self._remaining()

    def renew_lease(self) -> bool:
        """Extend the lease as far as the invocation's budget allows.

        Returns False when the lease was lost (another worker may now own the job);
        a handler should then stop without side effects it cannot repeat.
        """
        return self._renew()
