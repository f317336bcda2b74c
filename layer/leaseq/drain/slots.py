"""The event-loop drain: up to ``concurrency`` jobs at once, each slot refilled by the
next claim.

A worker with ``concurrency`` N keeps N slots, and up to ``batch_size`` (at most N)
claimed jobs waiting for one, so that a slot freed by a finished job is refilled at once
while the next claim is under way. A claim goes out when there is room for
``min(batch_size, N / 2)`` jobs (or for fewer, once that room has waited ``poll_min``
seconds), takes as many jobs as there is room for (up to the SQL contract's 100), and
carries every outcome waiting to be recorded (``app.finish_and_claim_jobs``: one round
trip). When the slots turn over faster than claims come back, each claim takes more jobs.
A slow job holds only its own slot; the others keep turning over.

Every job runs in a slot of its own, with its own budget: an ``async def`` handler as a
task, cancelled at its budget; a sync handler in a thread, abandoned at its budget (see
:mod:`leaseq.drain.execution`). Either way its outcome (``JOB_TIMEOUT``) is recorded at once,
and the slot stays taken until the handler has really ended: a thread that never
returns keeps its slot, in later drains of the process too.

Leases are sized to the invocation's time left (``lease_for``) and renewed, without the
handler's help, when a capped lease (``max_lease``) would end before the job's budget.
A renewal also says whether an operator cancelled the job: its handler then sees
``ctx.cancelled``, and an ``async def`` handler's task is cancelled ``cancel_grace``
seconds later.
The steps it shares with the one-at-a-time drain (:mod:`leaseq.drain.in_turn`), claim, fit,
renew and give back, are :class:`leaseq.drain.steps.DrainSteps`'s; nothing here calls back
into the worker.
All database calls of the loop run in one thread of their own, so the loop never waits
for the network, and a stalled loop can only be a handler's doing (:mod:`leaseq.drain.watchdog`).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from leaseq.base.deadline import Deadline
from leaseq.base.errors import LeaseqError
from leaseq.base.jobs import ClaimedJob, JobOutcome
from leaseq.base.limits import MAX_CLAIM
from leaseq.drain.config import FINISH_RESERVE
from leaseq.drain.execution import Attempt
from leaseq.drain.polling import PollSchedule
from leaseq.drain.recorder import JobRun, Recorder
from leaseq.drain.report import DrainReport, Stopped, log_start
from leaseq.drain.steps import DrainSteps
from leaseq.drain.watchdog import LoopWatchdog
from leaseq.kinds.job_context import JobContext, job_log_fields
from leaseq.kinds.registry import Registration

logger = logging.getLogger("leaseq.worker")
T = TypeVar("T")


#: Handler threads of this process that overran their budget and still run: each keeps
#: its slot until it returns, in whichever drain it started (Lambda reuses the process).
_straggling_threads: set[threading.Thread] = set()


def straggling_threads() -> int:
    """Handler threads of this process still running past their budget."""
    for thread in [t for t in _straggling_threads if not t.is_alive()]:
        _straggling_threads.discard(thread)
    return len(_straggling_threads)


def drain_on_new_loop(steps: DrainSteps, deadline: Deadline) -> DrainReport:
    """Run :func:`drain_on_loop` on an event loop of its own, then close that loop.

    Not ``asyncio.run``: when it ends it waits for every task it cancels, so one
    handler that ignores its cancellation would keep the invocation from returning.
    Here such a task gets one reserve second after the drain, then is left behind.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise LeaseqError("Worker.drain() was called in a thread that runs an event loop; "
                          "use `await worker.drain_async(deadline)` there")
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(drain_on_loop(steps, deadline))
    finally:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=FINISH_RESERVE))
            ignored = sum(not task.done() for task in left)
            if ignored:
                logger.warning("handlers ignored their cancellation and were left behind",
                               extra={"tasks": ignored})
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def drain_on_loop(steps: DrainSteps, deadline: Deadline) -> DrainReport:
    """The event-loop drain, on the running loop (see the module docstring)."""
    report = DrainReport(concurrency=steps.config.concurrency)
    recorder = steps.recorder(report)
    recorder.start()
    try:
        await SlotDrain(steps, deadline, report, recorder).run()
    finally:
        recorder.stop()
        recorder.record()
    report.time_left = deadline.remaining()
    return report


@dataclass(eq=False)
class Slot:
    """One job in flight. Lease ends and ``needs_until`` are in time-left units (seconds
    before the deadline): its outcome must be recorded by ``needs_until``."""

    job: ClaimedJob
    registration: Registration | None
    budget: float
    lease_end: float
    lease_seconds: float
    needs_until: float
    attempt: Attempt | None = None
    context: JobContext | None = None
    lost: bool = False
    #: Its outcome is recorded; it only waits for its handler to end.
    overran: bool = False
    renewing: bool = False
    #: A renewal said an operator cancelled the job.
    cancel_seen: bool = False

    @property
    def lease_too_short(self) -> bool:
        return self.lease_end > self.needs_until


class SlotDrain:
    """One drain on the event loop: claims, slots, renewals (see the module docstring)."""

    def __init__(self, steps: DrainSteps, deadline: Deadline, report: DrainReport,
                 recorder: Recorder) -> None:
        self.steps = steps
        self.config = steps.config
        self.deadline = deadline
        self.report = report
        self.recorder = recorder
        self.loop = asyncio.get_running_loop()
        self._db = ThreadPoolExecutor(1, thread_name_prefix="leaseq-db")
        self._slots: dict[asyncio.Task[None], Slot] = {}
        self._renewals: set[asyncio.Task[bool]] = set()
        self._poll = PollSchedule(self.config.poll_min, self.config.poll_max,
                                  self.config.poll_idle)
        self._claiming = True
        self._next_claim = 0.0
        self._claim_task: asyncio.Task[None] | None = None
        self._waker: asyncio.Future[None] | None = None
        self._emptied = False
        self._woken = False
        self._sync_deferred = False
        #: Claimed jobs waiting for a slot: (job, lease end, lease seconds).
        self._waiting: collections.deque[tuple[ClaimedJob, float, float]] = collections.deque()

    async def _db_call(self, func: Callable[..., T], *args: Any) -> T:
        return await self.loop.run_in_executor(self._db, functools.partial(func, *args))

    def _stop_claiming(self, why: Stopped) -> None:
        if self._claiming:
            self._claiming = False
            self.report.stopped = why

    def handler_tasks(self) -> dict[asyncio.Task[Any], ClaimedJob]:
        """The tasks of the async handlers running now, and their jobs."""
        tasks = {}
        for slot in list(self._slots.values()):
            task = slot.attempt.task if slot.attempt is not None else None
            if task is not None and not task.done():
                tasks[task] = slot.job
        return tasks

    async def run(self) -> None:
        watchdog = LoopWatchdog(self.loop, self.config.loop_stall, self.handler_tasks,
                                lambda: self.recorder.count(loop_stalls=1))
        watchdog.start()
        try:
            await self._run()
        except BaseException:
            for slot in self._slots.values():
                if slot.context is not None:
                    slot.context.request_stop("invocation_ending")
            raise
        finally:
            if self._claim_task is not None:
                self._claim_task.cancel()
            await watchdog.stop()
            self._db.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        cfg = self.config
        # Sync handlers only: their own limit is the drain's (leaseq.drain.config.SYNC_CONCURRENCY).
        slots = cfg.concurrency if self.steps.registry.has_async else cfg.sync_limit
        capacity = slots - straggling_threads()
        if capacity <= 0:
            logger.error("every slot is held by a handler thread that overran its budget; "
                         "no job can start until one returns",
                         extra={"concurrency": cfg.concurrency})
            self.report.stopped = "no_free_slot"
            return
        # Up to this many claimed jobs wait for a slot, so that a slot freed by a finished
        # job is refilled at once, while the claim that tops the buffer up is under way.
        spare = min(cfg.batch_size, capacity)
        threshold = max(1, min(cfg.batch_size, capacity // 2))
        short_since: float | None = None
        straggle_until: float | None = None
        self._next_claim = self.loop.time()
        while True:
            self.recorder.raise_failure()
            self._collect()
            if self._claim_task is not None and self._claim_task.done():
                task, self._claim_task = self._claim_task, None
                task.result()
            await self._fill(capacity)
            now = self.loop.time()
            if self._claiming and not self.steps.can_claim(self.deadline.remaining()):
                self._stop_claiming("deadline")
            room = capacity + spare - len(self._slots) - len(self._waiting)
            timeouts: list[float] = []
            if self._claiming and self._claim_task is None and room > 0:
                short_since = now if short_since is None else short_since
                claim_at = self._next_claim
                if room < threshold and (self._slots or self._waiting):
                    claim_at = max(claim_at, short_since + cfg.poll_min)
                elif self._emptied and not self._slots and not self._waiting:
                    claim_at = now  # the jobs of the claim that emptied the queue are done
                if now >= claim_at:
                    # As many as there is room for: when claims cannot keep up with the
                    # slots, each takes more jobs per round trip.
                    self._claim_task = self._watch(
                        self.loop.create_task(self._claim(min(room, MAX_CLAIM))))
                    short_since = None
                    continue
                timeouts.append(claim_at - now)
            if not self._claiming and self._claim_task is None and not self._waiting:
                if not self._slots:
                    return
                if all(slot.overran for slot in self._slots.values()):
                    # Only handlers past their budget are left, their outcomes recorded.
                    straggle_until = straggle_until or now + FINISH_RESERVE
                    if now >= straggle_until:
                        logger.warning("drain ends with handlers still running past their "
                                       "budget", extra={"jobs": [str(s.job.id) for s in
                                                                 self._slots.values()]})
                        return
                    timeouts.append(straggle_until - now)
            renewal = self._renew_due()
            if renewal is not None:
                timeouts.append(renewal)
            if self._sync_deferred:
                timeouts.append(cfg.poll_max)
            await self._wait(max(0.0, min(timeouts)) if timeouts else None)

    def _collect(self) -> None:
        """Forget slots whose handler has ended; a failure of the slot's own code (not
        the handler's: that is an outcome) ends the drain."""
        for task in [t for t in self._slots if t.done()]:
            del self._slots[task]
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    def _wake(self, *_: Any) -> None:
        """Something the loop waits for happened (a slot, claim or renewal ended)."""
        self._woken = True
        waker = self._waker
        if waker is not None and not waker.done():
            waker.set_result(None)

    def _watch(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        task.add_done_callback(self._wake)
        return task

    async def _wait(self, timeout: float | None) -> None:
        """Until something ends or ``timeout`` passes. One future per wait, woken by
        done-callbacks, rather than asyncio.wait over every slot: that would add and
        remove a callback on each of them on every turn of the loop."""
        self._renewals = {task for task in self._renewals if not task.done()}
        if self._woken:
            self._woken = False
            return
        self._waker = self.loop.create_future()
        timer = None if timeout is None else self.loop.call_later(timeout, self._wake)
        try:
            await self._waker
        finally:
            self._waker = None
            self._woken = False
            if timer is not None:
                timer.cancel()

    # Claims ---------------------------------------------------------------------

    async def _claim(self, limit: int) -> None:
        """One claim (with the outcomes waiting to be recorded); its jobs wait for slots."""
        cfg = self.config
        time_left = self.deadline.remaining()
        lease = self.steps.lease(time_left)
        assert lease is not None  # the time left fits a job, so it fits a lease
        # In the database thread: the worker's on_claim hook is told there, too.
        jobs = await self._db_call(self.steps.claim, self.recorder, limit, lease)
        now = self.loop.time()
        if not jobs:
            busy = bool(self._slots or self._waiting)
            self._emptied = busy  # look again once the running jobs are done
            self.report.polls += 1
            wait = self._poll.after_empty(busy=busy)
            if wait is None or not self.steps.can_claim(self.deadline.remaining() - wait):
                self._stop_claiming("queue_empty")
            else:
                self._next_claim = now + wait
            return
        self._poll.found_work()
        self.report.batches += 1
        self.report.claimed += len(jobs)
        # A claim that found fewer jobs than asked emptied the queue for now: look again
        # after poll_min, or as soon as its jobs are done.
        self._emptied = len(jobs) < limit
        self._next_claim = now + cfg.poll_min if self._emptied else now
        lease_seconds = lease.total_seconds()
        self._waiting.extend((job, time_left - lease_seconds, lease_seconds) for job in jobs)

    async def _fill(self, capacity: int) -> None:
        """Start waiting jobs in the free slots; give back those whose budget no longer
        fits the time left."""
        cfg = self.config
        unfit = []
        # Jobs of sync handlers beyond sync_limit wait, in order, for a sync one to end;
        # the jobs behind them may start meanwhile (threads past their budget count).
        deferred: list[tuple[ClaimedJob, float, float]] = []
        sync_busy = straggling_threads() + sum(
            1 for slot in self._slots.values()
            if slot.registration is not None and not slot.registration.is_async
            and not slot.overran)
        while self._waiting and len(self._slots) < capacity:
            job, lease_end, lease_seconds = self._waiting.popleft()
            plan = self.steps.kind(job.kind)
            registration = plan.registration
            time_left = self.deadline.remaining()
            if not self.steps.fits(job, plan, time_left):
                unfit.append(job)
                continue
            is_sync = registration is not None and not registration.is_async
            if is_sync and sync_busy >= cfg.sync_limit:
                deferred.append((job, lease_end, lease_seconds))
                continue
            slot = Slot(job, registration, plan.budget, lease_end, lease_seconds,
                        needs_until=plan.record_by(time_left))
            self._slots[self._watch(self.loop.create_task(self._run_slot(slot)))] = slot
            sync_busy += is_sync
        self._waiting.extendleft(reversed(deferred))
        # Looked at again every poll_max: a sync slot held by a thread past its budget may
        # never free, and a deferred job is given back once its budget no longer fits.
        self._sync_deferred = bool(deferred)
        if unfit:
            # Claiming again could only take the same jobs and give them back.
            self._stop_claiming("deadline")
            await self._db_call(self.steps.give_back, unfit, self.recorder, self.deadline)

    # One slot -------------------------------------------------------------------

    async def _run_slot(self, slot: Slot) -> None:
        steps, job = self.steps, slot.job
        lag = steps.queue_lag(job)
        started = steps.timer()
        prepared = steps.judge.prepare(job, slot.registration)
        if prepared.refused is not None:
            self._add(slot, prepared.refused, steps.timer() - started, lag)
            return
        assert slot.registration is not None
        if slot.lease_too_short and not await self._renew(slot):
            self.recorder.report_job(job, "lease_lost", None)
            return
        if slot.cancel_seen:  # cancelled before it started: it does not run
            self._add(slot, steps.judge.cancelled(job), steps.timer() - started, lag)
            return
        begun = time.monotonic()
        budget = slot.budget
        context = JobContext(
            job,
            _remaining=lambda: max(0.0, budget - (time.monotonic() - begun)),
            _renew=lambda: self._renew_in_thread(slot),
            _renew_async=lambda: self._renew(slot),
            budget=budget,
            _stop_async=asyncio.Event(),
        )
        slot.context = context
        log_start(job, budget)
        attempt = Attempt.start(slot.registration, prepared.payload, context, self.loop)
        slot.attempt = attempt
        execution = await attempt.within(budget)
        if slot.lost:
            self.recorder.report_job(job, "lease_lost", None)
        else:
            outcome = steps.judge.judge(job, slot.registration, execution)
            self._add(slot, outcome, steps.timer() - started, lag)
        if not execution.overran:
            return
        slot.overran = True
        if attempt.thread is not None:
            _straggling_threads.add(attempt.thread)
        late = await attempt.settled()
        if attempt.thread is not None:
            _straggling_threads.discard(attempt.thread)
        if late:
            self.recorder.count(late_returns=1)
            logger.warning("handler returned after its budget; its result was discarded "
                           "(the job was recorded as JOB_TIMEOUT)", extra=job_log_fields(job))

    def _add(self, slot: Slot, outcome: JobOutcome, duration: float, lag: float) -> None:
        """Hold the outcome for recording, due before the job's lease ends."""
        lease_left = self.deadline.remaining() - slot.lease_end
        due = time.monotonic() + max(0.0, lease_left - FINISH_RESERVE / 2)
        self.recorder.add(JobRun(outcome, duration, lag), due=due)

    # Leases ---------------------------------------------------------------------

    def _renew_due(self) -> float | None:
        """Start the renewals that are due; seconds until the next one, if any."""
        next_in: float | None = None
        time_left = self.deadline.remaining()
        for slot in self._slots.values():
            if slot.overran or slot.lost or slot.renewing:
                continue
            if not slot.lease_too_short:
                continue
            # Renew at half the lease: time left for one failed try before it ends.
            in_seconds = (time_left - slot.lease_end) - slot.lease_seconds / 2
            if in_seconds <= 0:
                slot.renewing = True
                # Awaited by _wait too: the next renewal is planned once this one ends.
                self._renewals.add(self._watch(self.loop.create_task(self._renew(slot))))
            elif next_in is None or in_seconds < next_in:
                next_in = in_seconds
        return next_in

    async def _renew(self, slot: Slot) -> bool:
        slot.renewing = True
        try:
            renewed, cancel = await self._db_call(self.steps.renew_status, slot.job,
                                                  self.deadline)
        finally:
            slot.renewing = False
        return self._renewed(slot, renewed, cancel)

    def _renew_in_thread(self, slot: Slot) -> bool:
        """ctx.renew_lease() from a handler's own thread (the client is thread-safe)."""
        renewed, cancel = self.steps.renew_status(slot.job, self.deadline)
        if renewed is None or cancel:
            self.loop.call_soon_threadsafe(self._renewed, slot, renewed, cancel)
            if cancel and slot.context is not None:
                # Seen by the handler as soon as its renewal returns, in its own thread.
                slot.context._cancelled = True
        if renewed is None:
            return False
        slot.lease_end = renewed
        return True

    def _renewed(self, slot: Slot, renewed: float | None, cancel: bool = False) -> bool:
        if renewed is not None:
            slot.lease_end = renewed
            if cancel:
                self._cancel_seen(slot)
            return True
        if not slot.lost:
            slot.lost = True
            self.recorder.count(lost_leases=1)
            logger.warning("lease lost while the job ran; its handler is asked to stop and "
                           "its outcome will not be recorded", extra=job_log_fields(slot.job))
            if slot.context is not None:
                slot.context.request_stop("lease_lost")
            task = slot.attempt.task if slot.attempt is not None else None
            if task is not None:
                task.cancel()
        return False

    def _cancel_seen(self, slot: Slot) -> None:
        """An operator cancelled the slot's job: tell its handler (``ctx.cancelled``), and
        cancel an ``async def`` handler's task once ``cancel_grace`` has passed. A sync
        handler's thread cannot be interrupted: it may look at ``ctx.cancelled``."""
        if slot.cancel_seen:
            return
        slot.cancel_seen = True
        grace = self.config.cancel_grace
        logger.info("an operator cancelled the running job; its handler is asked to stop",
                    extra={**job_log_fields(slot.job), "grace": grace})
        if slot.context is not None:
            slot.context.cancel_requested()
        task = slot.attempt.task if slot.attempt is not None else None
        if task is not None and not task.done():
            self.loop.call_later(grace, task.cancel)
