"""When to claim again after a claim found nothing: an interval that starts short and
doubles up to a cap, until the queue has stayed empty for ``poll_idle`` seconds.

A job that becomes due while a worker polls (enqueued, delayed, retried) is claimed by
the next poll, so it starts within one interval: at most ``poll_min`` after the last
claim that found work, at most ``poll_max`` once the queue has been quiet for a while.
The cost of polling an empty queue is in docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PollSchedule:
    """The waits between claims of one drain (real time: a clock, not the deadline)."""

    def __init__(self, first: float, cap: float, idle: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first = first
        self._cap = cap
        self._idle = idle
        self._clock = clock
        self._interval = first
        self._idle_since: float | None = None
        self.polls = 0

    def found_work(self) -> None:
        """A claim found jobs (or jobs are running): poll fast again, not idle."""
        self._interval = self._first
        self._idle_since = None

    def after_empty(self, *, busy: bool = False) -> float | None:
        """A claim found nothing: seconds to wait before the next, or None when the queue
        has been empty (and, unless ``busy``, no job running) for ``poll_idle`` seconds.
        """
        self.polls += 1
        now = self._clock()
        wait = self._interval
        self._interval = min(self._interval * 2, self._cap)
        if busy:
            self._idle_since = None
            return wait
        idle_since = now if self._idle_since is None else self._idle_since
        self._idle_since = idle_since
        if now - idle_since >= self._idle:
            return None
        return max(0.0, min(wait, idle_since + self._idle - now))
