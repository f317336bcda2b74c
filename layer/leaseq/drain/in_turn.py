"""The one-at-a-time drain: claim a batch, run its jobs in this thread, one after the
other, each interrupted by SIGALRM at its budget; the batch's outcomes travel with the
claim of the next batch (one statement per batch).

The peer of :mod:`leaseq.drain.slots` (the event-loop drain); both take their steps from
:class:`leaseq.drain.steps.DrainSteps`. Only sync handlers run this way, with ``concurrency``
1 or ``sync_concurrency`` 1 (the default): :class:`leaseq.drain.worker.Worker` picks.
"""

from __future__ import annotations

import logging

from leaseq.base.deadline import Deadline
from leaseq.base.jobs import ClaimedJob, JobOutcome
from leaseq.drain.execution import run_sync
from leaseq.drain.interrupt import BudgetAlarm, budget_alarm
from leaseq.drain.polling import PollSchedule
from leaseq.drain.recorder import JobRun, Recorder
from leaseq.drain.report import DrainReport, log_start
from leaseq.drain.steps import DrainSteps
from leaseq.kinds.job_context import JobContext, job_log_fields, running
from leaseq.kinds.registry import Registration

logger = logging.getLogger("leaseq.worker")

__all__ = ["drain_in_turn"]


def drain_in_turn(steps: DrainSteps, deadline: Deadline) -> DrainReport:
    """One drain, one job at a time in this thread (see the module docstring)."""
    report = DrainReport()
    recorder = steps.recorder(report)
    recorder.start()
    try:
        with budget_alarm() as alarm:
            _drain(steps, deadline, report, recorder, alarm)
    finally:
        recorder.stop()
        recorder.record()
    report.time_left = deadline.remaining()
    return report


def _drain(steps: DrainSteps, deadline: Deadline, report: DrainReport, recorder: Recorder,
           alarm: BudgetAlarm) -> None:
    cfg = steps.config
    poll = PollSchedule(cfg.poll_min, cfg.poll_max, cfg.poll_idle)
    while True:
        recorder.raise_failure()
        time_left = deadline.remaining()
        lease = steps.lease(time_left)
        if lease is None or not steps.can_claim(time_left):
            report.stopped = "deadline"
            return
        lease_ends_at = time_left - lease.total_seconds()
        jobs = steps.claim(recorder, cfg.batch_size, lease)
        if not jobs:
            wait = poll.after_empty()
            report.polls += 1
            if wait is None or not steps.can_claim(deadline.remaining() - wait):
                report.stopped = "queue_empty"
                return
            steps.sleep(wait)
            continue
        poll.found_work()
        report.batches += 1
        report.claimed += len(jobs)
        if not _run_batch(steps, jobs, deadline, lease_ends_at, recorder, alarm):
            # A job could not be started in the time left: claiming again would
            # only take it and give it back, over and over.
            report.stopped = "deadline"
            return


def _run_batch(steps: DrainSteps, jobs: list[ClaimedJob], deadline: Deadline,
               lease_ends_at: float, recorder: Recorder, alarm: BudgetAlarm) -> bool:
    """Run a claimed batch in turn; False when jobs had to be given back.

    Times are in "time left" units, which shrink as time passes: a lease that ends
    at 12.0 ends when the deadline has 12 s left. Without a lease cap all leases end
    at the margin, so the batch's outcomes wait for the claim of the next batch (or
    their record interval); with a cap, outcomes are recorded before a job starts
    whose run could outlast their leases.
    """
    pending_lease_end = 0.0  # the latest lease end among outcomes added since the last record
    unstarted: list[ClaimedJob] = []
    level = logger.getEffectiveLevel()  # once per batch: the per-job lines' check
    for position, job in enumerate(jobs):
        plan = steps.kind(job.kind)
        time_left = deadline.remaining()
        if not steps.fits(job, plan, time_left):
            unstarted = jobs[position:]
            break
        recorded_by = plan.record_by(time_left)
        if recorder.waiting and pending_lease_end > recorded_by:
            recorder.record()
            pending_lease_end = 0.0
        lease_end = lease_ends_at
        if lease_end > recorded_by:
            renewed, cancel = steps.renew_status(job, deadline)
            if renewed is None:
                recorder.count(lost_leases=1)
                recorder.report_job(job, "lease_lost", None)
                continue
            lease_end = renewed
            if cancel:  # cancelled before it started: it does not run
                recorder.add(JobRun(steps.judge.cancelled(job), 0.0, steps.queue_lag(job)))
                pending_lease_end = max(pending_lease_end, lease_end)
                continue
        lag = steps.queue_lag(job)
        started = steps.timer()
        with running(job):
            outcome = _run_one(steps, job, plan.registration, plan.budget, deadline, alarm,
                               level)
        recorder.add(JobRun(outcome, steps.timer() - started, lag))
        pending_lease_end = max(pending_lease_end, lease_end)
    if not unstarted:
        return True
    recorder.record()
    steps.give_back(unstarted, recorder, deadline)
    return False


def _run_one(steps: DrainSteps, job: ClaimedJob, registration: Registration | None,
             budget: float, deadline: Deadline, alarm: BudgetAlarm, level: int) -> JobOutcome:
    """Run one job's handler in this thread and judge its outcome."""
    judge = steps.judge
    if (registration is not None and job.payload_error is None
            and registration.payload_model is None):
        payload = job.payload  # nothing to refuse or validate (Judge.prepare's fast path)
    else:
        prepared = judge.prepare(job, registration)
        if prepared.refused is not None:
            return prepared.refused
        payload = prepared.payload
    assert registration is not None
    started = deadline.remaining()

    def renew() -> bool:
        renewed, cancel = steps.renew_status(job, deadline)
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
    return judge.judge(job, registration, execution)
