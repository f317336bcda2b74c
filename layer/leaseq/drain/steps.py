"""The drain's steps, in the order a drain takes them, shared by both ways of running jobs.

A drain (:meth:`leaseq.drain.worker.Worker.drain`) repeats, until it stops:

1. **claim** (:meth:`DrainSteps.claim`): up to a limit of jobs, leased for the time left
   (:meth:`DrainSteps.lease`), carrying the outcomes waiting to be recorded; ``on_claim``
   is told;
2. **fit** (:meth:`DrainSteps.fits`): a claimed job starts only if its kind's budget
   (:meth:`DrainSteps.kind`) still fits the time left (the one give-back rule,
   :func:`leaseq.drain.config.needed_for`);
3. **run**: its handler, within its budget, and **judge** (:attr:`DrainSteps.judge`) how it
   ended: the outcome;
4. **record** (:meth:`DrainSteps.recorder`): outcomes wait at most ``record_interval`` and
   travel with the next claim, fenced by lease token;
5. **renew** (:meth:`DrainSteps.renew_status`): a lease that would end before its job's
   budget is extended, and the renewal says whether an operator cancelled the job;
6. **give back** (:meth:`DrainSteps.give_back`): claimed jobs that no longer fit are handed
   back unstarted, and the drain stops claiming;
7. **stop**: at the deadline (:meth:`DrainSteps.can_claim` is false) or once the queue has
   stayed empty for ``poll_idle`` seconds.

How the jobs run between those steps is one of two peer strategies below this module:
:mod:`leaseq.drain.in_turn` (one job after the other, in this thread) and :mod:`leaseq.drain.slots`
(up to ``concurrency`` at once, on an event loop). Neither calls back into the worker.

Every time here is "time left": seconds before the deadline (a
:class:`~leaseq.base.deadline.Deadline`), the one form the invocation's time travels in, from
the Lambda context down to the SQL lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from leaseq.base.deadline import Deadline, lease_for
from leaseq.base.jobs import ClaimedJob, JobState
from leaseq.drain.budget import budget_of, fits
from leaseq.drain.config import FINISH_RESERVE, WorkerConfig, needed_for
from leaseq.drain.outcomes import Judge
from leaseq.drain.recorder import JobRecord, Recorder
from leaseq.drain.report import DrainReport
from leaseq.kinds.job_context import job_log_fields
from leaseq.kinds.registry import Registration, Registry
from leaseq.store.duties import WorkerCalls

logger = logging.getLogger("leaseq.worker")

__all__ = ["ClaimHook", "DrainSteps", "KindPlan"]


class ClaimHook(Protocol):
    """What ``Worker(on_claim=...)`` takes: told after every claim of a drain, with the
    jobs claimed (none for a poll of an empty queue) and the limit asked. A scale-up
    policy sees a backlog here (``leaseq_lambda.scaling.FanOut`` is one).

    >>> seen = []
    >>> hook: ClaimHook = lambda claimed, limit: seen.append((len(claimed), limit))
    >>> hook([], 10); seen
    [(0, 10)]
    """

    def __call__(self, claimed: Sequence[ClaimedJob], limit: int, /) -> None: ...


@dataclass(frozen=True, slots=True)
class KindPlan:
    """What a drain knows of one kind, worked out once per worker: its handler (None when
    none is registered: the judge fails such jobs), its budget and the time left a job of
    it needs to start (budget, lease margin and the reserve to record its outcome)."""

    registration: Registration | None
    budget: float
    needed: float

    def record_by(self, time_left: float) -> float:
        """The time left by which the outcome of a job of this kind started now must be
        recorded: after its budget, with the reserve to record it."""
        return time_left - self.budget - FINISH_RESERVE


class DrainSteps:
    """The steps both drains take (see the module docstring), over one client, one
    registry and one config. :class:`leaseq.drain.worker.Worker` holds one and hands it to
    the strategy it picks."""

    def __init__(
        self,
        client: WorkerCalls,
        registry: Registry,
        config: WorkerConfig,
        judge: Judge,
        *,
        on_job: Callable[[JobRecord], None] | None,
        on_claim: ClaimHook | None,
        now: Callable[[], datetime],
        timer: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.client = client
        self.registry = registry
        self.config = config
        self.judge = judge
        self.on_job = on_job
        self.on_claim = on_claim
        self.now = now
        self.timer = timer
        self.sleep = sleep
        self._kinds: dict[str, KindPlan] = {}

    # Claim ----------------------------------------------------------------------------

    def recorder(self, report: DrainReport) -> Recorder:
        """The recorder of one drain's outcomes, counting into ``report``."""
        cfg = self.config
        return Recorder(self.client, cfg.owner, report, self.on_job, cfg.record_interval,
                        kinds=cfg.kinds, exclude_kinds=cfg.exclude_kinds, queue=cfg.queue)

    def can_claim(self, time_left: float) -> bool:
        """Whether a job of the longest budget could still start: the drain stops
        claiming (``deadline``) once it could not."""
        return fits(time_left, self.config.job_timeout, self.config)

    def lease(self, time_left: float) -> timedelta | None:
        """The lease a claim or renewal asks for with ``time_left`` seconds left: up to
        ``lease_margin`` before the deadline, at most ``max_lease``; None when none fits."""
        return lease_for(time_left, margin=self.config.lease_margin, cap=self.config.max_lease)

    def claim(self, recorder: Recorder, limit: int, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to ``limit`` jobs (carrying the outcomes waiting to be recorded), then
        tell ``on_claim``, in this thread."""
        jobs = recorder.record_and_claim(limit, lease)
        hook = self.on_claim
        if hook is not None:
            try:
                hook(jobs, limit)
            except Exception:
                logger.exception("on_claim hook failed; the drain goes on",
                                 extra={"claimed": len(jobs), "limit": limit})
        return jobs

    def queue_lag(self, job: ClaimedJob) -> float:
        """Seconds ``job`` waited between becoming due and being claimed."""
        return max(0.0, (self.now() - job.available_at).total_seconds())

    # Fit ------------------------------------------------------------------------------

    def kind(self, kind: str) -> KindPlan:
        """The registration, budget and time needed of ``kind``, once per worker."""
        plan = self._kinds.get(kind)
        if plan is None:
            registration = self.registry.get(kind)
            budget = budget_of(registration, self.config)
            plan = self._kinds[kind] = KindPlan(registration, budget,
                                                needed_for(budget, self.config.lease_margin))
        return plan

    def fits(self, job: ClaimedJob, plan: KindPlan, time_left: float) -> bool:
        """The give-back rule: whether ``job`` may start with ``time_left`` seconds left.
        When it may not, says so (the job is to be given back)."""
        if time_left >= plan.needed:
            return True
        logger.warning("job given back: its budget does not fit the time left", extra={
            **job_log_fields(job), "budget": plan.budget, "time_left": round(time_left, 3),
            "needed": plan.needed})
        return False

    # Renew ----------------------------------------------------------------------------

    def renew(self, job: ClaimedJob, deadline: Deadline) -> float | None:
        """Extend ``job``'s lease as far as allowed; its new end (in time-left units),
        or None if the lease was lost."""
        return self.renew_status(job, deadline)[0]

    def renew_status(self, job: ClaimedJob, deadline: Deadline) -> tuple[float | None, bool]:
        """:meth:`renew`, and whether an operator asked to cancel the job: the renewal's
        own answer (app.renew_job_lease_status), no extra round trip."""
        time_left = deadline.remaining()
        lease = self.lease(time_left)
        if lease is None:
            return None, False
        renewal = self.client.renew_job_lease_status(job, lease)
        if not renewal.renewed:
            return None, False
        return time_left - lease.total_seconds(), renewal.cancel_requested

    # Give back ------------------------------------------------------------------------

    def give_back(self, jobs: list[ClaimedJob], recorder: Recorder,
                  deadline: Deadline) -> None:
        """Hand back claimed jobs that were never started (their attempt is undone)."""
        given_back = self.client.release_jobs(self.config.owner, jobs)
        recorder.count(given_back=len(given_back), lost_leases=len(jobs) - len(given_back))
        logger.info("gave back jobs that could not start in the time left", extra={
            "given_back": len(given_back), "time_left": round(deadline.remaining(), 3)})
        for job in jobs:
            recorder.report_job(job, "given_back",
                                JobState.PENDING if job.id in given_back else None)
