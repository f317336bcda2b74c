"""Retry timing: exponential backoff with jitter, per kind.

Jitter spreads the retries of jobs that failed together (an outage of the service
they call) so they do not return together. "Equal jitter": half the exponential
delay is kept, the other half is random, so a retry never comes back immediately.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

#: The SQL contract's retry-delay bound (sql/0003).
MAX_RETRY_DELAY = timedelta(days=30)


@dataclass(frozen=True)
class RetryPolicy:
    base_delay: float = 5.0
    max_delay: float = 3600.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("need 0 <= base_delay <= max_delay")
        if self.max_delay > MAX_RETRY_DELAY.total_seconds():
            raise ValueError(f"max_delay must be at most {MAX_RETRY_DELAY}")
        if self.max_attempts is not None and not 1 <= self.max_attempts <= 20:
            raise ValueError("max_attempts must be between 1 and 20")

    def delay(self, attempt: int, *, rand: Callable[[], float] = random.random) -> timedelta:
        """Delay before the retry that follows failed attempt number ``attempt`` (1-based)."""
        doublings = min(max(0, attempt - 1), 64)  # 2**64 s already exceeds any cap
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** doublings)
        return timedelta(seconds=ceiling / 2 + rand() * ceiling / 2)

    def allows_another(self, attempts: int, job_max_attempts: int) -> bool:
        limit = job_max_attempts if self.max_attempts is None else min(
            self.max_attempts, job_max_attempts)
        return attempts < limit
