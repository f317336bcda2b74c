"""Stop a sync handler whose budget is spent (the one-at-a-time path of the worker).

In the main thread (a Lambda handler, the CLI) a real-time interval timer raises
``JobTimeout`` inside the handler, which interrupts pure Python code and blocking
system calls alike. Elsewhere the handler runs in a daemon thread that is abandoned
at the deadline: the job is still failed as retryable on time, but the abandoned
code may finish later, which at-least-once execution already allows.
"""

from __future__ import annotations

import contextvars
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

from leaseq.kinds.signals import JobTimeout

T = TypeVar("T")


def _raise_timeout(signum: int, frame: FrameType | None) -> None:
    raise JobTimeout("the job's time budget is spent")


def _can_use_alarm() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


class BudgetAlarm:
    """Runs sync handlers under their budget for the length of one drain.

    Got from :func:`budget_alarm`. Where the alarm handler is installed for the scope, each
    job only arms and disarms the timer: per job, that is two system calls and no
    signal-handler bookkeeping, which used to cost as much client CPU as recording
    the job's outcome. Elsewhere each job runs in an abandonable thread.
    """

    def __init__(self, alarm: bool) -> None:
        self._alarm = alarm

    @property
    def uses_signal(self) -> bool:
        """True when overruns are interrupted by SIGALRM (else abandoned in a thread)."""
        return self._alarm

    def call(self, func: Callable[[], T], seconds: float) -> T:
        """Run ``func``; raise :class:`JobTimeout` if it runs longer than ``seconds``."""
        if seconds <= 0:
            raise JobTimeout("no time budget left for the job")
        if not self._alarm:
            return _call_in_thread(func, seconds)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return func()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def budget_alarm() -> Iterator[BudgetAlarm]:
    """Install the alarm handler once for a whole drain, when this thread may use it.

    A handler that replaces the SIGALRM handler or arms ITIMER_REAL itself inside
    the scope takes over the timer, and its own job can then overrun its budget.
    """
    if not _can_use_alarm():
        yield BudgetAlarm(alarm=False)
        return
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    try:
        yield BudgetAlarm(alarm=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _call_in_thread(func: Callable[[], T], seconds: float) -> T:
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()  # the handler keeps seeing which job it runs

    def target() -> None:
        try:
            outcome["value"] = context.run(func)
        except BaseException as exc:  # handed back to the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="leaseq-job", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise JobTimeout("the job's time budget is spent (handler thread abandoned)")
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value
