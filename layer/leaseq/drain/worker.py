"""The worker: claim jobs, run them, record their outcomes, until time is short or the
queue has stayed empty for ``poll_idle`` seconds.

One drain per call (the scheduler is the outer loop). Two ways to run jobs, chosen
from the configuration:

* **one at a time** (only sync handlers, and ``concurrency`` 1 or ``sync_concurrency``
  1; the default): claim a batch, run its jobs in this thread, each interrupted by
  SIGALRM at its budget; the batch's outcomes travel with the claim of the next batch
  (one statement per batch; :mod:`leaseq.drain.in_turn`);
* **on an event loop** (any ``async def`` handler, or sync handlers allowed more than one
  at a time): up to ``concurrency`` jobs at once, at most ``sync_concurrency`` of them
  sync, each slot refilled by the next claim (:mod:`leaseq.drain.slots`).

The steps both ways take (claim, fit, renew, give back, and the per-kind budget) are
:class:`leaseq.drain.steps.DrainSteps`, in the order a drain takes them; the one-at-a-time
drain is :mod:`leaseq.drain.in_turn`. The worker only picks one of the two.

Either way an outcome waits at most ``record_interval`` before it is recorded
(:mod:`leaseq.drain.recorder`), outcomes are fenced by lease token (a worker that lost its
lease cannot overwrite what another did: that case is counted, logged and survived),
and every job start is logged at INFO with its id, tenant, kind, attempt and budget.
Each drain returns what it did, a :class:`~leaseq.drain.report.DrainReport`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from leaseq.base.deadline import Deadline
from leaseq.drain.budget import check_registry
from leaseq.drain.config import FINISH_RESERVE, WorkerConfig
from leaseq.drain.in_turn import drain_in_turn
from leaseq.drain.outcomes import Judge
from leaseq.drain.recorder import JobRecord
from leaseq.drain.report import DrainReport
from leaseq.drain.report import Stopped as Stopped  # re-exported: it was defined here
from leaseq.drain.slots import drain_on_loop, drain_on_new_loop
from leaseq.drain.steps import ClaimHook, DrainSteps
from leaseq.kinds.registry import Registry
from leaseq.store.duties import WorkerCalls

__all__ = ["FINISH_RESERVE", "ClaimHook", "DrainReport", "JobRecord", "Worker", "WorkerConfig"]

class Worker:
    """Drains the queue with one client and one registry.

    ``owner`` (in the config) names this worker in every lease it takes, so give each
    concurrent worker its own. A drain is one pass of the scheduler's loop: call
    :meth:`drain` again on the next tick (the Lambda worker function does).

    >>> from uuid import uuid4
    >>> from leaseq import (EnqueueRequest, MonotonicDeadline, QueueClient, Registry,
    ...                     WorkerConfig, connect)
    >>> client = QueueClient(lambda: connect(dsn))  # dsn: the database's URL
    >>> registry = Registry()
    >>> _ = registry.register("send_receipt", lambda payload, ctx: None)
    >>> _ = client.enqueue_jobs([EnqueueRequest(tenant_id=uuid4(), operation_key=f"k-{n}",
    ...                                         kind="send_receipt") for n in range(3)])
    >>> worker = Worker(client, registry, WorkerConfig(owner="worker-1", concurrency=50,
    ...                                                poll_idle=0))
    >>> report = worker.drain(MonotonicDeadline(60))
    >>> report.succeeded, report.stopped
    (3, 'queue_empty')

    ``on_job`` is told each job's record once its outcome is recorded. ``on_claim`` is
    told every claim, with the jobs claimed (none for a poll of an empty queue) and the
    limit asked, in the thread that made the claim (the drain's own, or the event
    loop's database thread), before the jobs start: what a scale-up policy needs to see
    a backlog (:class:`leaseq.base.pool.ScaleUp`). The next statement of the drain waits for
    it, so it should only hand work on (to a thread of its own). An exception from
    either is logged and the drain goes on.
    """

    def __init__(
        self,
        client: WorkerCalls,
        registry: Registry,
        config: WorkerConfig,
        *,
        on_job: Callable[[JobRecord], None] | None = None,
        on_claim: ClaimHook | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        rand: Callable[[], float] = random.random,
        timer: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        check_registry(registry, config)
        self.client = client
        self.registry = registry
        self.config = config
        #: The drain's steps, shared by both ways of running jobs (:mod:`leaseq.drain.steps`).
        self.steps = DrainSteps(client, registry, config, Judge(config.retry, rand),
                                on_job=on_job, on_claim=on_claim, now=now, timer=timer,
                                sleep=sleep)

    @property
    def uses_event_loop(self) -> bool:
        """Whether jobs run on an event loop (see the module docstring)."""
        return self.registry.has_async or self.config.sync_limit > 1

    def drain(self, deadline: Deadline) -> DrainReport:
        """Claim, run and record jobs until time is short or the queue stays empty.

        From a thread that runs an event loop, use :meth:`drain_async` instead.
        """
        if self.uses_event_loop:
            return drain_on_new_loop(self.steps, deadline)
        return drain_in_turn(self.steps, deadline)

    async def drain_async(self, deadline: Deadline) -> DrainReport:
        """:meth:`drain` for a caller already running an event loop: always the
        event-loop way (sync handlers in threads), whatever the concurrency."""
        return await drain_on_loop(self.steps, deadline)
