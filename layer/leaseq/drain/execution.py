"""Running a handler once, within its budget: what it returned, raised, or that it overran.

Three ways to run, one result type (:class:`Execution`):

* :func:`run_sync`: a sync handler in the calling thread, interrupted by the SIGALRM
  :class:`~leaseq.drain.interrupt.BudgetAlarm` at its budget (the one-at-a-time worker);
* :meth:`Attempt.start` with an ``async def`` handler: a task on the worker's event loop,
  cancelled at its budget;
* :meth:`Attempt.start` with a sync handler on the event-loop worker: a thread of its
  own, abandoned at its budget (a thread cannot be interrupted). The outcome is
  ``JOB_TIMEOUT`` from that instant; whatever the thread returns later is discarded.

Execution does not judge: :mod:`leaseq.drain.outcomes` turns an Execution into the outcome
that is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from leaseq.drain.interrupt import BudgetAlarm
from leaseq.kinds.job_context import JobContext, running
from leaseq.kinds.registry import Registration
from leaseq.kinds.signals import JobTimeout

#: How an overrun was stopped, for the log line and the error message.
STOPPED_BY = {"alarm": "interrupted", "cancel": "cancelled", "thread": "abandoned",
              "cancel_request": "cancelled at an operator's request"}


class Execution(NamedTuple):
    """How one run of a handler ended: a value, an exception, or past its budget.

    A named tuple rather than a frozen dataclass: one is built per job, and a tuple is
    built in a third of the time.
    """

    budget: float
    value: Any = None
    error: Exception | None = None
    overran: bool = False
    #: How an overrun was stopped: ``alarm``, ``cancel`` or ``thread`` (see STOPPED_BY);
    #: ``cancel_request`` for a task cancelled after an operator cancelled its job.
    stopped_by: str = "alarm"


def run_sync(registration: Registration, payload: Any, context: JobContext, budget: float,
             alarm: BudgetAlarm) -> Execution:
    """Run a sync handler in this thread under ``alarm``; exceptions become results,
    except BaseExceptions other than :class:`JobTimeout` (KeyboardInterrupt...)."""
    try:
        value = alarm.call(lambda: registration.handler(payload, context), budget)
    except JobTimeout:
        return Execution(budget, overran=True,
                         stopped_by="alarm" if alarm.uses_signal else "thread")
    except Exception as exc:
        return Execution(budget, error=exc)
    return Execution(budget, value=value)


class Attempt:
    """One run of a handler on the worker's event loop, as a task or a thread.

    :meth:`within` waits for the run until its budget; past it the run is stopped (task
    cancelled, thread abandoned) and an overrun is returned at once, so its outcome is
    recorded on time. The run keeps its slot until it has really ended:
    :meth:`settled` waits for that.
    """

    def __init__(self, future: asyncio.Future[Any], context: JobContext) -> None:
        self._future = future
        self._context = context
        self.thread: threading.Thread | None = None
        self._ended: asyncio.Future[None] | None = None
        self._returned = False

    @classmethod
    def start(cls, registration: Registration, payload: Any, context: JobContext,
              loop: asyncio.AbstractEventLoop) -> Attempt:
        job = context.job
        if registration.is_async:
            async def call() -> Any:
                with running(job):
                    return await registration.handler(payload, context)

            return cls(loop.create_task(call(), name=f"leaseq-job-{job.id}"), context)
        attempt = cls(loop.create_future(), context)
        attempt._ended = loop.create_future()
        # One daemon thread per run rather than a ThreadPoolExecutor: the executor's
        # threads are joined when the interpreter exits, so one handler that never
        # returns would hang the process's exit. The number of these threads is bounded
        # by the worker's slots: a run holds its slot until its thread ends.
        attempt.thread = threading.Thread(
            target=attempt._run_in_thread, args=(registration.handler, payload, loop),
            name=f"leaseq-job-{job.id}", daemon=True)
        attempt.thread.start()
        return attempt

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The handler's task (async handlers), which the loop watchdog looks for."""
        return self._future if isinstance(self._future, asyncio.Task) else None

    async def within(self, budget: float) -> Execution:
        await _first_of(self._future, budget)
        if not self._future.done():
            self._context.request_stop("budget")
            self._future.cancel()  # for a thread: only stops waiting for it
            return Execution(budget, overran=True,
                             stopped_by="thread" if self.thread is not None else "cancel")
        try:
            return Execution(budget, value=self._future.result())
        except asyncio.CancelledError:
            # Cancelled by the worker (a lost lease, an operator's cancel once its grace
            # was over) or by the handler itself: no result.
            return Execution(budget, overran=True, stopped_by=(
                "cancel_request" if self._context.cancelled else "cancel"))
        except Exception as exc:
            return Execution(budget, error=exc)

    async def settled(self) -> bool:
        """After an overrun: wait until the run has ended; whether it still returned a
        value (discarded: its outcome was recorded at the budget)."""
        if self._ended is not None:
            await self._ended
            return self._returned
        try:
            await self._future
        except BaseException:  # cancelled, as asked, or failed on the way out
            return False
        return True

    def _run_in_thread(self, handler: Callable[[Any, JobContext], Any], payload: Any,
                       loop: asyncio.AbstractEventLoop) -> None:
        error: BaseException | None = None
        value: Any = None
        try:
            with running(self._context.job):
                value = handler(payload, self._context)
        except BaseException as exc:  # handed to the loop below
            error = exc
        self._returned = error is None

        def hand_over() -> None:
            if not self._future.done():  # else abandoned at its budget
                if error is not None:
                    self._future.set_exception(error)
                else:
                    self._future.set_result(value)
            if self._ended is not None and not self._ended.done():
                self._ended.set_result(None)

        # RuntimeError: the drain ended and its loop is closed; nobody waits for this.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(hand_over)


async def _first_of(future: asyncio.Future[Any], seconds: float) -> None:
    """Wait until ``future`` is done or ``seconds`` pass, without consuming it: what
    ``asyncio.wait({future}, timeout=seconds)`` does, minus its per-call set building
    and checks (one of these runs per job)."""
    if future.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(*_: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(seconds, wake)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)
