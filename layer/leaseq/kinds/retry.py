"""Retry timing: exponential backoff with jitter, per kind.

Jitter spreads the retries of jobs that failed together (an outage of the service
they call) so they do not return together. "Equal jitter": half the exponential
delay is kept, the other half is random, so a retry never comes back immediately.

The first delay's and the cap's defaults and ranges are ``RETRY_BASE`` and ``RETRY_MAX``
below, which the worker's settings (``leaseq.drain.config``, ``LEASEQ_RETRY_*_SECONDS``) read too.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from leaseq.base.limits import MAX_ATTEMPTS, Bounds
from leaseq.base.limits import MAX_RETRY_DELAY as MAX_RETRY_DELAY

#: Retry backoff: the first delay and the cap, in seconds.
RETRY_BASE = Bounds(5.0, 0, 86_400)
RETRY_MAX = Bounds(3600.0, 0, MAX_RETRY_DELAY.total_seconds())


@dataclass(frozen=True)
class RetryPolicy:
    """How long a failed job waits before its next attempt, and how many it gets.

    The delay after attempt n is drawn between half and all of
    ``min(max_delay, base_delay * 2 ** (n - 1))``; ``max_attempts`` (None: the job's own
    limit) caps the attempts of every job of a kind. A kind's policy is given at
    registration; a handler's ``RetryJob(delay=...)`` overrides the delay of one retry.

    >>> policy = RetryPolicy(base_delay=2, max_delay=60, max_attempts=5)
    >>> policy.delay(3, rand=lambda: 1.0)
    datetime.timedelta(seconds=8)
    >>> policy.allows_another(attempts=5, job_max_attempts=10)
    False
    >>> RetryPolicy(base_delay=60, max_delay=10)
    Traceback (most recent call last):
    ...
    ValueError: max_delay (10) is less than base_delay (60): the retry cap must be at least...
    """

    base_delay: float = RETRY_BASE.default
    max_delay: float = RETRY_MAX.default
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        problems = [f"{name} must be {bounds.describe()} (got {value!r})"
                    for name, value, bounds in (("base_delay", self.base_delay, RETRY_BASE),
                                                ("max_delay", self.max_delay, RETRY_MAX))
                    if not bounds.allows(value)]
        if not problems and self.max_delay < self.base_delay:
            problems.append(f"max_delay ({self.max_delay:g}) is less than base_delay "
                            f"({self.base_delay:g}): the retry cap must be at least the "
                            "first delay")
        if self.max_attempts is not None and not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            problems.append(f"max_attempts must be between 1 and {MAX_ATTEMPTS} "
                            f"(got {self.max_attempts!r})")
        if problems:
            raise ValueError("; ".join(problems))

    def delay(self, attempt: int, *, rand: Callable[[], float] = random.random) -> timedelta:
        """Delay before the retry that follows failed attempt number ``attempt`` (1-based)."""
        doublings = min(max(0, attempt - 1), 64)  # 2**64 s already exceeds any cap
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** doublings)
        return timedelta(seconds=ceiling / 2 + rand() * ceiling / 2)

    def allows_another(self, attempts: int, job_max_attempts: int) -> bool:
        """Whether a job that has used ``attempts`` may be tried again: below both its own
        ``max_attempts`` and this policy's."""
        limit = job_max_attempts if self.max_attempts is None else min(
            self.max_attempts, job_max_attempts)
        return attempts < limit
