"""The worker: claim jobs, run them, record their outcomes, until time is short or the
queue has stayed empty for ``poll_idle`` seconds.

One drain per call (the scheduler is the outer loop). Two ways to run jobs, chosen
from the configuration:

* **one at a time** (only sync handlers, and ``concurrency`` 1 or ``sync_concurrency``
  1; the default): claim a batch, run its jobs in this thread, each interrupted by
  SIGALRM at its budget; the batch's outcomes travel with the claim of the next batch
  (one statement per batch);
* **on an event loop** (any ``async def`` handler, or sync handlers allowed more than one
  at a time): up to ``concurrency`` jobs at once, at most ``sync_concurrency`` of them
  sync, each slot refilled by the next claim (:mod:`leaseq.slots`).

Either way an outcome waits at most ``record_interval`` before it is recorded
(:mod:`leaseq.recorder`), outcomes are fenced by lease token (a worker that lost its
lease cannot overwrite what another did: that case is counted, logged and survived),
and every job start is logged at INFO with its id, tenant, kind, attempt and budget.
Each drain returns what it did, a :class:`~leaseq.report.DrainReport`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from leaseq.budget import budget_of, check_registry, fits
from leaseq.client import QueueClient
from leaseq.config import FINISH_RESERVE, WorkerConfig, needed_for
from leaseq.deadline import Deadline, lease_for
from leaseq.execution import run_sync
from leaseq.interrupt import BudgetAlarm, budget_alarm
from leaseq.job_context import JobContext, job_log_fields, running
from leaseq.jobs import ClaimedJob, JobOutcome, JobState
from leaseq.outcomes import Judge
from leaseq.polling import PollSchedule
from leaseq.recorder import JobRecord, JobRun, Recorder
from leaseq.registry import Registration, Registry
from leaseq.report import DrainReport, log_start
from leaseq.report import Stopped as Stopped  # re-exported: it was defined here
from leaseq.slots import drain_on_loop, drain_on_new_loop

logger = logging.getLogger("leaseq.worker")

__all__ = ["FINISH_RESERVE", "ClaimHook", "DrainReport", "JobRecord", "Worker", "WorkerConfig"]

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
    a backlog (:class:`leaseq.pool.ScaleUp`). The next statement of the drain waits for
    it, so it should only hand work on (to a thread of its own). An exception from
    either is logged and the drain goes on.
    """

    def __init__(
        self,
        client: QueueClient,
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
        self._kinds: dict[str, tuple[Registration | None, float, float]] = {}
        self.client = client
        self.registry = registry
        self.config = config
        self.judge = Judge(config.retry, rand)
        self.on_job = on_job
        self.on_claim = on_claim
        self.now = now
        self.timer = timer
        self._sleep = sleep

    @property
    def uses_event_loop(self) -> bool:
        """Whether jobs run on an event loop (see the module docstring)."""
        return self.registry.has_async or self.config.sync_limit > 1

    def recorder(self, report: DrainReport) -> Recorder:
        """The recorder of one drain's outcomes, counting into ``report``."""
        return Recorder(self.client, self.config.owner, report, self.on_job,
                        self.config.record_interval, kinds=self.config.kinds,
                        exclude_kinds=self.config.exclude_kinds)

    def claim(self, recorder: Recorder, limit: int, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to ``limit`` jobs (carrying the outcomes waiting to be recorded), then
        tell ``on_claim``, in this thread. Both drains claim through here."""
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

    # The drain ----------------------------------------------------------------------

    def drain(self, deadline: Deadline) -> DrainReport:
        """Claim, run and record jobs until time is short or the queue stays empty.

        From a thread that runs an event loop, use :meth:`drain_async` instead.
        """
        if self.uses_event_loop:
            return drain_on_new_loop(self, deadline)
        report = DrainReport()
        recorder = self.recorder(report)
        recorder.start()
        try:
            with budget_alarm() as alarm:
                self._drain_in_turn(deadline, report, recorder, alarm)
        finally:
            recorder.stop()
            recorder.record()
        report.time_left = deadline.remaining()
        return report

    async def drain_async(self, deadline: Deadline) -> DrainReport:
        """:meth:`drain` for a caller already running an event loop: always the
        event-loop way (sync handlers in threads), whatever the concurrency."""
        return await drain_on_loop(self, deadline)

    def _drain_in_turn(self, deadline: Deadline, report: DrainReport, recorder: Recorder,
                       alarm: BudgetAlarm) -> None:
        cfg = self.config
        poll = PollSchedule(cfg.poll_min, cfg.poll_max, cfg.poll_idle)
        while True:
            recorder.raise_failure()
            time_left = deadline.remaining()
            lease = lease_for(time_left, margin=cfg.lease_margin, cap=cfg.max_lease)
            if lease is None or not fits(time_left, cfg.job_timeout, cfg):
                report.stopped = "deadline"
                return
            lease_ends_at = time_left - lease.total_seconds()
            jobs = self.claim(recorder, cfg.batch_size, lease)
            if not jobs:
                wait = poll.after_empty()
                report.polls += 1
                if wait is None or not fits(deadline.remaining() - wait, cfg.job_timeout, cfg):
                    report.stopped = "queue_empty"
                    return
                self._sleep(wait)
                continue
            poll.found_work()
            report.batches += 1
            report.claimed += len(jobs)
            if not self._run_batch(jobs, deadline, lease_ends_at, report, recorder, alarm):
                # A job could not be started in the time left: claiming again would
                # only take it and give it back, over and over.
                report.stopped = "deadline"
                return

    def _run_batch(self, jobs: list[ClaimedJob], deadline: Deadline, lease_ends_at: float,
                   report: DrainReport, recorder: Recorder, alarm: BudgetAlarm) -> bool:
        """Run a claimed batch in turn; False when jobs had to be given back.

        Times are in "time left" units, which shrink as time passes: a lease that ends
        at 12.0 ends when the deadline has 12 s left. Without a lease cap all leases end
        at the margin, so the batch's outcomes wait for the claim of the next batch (or
        their record interval); with a cap, outcomes are recorded before a job starts
        whose run could outlast their leases.
        """
        pending_lease_end = 0.0  # the latest lease end among outcomes added since the last record
        unstarted: list[ClaimedJob] = []
        cfg = self.config
        kinds = self._kinds
        level = logger.getEffectiveLevel()  # once per batch: the per-job lines' check
        for position, job in enumerate(jobs):
            # Per kind once per worker: its registration, budget and the time it needs.
            known = kinds.get(job.kind)
            if known is None:
                registration = self.registry.get(job.kind)
                budget = budget_of(registration, cfg)
                needed = needed_for(budget, cfg.lease_margin)
                known = kinds[job.kind] = (registration, budget, needed)
            registration, budget, needed = known
            time_left = deadline.remaining()
            if time_left < needed:  # the budget does not fit (budget.fits)
                unstarted = jobs[position:]
                logger.warning("job given back: its budget does not fit the time left", extra={
                    **job_log_fields(job), "budget": budget, "time_left": round(time_left, 3),
                    "needed": budget + cfg.lease_margin + FINISH_RESERVE})
                break
            recorded_by = time_left - budget - FINISH_RESERVE
            if recorder.waiting and pending_lease_end > recorded_by:
                recorder.record()
                pending_lease_end = 0.0
            lease_end = lease_ends_at
            if lease_end > recorded_by:
                renewed, cancel = self.renew_status(job, deadline)
                if renewed is None:
                    recorder.count(lost_leases=1)
                    recorder.report_job(job, "lease_lost", None)
                    continue
                lease_end = renewed
                if cancel:  # cancelled before it started: it does not run
                    recorder.add(JobRun(self.judge.cancelled(job), 0.0, self.queue_lag(job)))
                    pending_lease_end = max(pending_lease_end, lease_end)
                    continue
            lag = max(0.0, (self.now() - job.available_at).total_seconds())  # queue_lag
            started = self.timer()
            with running(job):
                outcome = self._run_one(job, registration, budget, deadline, alarm, level)
            recorder.add(JobRun(outcome, self.timer() - started, lag))
            pending_lease_end = max(pending_lease_end, lease_end)
        if not unstarted:
            return True
        recorder.record()
        self.give_back(unstarted, recorder, deadline)
        return False

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

    def _run_one(self, job: ClaimedJob, registration: Registration | None, budget: float,
                 deadline: Deadline, alarm: BudgetAlarm, level: int) -> JobOutcome:
        """Run one job's handler in this thread and judge its outcome."""
        if (registration is not None and job.payload_error is None
                and registration.payload_model is None):
            payload = job.payload  # nothing to refuse or validate (Judge.prepare's fast path)
        else:
            prepared = self.judge.prepare(job, registration)
            if prepared.refused is not None:
                return prepared.refused
            payload = prepared.payload
        assert registration is not None
        started = deadline.remaining()

        def renew() -> bool:
            renewed, cancel = self.renew_status(job, deadline)
            if cancel and not context.cancelled:
                logger.info("an operator cancelled the running job; its handler is asked "
                            "to stop", extra=job_log_fields(job))
                context.cancel_requested()
            return renewed is not None

        context = JobContext(
            job,
            _remaining=lambda: max(0.0, budget - (started - deadline.remaining())),
            _renew=renew,
            budget=budget,
        )
        if level <= logging.INFO:
            log_start(job, budget)
        execution = run_sync(registration, payload, context, budget, alarm)
        if level <= logging.DEBUG:
            logger.debug("job handler returned", extra=job_log_fields(job))
        return self.judge.judge(job, registration, execution)

    def renew(self, job: ClaimedJob, deadline: Deadline) -> float | None:
        """Extend ``job``'s lease as far as allowed; its new end (in time-left units),
        or None if the lease was lost."""
        return self.renew_status(job, deadline)[0]

    def renew_status(self, job: ClaimedJob, deadline: Deadline) -> tuple[float | None, bool]:
        """:meth:`renew`, and whether an operator asked to cancel the job: the renewal's
        own answer (app.renew_job_lease_status), no extra round trip."""
        time_left = deadline.remaining()
        lease = lease_for(time_left, margin=self.config.lease_margin, cap=self.config.max_lease)
        if lease is None:
            return None, False
        renewal = self.client.renew_job_lease_status(job, lease)
        if not renewal.renewed:
            return None, False
        return time_left - lease.total_seconds(), renewal.cancel_requested

