"""What a running handler can see and do about its own job, and which job is running.

The worker marks the job it is running in a context variable, so any log line written
while a handler runs (by leaseq, by the handler, by a library it calls) can carry the
job's identity: :class:`JobLogFields` copies it onto log records. This stays standard
``logging``; the Lambda adapter attaches the filter to its JSON handler.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from leaseq.base.jobs import ClaimedJob

_current_job: ContextVar[ClaimedJob | None] = ContextVar("leaseq_current_job", default=None)


@dataclass
class JobContext:
    """What a handler knows about its own run: the job, the time its budget leaves, its
    lease, and whether it should stop.

    Every method works in a sync and in an ``async def`` handler; in an ``async def``
    one use the ``_async`` forms, which never block the event loop.

    >>> from uuid import uuid4
    >>> from leaseq import (EnqueueRequest, MonotonicDeadline, QueueClient, Registry,
    ...                     Worker, WorkerConfig, connect)
    >>> registry = Registry()
    >>> @registry.handler("export", timeout=120)
    ... def export(payload: dict, ctx: JobContext) -> None:
    ...     for page in range(payload["pages"]):
    ...         if ctx.stop_requested or not ctx.renew_lease():
    ...             return  # the budget is spent or the lease is gone: stop cleanly
    ...         print(f"{ctx.job.kind} page {page}, attempt {ctx.attempt}")
    >>> client = QueueClient(lambda: connect(dsn))  # dsn: the database's URL
    >>> _ = client.enqueue_job(EnqueueRequest(tenant_id=uuid4(), operation_key="export-1",
    ...                                       kind="export", payload={"pages": 2}))
    >>> _ = Worker(client, registry, WorkerConfig(owner="worker-1", poll_idle=0)).drain(
    ...     MonotonicDeadline(300))
    export page 0, attempt 1
    export page 1, attempt 1
    """

    job: ClaimedJob
    _remaining: Callable[[], float]
    _renew: Callable[[], bool]
    _renew_async: Callable[[], Awaitable[bool]] | None = None
    budget: float = 0.0
    _stop_async: asyncio.Event | None = field(default=None, repr=False)
    stop_reason: str | None = None
    # A flag, and a thread event made only when a handler waits on it: one context is
    # built per job, and an Event (a lock and a condition) costs more than the rest.
    _stopped: bool = field(default=False, repr=False)
    _stop: threading.Event | None = field(default=None, repr=False)
    _cancelled: bool = field(default=False, repr=False)

    @property
    def attempt(self) -> int:
        """This run's attempt number, 1 for the first (a retry's is higher)."""
        return self.job.attempts

    @property
    def priority(self) -> int:
        """The job's priority, 1 (least urgent) .. 9 (most urgent): a handler may, say,
        give an urgent job's calls a shorter timeout."""
        return self.job.priority

    @property
    def correlation_id(self) -> str | None:
        """The producer's correlation id of the job, to pass on to the services it calls."""
        return self.job.correlation_id

    def remaining(self) -> float:
        """Seconds this handler may still run before it is interrupted or cancelled."""
        return self._remaining()

    def renew_lease(self) -> bool:
        """Extend the lease as far as the invocation's budget allows.

        Returns False when the lease was lost (another worker may now own the job);
        a handler should then stop without side effects it cannot repeat. In an
        ``async def`` handler use :meth:`renew_lease_async`: this call waits for a
        database round trip and would hold up every other job on the event loop.
        """
        return self._renew()

    async def renew_lease_async(self) -> bool:
        """:meth:`renew_lease` without blocking the event loop."""
        if self._renew_async is not None:
            return await self._renew_async()
        return await asyncio.to_thread(self._renew)

    @property
    def stop_requested(self) -> bool:
        """True once the handler should stop: its budget is spent (it is being cancelled,
        or, in a thread, abandoned), its lease was lost, the invocation is ending, or an
        operator cancelled the job. ``stop_reason`` says which (``budget``,
        ``lease_lost``, ``invocation_ending``, ``cancelled``)."""
        return self._stopped

    @property
    def cancelled(self) -> bool:
        """True once an operator asked to cancel this job and the worker learned of it,
        at a lease renewal (the worker's own, or this handler's :meth:`renew_lease`).

        The job ends ``cancelled`` whatever the handler does next, never retried: what
        it returns is kept as the job's result, but nothing runs it again. A handler
        should stop soon, after its cleanup: an ``async def`` handler's task is
        cancelled (``asyncio.CancelledError``, which it may catch to clean up) once the
        worker's ``cancel_grace`` has passed; a sync handler is never interrupted for
        it, and one that does not look runs on to its budget.
        """
        return self._cancelled

    def cancel_requested(self) -> None:
        """Mark the job as cancelled by an operator and ask the handler to stop (the
        worker calls this, as :meth:`request_stop`)."""
        self._cancelled = True
        self.request_stop("cancelled")

    def _thread_event(self) -> threading.Event:
        if self._stop is None:
            self._stop = threading.Event()
        if self._stopped:  # read after the event exists: request_stop sets one or the other
            self._stop.set()
        return self._stop

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """Block the calling thread until a stop is requested or ``timeout`` passes;
        whether it was requested. For sync handlers (a thread's sleep that ends early)."""
        return self._thread_event().wait(timeout)

    async def wait_for_stop_async(self, timeout: float | None = None) -> bool:
        """:meth:`wait_for_stop` for ``async def`` handlers."""
        if self._stop_async is None:
            return await asyncio.to_thread(self._thread_event().wait, timeout)
        try:
            async with asyncio.timeout(timeout):
                await self._stop_async.wait()
        except TimeoutError:
            return False
        return True

    def request_stop(self, reason: str) -> None:
        """Ask the handler to stop (the worker calls this; in its event loop's thread
        when the context has an asyncio event)."""
        if self._stopped:
            return
        self.stop_reason = reason
        self._stopped = True
        if self._stop is not None:
            self._stop.set()
        if self._stop_async is not None:
            self._stop_async.set()


def current_job() -> ClaimedJob | None:
    """The job whose handler is running in this context, if any: for code a handler
    calls that has no :class:`JobContext` at hand (a library's hook, a log filter).

    >>> current_job() is None  # no handler is running here
    True
    """
    return _current_job.get()


class running:
    """Mark ``job`` as the one running in this context for the length of a block.

    A class rather than a generator-based context manager: it is entered once per job.
    """

    __slots__ = ("_job", "_token")
    _token: Token[ClaimedJob | None]

    def __init__(self, job: ClaimedJob) -> None:
        self._job = job

    def __enter__(self) -> None:
        self._token = _current_job.set(self._job)

    def __exit__(self, *exc_info: object) -> None:
        _current_job.reset(self._token)


def job_log_fields(job: ClaimedJob) -> dict[str, Any]:
    """The fields every log line about ``job`` carries (None values are left out), for a
    handler that logs to a logger of its own."""
    fields: dict[str, Any] = {
        "job_id": str(job.id),
        "tenant_id": str(job.tenant_id),
        "kind": job.kind,
        "attempt": job.attempts,
    }
    if job.correlation_id is not None:
        fields["correlation_id"] = job.correlation_id
    return fields


class JobLogFields(logging.Filter):
    """Add the running job's fields to every record that does not already carry them."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the fields; never drops a record."""
        job = _current_job.get()
        if job is not None:
            for key, value in job_log_fields(job).items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True
