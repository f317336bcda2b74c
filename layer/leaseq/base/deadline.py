"""Time budgets. The library never reads a clock of its own accord: it asks a
``Deadline`` how long it has, so a Lambda context, a wall clock or a test's manual
clock can drive the same code, and tests never sleep.

The lease timeline of one invocation::

    start ─────────────── claim ─── run jobs ───────────── margin ─┤ hard deadline
                          lease = remaining - margin ──────────────┤
    Every outcome is recorded before its lease expires, because a job is only
    started while the time left covers its budget plus the margin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from leaseq.base.limits import MAX_LEASE as MAX_LEASE
from leaseq.base.limits import MIN_LEASE as MIN_LEASE


class Deadline(Protocol):
    """How long the caller has: the only clock the worker and the reaper read, so a
    Lambda context (``leaseq_lambda.context.LambdaDeadline``), a wall clock or a test's
    manual clock can drive the same code.

    >>> class Fixed:
    ...     def remaining(self) -> float:
    ...         return 42.0
    >>> lease_for(Fixed().remaining(), margin=5)
    datetime.timedelta(seconds=37)
    """

    def remaining(self) -> float:
        """Seconds left, never negative."""
        ...


class MonotonicDeadline:
    """A deadline ``seconds`` from now on a monotonic clock: for a worker outside Lambda
    (a script, a container, a test) that should stop after a while.

    >>> MonotonicDeadline(60).remaining() > 59
    True
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._end - self._clock())


def lease_for(remaining: float, *, margin: float, cap: float | None = None) -> timedelta | None:
    """The lease to take with ``remaining`` seconds left, or None if too little is left.

    The lease ends ``margin`` seconds before the deadline, so the worker can still
    record outcomes after its last job; ``cap`` shortens it so that a crashed
    invocation's jobs come back sooner (long handlers then renew).
    """
    seconds = remaining - margin
    if cap is not None:
        seconds = min(seconds, cap)
    lease = timedelta(seconds=seconds)
    if lease < MIN_LEASE:
        return None
    return min(lease, MAX_LEASE)
