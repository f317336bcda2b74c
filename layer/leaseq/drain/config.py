"""The worker's configuration: one value, and the one table of its defaults and bounds
(and those of the worker pool's settings).

``WorkerConfig`` (what the library takes) and ``leaseq.settings.WorkerSettings`` (what
the environment gives) read their defaults and bounds from the ``Bounds`` below, and
check the rules that relate two values with :func:`contradictions`, so the two can never
disagree about what is allowed. A contradictory pair (a retry cap below the retry base,
an invocation too short for the job timeout, a worker given both the kinds to claim and
the kinds to leave) is refused with both names in the message; nothing is silently
repaired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leaseq.base import limits
from leaseq.base.errors import ConfigurationError
from leaseq.base.limits import Bounds, queue_name_problem
from leaseq.base.storable import is_blank
from leaseq.kinds.retry import RETRY_BASE as RETRY_BASE
from leaseq.kinds.retry import RETRY_MAX as RETRY_MAX
from leaseq.kinds.retry import RetryPolicy

#: Seconds kept free after a job's budget to record its outcome before the lease ends.
FINISH_RESERVE = 1.0


#: Jobs per claim statement (the SQL contract's claim limit).
BATCH_SIZE = Bounds(10, 1, limits.MAX_CLAIM)
#: Seconds between a lease's end and the invocation's end.
LEASE_MARGIN = Bounds(5.0, 0.5, 600)
#: A kind's budget when it names no timeout of its own.
JOB_TIMEOUT = Bounds(30.0, 0, 86_400, above=True)
#: Longest lease taken at once (None: as long as the invocation allows).
MAX_LEASE = Bounds(None, limits.MIN_LEASE.total_seconds(), limits.MAX_LEASE.total_seconds())
#: Jobs run at once in one invocation.
CONCURRENCY = Bounds(1, 1, 1000)
#: Of those, jobs of sync (``def``) handlers run at once (None: as many as concurrency).
#: Sync handlers hold a thread each and cannot be interrupted there, so a deployment may
#: give async handlers many slots and keep sync ones to one, as they ran before.
SYNC_CONCURRENCY = Bounds(None, 1, 1000)
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
#: Seconds a running handler has to stop by itself once its worker learns that an
#: operator asked to cancel its job (``ctx.cancelled``): past them an ``async def``
#: handler's task is cancelled (0: at once).
CANCEL_GRACE = Bounds(10.0, 0, 600)
#: Retry backoff: the first delay and the cap (RETRY_BASE, RETRY_MAX, imported above) are
#: RetryPolicy's own, in leaseq.kinds.retry.

#: The worker pool (``leaseq.settings.PoolSettings``): most worker invocations at once
#: (0: no pool, no fan-out, no wake: one scheduled worker as before), how long a started
#: invocation polls an empty queue, and how long a reserved place waits for its
#: invocation. The database caps the first and the last by the schema owner's limits
#: (``app.settings``), which these only narrow.
MAX_WORKERS = Bounds(0, 0, 1000)
FANOUT_IDLE = Bounds(10.0, 0, 86_400)
START_HOLD = Bounds(90.0, 1, 900)

POOL_BOUNDS: dict[str, Bounds] = {
    "max_workers": MAX_WORKERS,
    "fanout_idle": FANOUT_IDLE,
    "start_hold": START_HOLD,
}

#: The schema owner's limits of the pool (``app.settings``, the same ranges as its
#: checks; :func:`leaseq.store.client.set_worker_pool_limits`): the maximum (the template's
#: MaxWorkers, 4), how long a reservation or a wake's ticket waits for its invocation
#: (a hold is minutes, never more than 15), and each login's wake debounce.
OWNER_MAX_WORKERS = Bounds(4, 0, 1000)
WAKE_DEBOUNCE = Bounds(1.0, 0, 3600)

OWNER_POOL_BOUNDS: dict[str, Bounds] = {
    "max_workers": OWNER_MAX_WORKERS,
    "start_hold": START_HOLD,
    "wake_debounce": WAKE_DEBOUNCE,
}

BOUNDS: dict[str, Bounds] = {
    "batch_size": BATCH_SIZE,
    "lease_margin": LEASE_MARGIN,
    "job_timeout": JOB_TIMEOUT,
    "max_lease": MAX_LEASE,
    "concurrency": CONCURRENCY,
    "sync_concurrency": SYNC_CONCURRENCY,
    "record_interval": RECORD_INTERVAL,
    "poll_min": POLL_MIN,
    "poll_max": POLL_MAX,
    "poll_idle": POLL_IDLE,
    "worker_timeout": WORKER_TIMEOUT,
    "loop_stall": LOOP_STALL,
    "cancel_grace": CANCEL_GRACE,
}


#: Kinds a worker's kind filter may name (the SQL contract's bound, app.check_kind_filter).
MAX_FILTER_KINDS = 100


def kind_list_problem(kinds: Sequence[str] | None, name: str | None = None) -> str | None:
    """Why ``kinds`` cannot be a worker's kind filter, or None; ``name`` (the setting)
    starts the message when given.

    The SQL contract's rule: 1 to 100 kinds, each a kind that could be enqueued (1 to
    128 characters, not all of them white space or invisible). None means no filter.
    """
    if kinds is None:
        return None
    lead = f"{name} " if name else ""
    if isinstance(kinds, str) or not isinstance(kinds, Sequence):
        return f"{lead}must be a list of job kinds (got {kinds!r})"
    if not 1 <= len(kinds) <= MAX_FILTER_KINDS:
        return (f"{lead}must name 1 to {MAX_FILTER_KINDS} kinds (got {len(kinds)}); leave it "
                "unset for every kind")
    for position, kind in enumerate(kinds, 1):
        if not isinstance(kind, str) or not kind or len(kind) > 128 or is_blank(kind):
            shown = repr(kind) if not isinstance(kind, str) or len(kind) <= 40 else (
                f"{kind[:40]!r}... ({len(kind)} characters)")
            return (f"{name + ': ' if name else ''}kind {position} ({shown}) is not a job "
                    "kind: use 1 to 128 "
                    "characters, at least one of them visible")
    return None


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
    sync, every = values.get("sync_concurrency"), values.get("concurrency")
    if sync is not None and every is not None and sync > every:
        problems.append(f"{name('sync_concurrency')} ({sync}) is more than "
                        f"{name('concurrency')} ({every}): sync handlers run within the "
                        "invocation's concurrency; lower the one or raise the other")
    base, cap = values.get("retry_base"), values.get("retry_max")
    if base is not None and cap is not None and cap < base:
        problems.append(f"{name('retry_max')} ({cap:g}) is less than {name('retry_base')} "
                        f"({base:g}): the retry cap must be at least the first delay")
    if values.get("kinds") is not None and values.get("exclude_kinds") is not None:
        problems.append(f"{name('kinds')} and {name('exclude_kinds')} cannot both be set: a "
                        f"worker claims some kinds only ({name('kinds')}) or every kind but "
                        f"some ({name('exclude_kinds')})")
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
    event loop (see :mod:`leaseq.drain.slots`); 1 with sync handlers runs them one after the
    other in the calling thread, interrupted by SIGALRM at their budget.
    ``sync_concurrency`` bounds the jobs of sync handlers among those (None: all of
    ``concurrency``): a registry of sync handlers only with ``sync_concurrency`` 1 runs
    them one after the other in the calling thread whatever ``concurrency`` says, and a
    mixed registry runs up to ``concurrency`` jobs, at most ``sync_concurrency`` of them
    sync (:attr:`sync_limit`).
    ``kinds`` makes the worker claim jobs of those kinds only, ``exclude_kinds`` jobs of
    every kind but those (not both; None: every kind): a worker of its own for slow kinds,
    with its own timeout and concurrency, and a main worker that leaves them alone. Claims
    with a filter keep their own round robin across tenants (sql/README.md, "Kinds'
    turns"). A worker with ``kinds`` must have a handler for each of them
    (:func:`leaseq.drain.budget.check_registry`).
    ``queue`` is the named queue whose jobs the worker claims (None: every queue that is
    not paused); a paused queue's worker claims nothing until it is resumed.
    ``cancel_grace`` is how long a handler whose job an operator cancelled may go on
    after its worker learns of it (at a lease renewal): it sees ``ctx.cancelled`` at
    once, and an ``async def`` handler's task is cancelled when the grace is over.
    ``setting_names`` only names the settings in error messages (the Lambda runtime passes
    its environment variables).

    >>> WorkerConfig(owner="worker-1", concurrency=50, poll_idle=0).concurrency
    50
    >>> try:
    ...     WorkerConfig(owner="worker-1", poll_min=2, poll_max=1)
    ... except ConfigurationError as exc:
    ...     print(exc.message)
    invalid worker configuration: poll_max (1) is less than poll_min (2): the longest
    wait between polls must be at least the first
    """

    owner: str
    batch_size: int = BATCH_SIZE.default
    lease_margin: float = LEASE_MARGIN.default
    job_timeout: float = JOB_TIMEOUT.default
    max_lease: float | None = MAX_LEASE.default
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    concurrency: int = CONCURRENCY.default
    sync_concurrency: int | None = SYNC_CONCURRENCY.default
    record_interval: float = RECORD_INTERVAL.default
    poll_min: float = POLL_MIN.default
    poll_max: float = POLL_MAX.default
    poll_idle: float = POLL_IDLE.default
    worker_timeout: float | None = WORKER_TIMEOUT.default
    loop_stall: float = LOOP_STALL.default
    cancel_grace: float = CANCEL_GRACE.default
    kinds: tuple[str, ...] | None = None
    exclude_kinds: tuple[str, ...] | None = None
    queue: str | None = None
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
        for key in ("kinds", "exclude_kinds"):
            problem = kind_list_problem(getattr(self, key), self.name(key))
            if problem is None and getattr(self, key) is not None:
                object.__setattr__(self, key, tuple(getattr(self, key)))  # a list given
            problems += [problem] if problem else []
        if self.queue is not None and queue_name_problem(self.queue) is not None:
            problems.append(f"{self.name('queue')} {queue_name_problem(self.queue)}")
        if not problems:
            problems = contradictions(
                {**{key: getattr(self, key) for key in BOUNDS},
                 "retry_base": self.retry.base_delay, "retry_max": self.retry.max_delay,
                 "kinds": self.kinds, "exclude_kinds": self.exclude_kinds},
                self.setting_names)
        if problems:
            raise ConfigurationError("invalid worker configuration: " + "; ".join(problems))

    @property
    def sync_limit(self) -> int:
        """Jobs of sync handlers that may run at once: ``sync_concurrency``, or all of
        ``concurrency`` when it is not set."""
        return self.concurrency if self.sync_concurrency is None else self.sync_concurrency

    def name(self, key: str) -> str:
        """How the user spelled setting ``key`` (a field name unless told otherwise)."""
        return self.setting_names.get(key, key)

    def claims(self, kind: str) -> bool:
        """Whether this worker's claims take jobs of ``kind`` (its kind filter)."""
        if self.kinds is not None:
            return kind in self.kinds
        return self.exclude_kinds is None or kind not in self.exclude_kinds
