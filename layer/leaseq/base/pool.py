"""The worker pool: how many worker invocations drain at once, and when to ask for more.

The database keeps the count (``app.worker_pool``, ``sql/functions/pool.sql``): each
running invocation holds a *place* that expires with it, each invocation asked for and
not started yet holds a reserved one, and no function lets the places exceed the
maximum, whoever asks. This module holds what the library needs beside that count:

* :class:`PoolSize`, the count as :meth:`leaseq.QueueClient.worker_pool_size` reads it;
* :class:`PoolLimits`, the limits the schema owner sets (``app.settings``: the maximum,
  the start hold and the wake's debounce; :func:`leaseq.store.client.set_worker_pool_limits`).
  A caller's own maximum and hold can only narrow them;
* :class:`ScaleUp`, the policy that tells a draining worker when its claims show a
  backlog worth one more invocation. Every member of the pool asking for one more place
  at most once a second doubles the pool each second while the backlog lasts, and the
  database's maximum caps it; whoever starts the invocations (the Lambda runtime's
  fan-out) reserves the places and invokes.

Nothing here knows about Lambda: a place is named by a UUID and an owner id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from leaseq.base.errors import ConfigurationError
from leaseq.base.jobs import ClaimedJob

#: Why an invocation joins the pool (``app.join_worker_pool``'s ``p_reason``): a schedule
#: tick, a manual start, a fan-out from a busy worker, a wake after an enqueue.
POOL_REASONS: Final = ("schedule", "manual", "fanout", "wake")

#: ScaleUp's defaults: a claimed job that waited longer than this many seconds shows a
#: backlog; one place asked for at most this often.
DEFAULT_LAG: Final = 1.0
DEFAULT_INTERVAL: Final = 1.0


@dataclass(frozen=True)
class PoolSize:
    """The unexpired places of the worker pool: held by running invocations (``live``)
    and reserved for invocations asked for and not started yet (``reserved``)."""

    live: int
    reserved: int

    @property
    def total(self) -> int:
        """Every place counted against the maximum."""
        return self.live + self.reserved


@dataclass(frozen=True)
class PoolLimits:
    """The worker pool's limits as the schema owner set them (``app.settings``): at most
    ``max_workers`` places (0: no fan-out and no wake; a schedule tick still drains), a
    reserved place or a wake's ticket waits ``start_hold`` seconds for its invocation
    (at most 15 minutes), and each login wakes at most once per ``wake_debounce``
    seconds."""

    max_workers: int
    start_hold: float
    wake_debounce: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PoolLimits:
        """From a row of ``app.set_worker_pool_limits`` (intervals as timedeltas)."""
        return cls(max_workers=int(row["max_workers"]),
                   start_hold=row["start_hold"].total_seconds(),
                   wake_debounce=row["wake_debounce"].total_seconds())


class ScaleUp:
    """When a worker's claims show more work than the pool drains: a pure policy.

    :meth:`wanted` is told every claim (the jobs claimed, the limit asked). It answers 1,
    one more place, when the claim came back full (the queue holds at least as much
    again) or its oldest job had waited longer than ``lag`` seconds since it became
    ready (the pool is not keeping up), and it has not answered 1 in the last
    ``interval`` seconds; else 0. An empty claim never asks.

    ``clock`` is wall-clock seconds since the epoch (``time.time``; injected in tests),
    since a job's wait is measured from its ``available_at``. Safe to call from several
    threads.

    >>> policy = ScaleUp(lag=1.0, interval=1.0)
    >>> policy.wanted([], limit=10)
    0
    """

    def __init__(self, *, lag: float = DEFAULT_LAG, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.time) -> None:
        if not lag >= 0 or not interval >= 0:
            raise ConfigurationError(f"ScaleUp's lag and interval must be at least 0 seconds "
                                     f"(got lag={lag!r}, interval={interval!r})")
        self.lag = lag
        self.interval = interval
        self._clock = clock
        self._asked_at: float | None = None
        self._lock = threading.Lock()

    def wanted(self, claimed: Sequence[ClaimedJob], limit: int) -> int:
        """Places to ask for after this claim: 1 or 0 (see the class docstring)."""
        if not claimed:
            return 0
        now = self._clock()
        if not self._backlog(claimed, limit, now):
            return 0
        with self._lock:
            if self._asked_at is not None and now - self._asked_at < self.interval:
                return 0
            self._asked_at = now
        return 1

    def _backlog(self, claimed: Sequence[ClaimedJob], limit: int, now: float) -> bool:
        if len(claimed) >= limit:
            return True
        oldest = min(job.available_at for job in claimed)
        return now - oldest.timestamp() > self.lag
