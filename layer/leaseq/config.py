"""The worker's configuration: one value, and the one table of its defaults and bounds
(and those of the worker pool's settings).

``WorkerConfig`` (what the library takes) and ``leaseq.settings.WorkerSettings`` (what
the environment gives) read their defaults and bounds from the ``Bounds`` below, and
check the rules that relate two values with :func:`contradictions`, so the two can never
disagree about what is allowed. A contradictory pair (a retry cap below the retry base,
an invocation too short for the job timeout) is refused with both names in the message;
nothing is silently repaired.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from leaseq.errors import ConfigurationError
from leaseq.retry import MAX_RETRY_DELAY, RetryPolicy

#: Seconds kept free after a job's budget to record its outcome before the lease ends.
FINISH_RESERVE = 1.0


@dataclass(frozen=True)
class Bounds:
    """A setting's default and the closed range it must lie in (``above``: the low end
    itself is excluded, for values that must be positive)."""

    default: Any
    low: float
    high: float
    above: bool = False

    def allows(self, value: float) -> bool:
        return (value > self.low if self.above else value >= self.low) and value <= self.high

    def describe(self) -> str:
        low = f"more than {self.low:g}" if self.above else f"at least {self.low:g}"
        return f"{low} and at most {self.high:g}"

    def field(self) -> dict[str, Any]:
        """Keyword arguments of a pydantic ``Field`` with this default and range."""
        low = {"gt": self.low} if self.above else {"ge": self.low}
        return {"default": self.default, "le": self.high, **low}


#: Jobs per claim statement (the SQL contract's claim limit).
BATCH_SIZE = Bounds(10, 1, 100)
#: Seconds between a lease's end and the invocation's end.
LEASE_MARGIN = Bounds(5.0, 0.5, 600)
#: A kind's budget when it names no timeout of its own.
JOB_TIMEOUT = Bounds(30.0, 0, 86_400, above=True)
#: Longest lease taken at once (None: as long as the invocation allows).
MAX_LEASE = Bounds(None, 1, 86_400)
#: Jobs run at once in one invocation.
CONCURRENCY = Bounds(1, 1, 1000)
#: Longest a finished job's outcome waits before it is recorded.
RECORD_INTERVAL = Bounds(1.0, 0, 60, above=True)
#: First and longest wait between two claims that found nothing.
POLL_MIN = Bounds(0.1, 0, 60, above=True)
POLL_MAX = Bounds(1.0, 0, 60, above=True)
#: Seconds without work after which a drain stops polling (0: stop at once).
POLL_IDLE = Bounds(10.0, 0, 86_400)
#: Seconds every invocation starts with (None: not known in advance).
WORKER_TIMEOUT = Bounds(None, 1, 86_400)
#: Seconds the event loop may be held by one handler before it is reported.
LOOP_STALL = Bounds(0.5, 0, 60, above=True)
#: Retry backoff: first delay and cap.
RETRY_BASE = Bounds(5.0, 0, 86_400)
RETRY_MAX = Bounds(3600.0, 0, MAX_RETRY_DELAY.total_seconds())

#: The worker pool (``leaseq.settings.PoolSettings``): most worker invocations at once
#: (0: no pool, no fan-out, no wake: one scheduled worker as before), how long a started
#: invocation polls an empty queue, the wake's debounce (SQL: 0 s .. 1 h) and how long a
#: reserved place waits for its invocation (SQL: 1 s .. 1 day).
MAX_WORKERS = Bounds(0, 0, 1000)
FANOUT_IDLE = Bounds(10.0, 0, 86_400)
WAKE_DEBOUNCE = Bounds(1.0, 0, 3600)
START_HOLD = Bounds(90.0, 1, 86_400)

POOL_BOUNDS: dict[str, Bounds] = {
    "max_workers": MAX_WORKERS,
    "fanout_idle": FANOUT_IDLE,
    "wake_debounce": WAKE_DEBOUNCE,
    "start_hold": START_HOLD,
}

BOUNDS: dict[str, Bounds] = {
    "batch_size": BATCH_SIZE,
    "lease_margin": LEASE_MARGIN,
    "job_timeout": JOB_TIMEOUT,
    "max_lease": MAX_LEASE,
    "concurrency": CONCURRENCY,
    "record_interval": RECORD_INTERVAL,
    "poll_min": POLL_MIN,
    "poll_max": POLL_MAX,
    "poll_idle": POLL_IDLE,
    "worker_timeout": WORKER_TIMEOUT,
    "loop_stall": LOOP_STALL,
}


def needed_for(budget: float, lease_margin: float) -> float:
    """Seconds an invocation must have left to start a job with ``budget``: the budget,
    the lease margin, and the reserve for recording its outcome."""
    return budget + lease_margin + FINISH_RESERVE


def contradictions(values: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The rules that relate two settings, broken by ``values`` (keys as in ``BOUNDS``,
    plus ``retry_base`` and ``retry_max``); each problem names both settings by
    ``names`` (a key missing there is named by itself)."""

    def name(key: str) -> str:
        return names.get(key, key)

    problems = []
    base, cap = values.get("retry_base"), values.get("retry_max")
    if base is not None and cap is not None and cap < base:
        problems.append(f"{name('retry_max')} ({cap:g}) is less than {name('retry_base')} "
                        f"({base:g}): the retry cap must be at least the first delay")
    first, longest = values.get("poll_min"), values.get("poll_max")
    if first is not None and longest is not None and longest < first:
        problems.append(f"{name('poll_max')} ({longest:g}) is less than {name('poll_min')} "
                        f"({first:g}): the longest wait between polls must be at least the "
                        "first")
    invocation = values.get("worker_timeout")
    timeout, margin = values.get("job_timeout"), values.get("lease_margin")
    if invocation is not None and timeout is not None and margin is not None:
        needed = needed_for(timeout, margin)
        if invocation < needed:
            problems.append(
                f"{name('worker_timeout')} ({invocation:g} s) cannot run a single job: a job "
                f"needs {name('job_timeout')} ({timeout:g} s) + {name('lease_margin')} "
                f"({margin:g} s) + {FINISH_RESERVE:g} s to record its outcome = {needed:g} s. "
                f"Raise {name('worker_timeout')} to at least {needed:g} s or lower "
                f"{name('job_timeout')}")
    return problems


@dataclass(frozen=True)
class WorkerConfig:
    """How a :class:`leaseq.Worker` drains: defaults and ranges from ``BOUNDS``.

    ``concurrency`` above 1, or a registry with an ``async def`` handler, runs jobs on an
    event loop (see :mod:`leaseq.slots`); 1 with sync handlers runs them one after the
    other in the calling thread, interrupted by SIGALRM at their budget.
    ``setting_names`` only names the settings in error messages (the Lambda runtime passes
    its environment variables).

    >>> WorkerConfig(owner="worker-1", concurrency=50, poll_idle=0).concurrency
    50
    """

    owner: str
    batch_size: int = BATCH_SIZE.default
    lease_margin: float = LEASE_MARGIN.default
    job_timeout: float = JOB_TIMEOUT.default
    max_lease: float | None = MAX_LEASE.default
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    concurrency: int = CONCURRENCY.default
    record_interval: float = RECORD_INTERVAL.default
    poll_min: float = POLL_MIN.default
    poll_max: float = POLL_MAX.default
    poll_idle: float = POLL_IDLE.default
    worker_timeout: float | None = WORKER_TIMEOUT.default
    loop_stall: float = LOOP_STALL.default
    setting_names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = []
        for key, bounds in BOUNDS.items():
            value = getattr(self, key)
            if value is None and bounds.default is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    bounds.allows(value)):
                problems.append(f"{self.name(key)} must be {bounds.describe()} (got {value!r})")
        if not problems:
            problems = contradictions(
                {**{key: getattr(self, key) for key in BOUNDS},
                 "retry_base": self.retry.base_delay, "retry_max": self.retry.max_delay},
                self.setting_names)
        if problems:
            raise ConfigurationError("invalid worker configuration: " + "; ".join(problems))

    def name(self, key: str) -> str:
        """How the user spelled setting ``key`` (a field name unless told otherwise)."""
        return self.setting_names.get(key, key)
