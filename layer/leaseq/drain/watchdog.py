"""Find the handler that blocks the worker's event loop.

An ``async def`` handler that does sync work (``time.sleep``, ``requests.get``, a CPU-bound
loop, a sync database driver) holds the event loop: every other job on it stops, and so
does the cancellation of jobs past their budget. The watchdog sees it from outside: a
task on the loop records a heartbeat every quarter of ``loop_stall``; a thread checks
the heartbeat and, when it is older than ``loop_stall``, logs a warning naming the job
whose handler's task is running on the loop at that moment (and the other jobs held up),
then a second line when the loop runs again, with how long it was held.

What to do about such a line is in docs/reliability.md ("Choosing a handler style"):
await an async library, run the sync part with ``await asyncio.to_thread(...)``, or
register the handler as a plain ``def`` (it then runs in a thread of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from leaseq.base.jobs import ClaimedJob
from leaseq.kinds.job_context import job_log_fields

logger = logging.getLogger("leaseq.worker")


class LoopWatchdog:
    """Reports an event loop whose heartbeat stalls longer than ``threshold`` seconds.

    ``handler_tasks`` gives the running handlers' tasks and their jobs; ``on_stall`` is
    called once per stall (the worker counts them in its report).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float,
                 handler_tasks: Callable[[], Mapping[asyncio.Task[Any], ClaimedJob]],
                 on_stall: Callable[[], None]) -> None:
        self._loop = loop
        self._threshold = threshold
        self._handler_tasks = handler_tasks
        self._on_stall = on_stall
        self._beat = time.monotonic()
        self._stopping = threading.Event()
        self._beating: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._watch, name="leaseq-loop-watchdog",
                                        daemon=True)

    def start(self) -> None:
        self._beat = time.monotonic()
        self._beating = self._loop.create_task(self._heartbeat(), name="leaseq-heartbeat")
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        self._thread.join()

    async def _heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self._threshold / 4)

    def _watch(self) -> None:
        stalled_since: float | None = None
        blamed: dict[str, Any] = {}
        while not self._stopping.wait(self._threshold / 4):
            beat = self._beat
            silent = time.monotonic() - beat
            if silent > self._threshold and stalled_since is None:
                stalled_since = beat
                blamed = self._blame()
                self._on_stall()
                logger.warning(
                    "event loop blocked: a handler runs blocking code inside async def",
                    extra={**blamed, "blocked_for": round(silent, 3)})
            elif silent <= self._threshold and stalled_since is not None:
                logger.warning("event loop ran again", extra={
                    **blamed, "blocked_for": round(beat - stalled_since, 3)})
                stalled_since = None

    def _blame(self) -> dict[str, Any]:
        """The job whose handler holds the loop now, and the jobs it holds up.

        Read from this thread while the loop's thread is stuck: the loop changes neither
        its current task nor the handlers' table while it is blocked, and each read is
        a single dictionary lookup or copy.
        """
        handlers = dict(self._handler_tasks())
        current = asyncio.current_task(self._loop)
        job = handlers.get(current) if current is not None else None
        fields: dict[str, Any] = job_log_fields(job) if job is not None else {
            "blocking_task": current.get_name() if current is not None else None}
        fields["jobs_held_up"] = [str(j.id) for t, j in handlers.items() if t is not current]
        return fields
