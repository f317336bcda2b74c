"""Elastic drain on Lambda: the worker pool, fan-out, and the wake after an enqueue.

The database keeps a pool of *places* (``app.worker_pool``, see sql/README.md): one per
live worker invocation, each expiring with its invocation, and short-lived reservations
for invocations on their way. Every change to the pool goes through one row lock, so the
pool never holds more than its maximum, whatever races, duplicate events or retries come
its way. The maximum, the start hold and the wake's debounce are the schema owner's
(``app.settings``, written at deploy from the template's ``MaxWorkers`` and
``WakeDebounceSeconds``); ``LEASEQ_MAX_WORKERS`` and ``LEASEQ_START_HOLD_SECONDS`` can
only narrow them, so a stolen worker or producer login cannot widen them either. Here is
the Lambda half:

* :class:`PoolMembership`: an invocation joins the pool before it claims anything (its
  reservation if it was started for one, else free room) and leaves it when it ends;
  refused, it returns at once. The place expires by itself when an invocation is killed.
* :class:`FanOut`: the worker's ``on_claim`` hook. When a claim says the backlog is more
  than the pool drains (:class:`leaseq.base.pool.ScaleUp`), it reserves one more place and
  invokes the worker function asynchronously with the pool-start event, from a
  background thread, so a claim never waits on Lambda. Every member asking for one more
  place per second doubles the pool each second while the backlog lasts.
* :func:`wake`: the enqueue function's call after its commit. When nobody polls and
  nobody is starting, and the login's last wake is older than the owner's debounce, the
  database hands out a ticket and one worker is invoked naming it; otherwise nothing
  (1,000 enqueues of one login in a second start at most one invocation).
* :func:`wake_worker`: the same for producers that enqueue in their own transaction
  (``leaseq.enqueue_jobs(conn, ...)``), to call after their commit.

A failed invoke gives its place back (``app.release_worker_place``) and is logged and
counted; never is a job lost by it: the scheduled tick drains whatever no started
invocation took, within one tick. Lambda's client is :func:`leaseq_lambda.invoker.
lambda_client`, so the same code reaches AWS Lambda or the local Lambda service.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

import psycopg
from leaseq import ClaimedJob, InvalidRequestError, LeaseqError
from leaseq.base.deadline import Deadline
from leaseq.base.limits import DEFAULT_QUEUE
from leaseq.base.pool import PoolSize, ScaleUp
from leaseq.settings import PoolSettings
from leaseq.store.client import release_worker_place, wake_worker_place
from leaseq.store.duties import ProducerCalls, WorkerCalls

from leaseq_lambda import invoker
from leaseq_lambda.events import Tick, pool_start_event

logger = logging.getLogger("leaseq.scaling")

__all__ = [
    "POOL_EXPIRY_MARGIN",
    "FanOut",
    "PoolMembership",
    "WorkerStartError",
    "lambda_starter",
    "wake",
    "wake_after_enqueue",
    "wake_worker",
]

#: Seconds a live place outlasts its invocation's time left: a killed invocation's place
#: is free again this long after its deadline.
POOL_EXPIRY_MARGIN = 5.0
#: The longest an ending invocation waits for a start already under way.
CLOSE_SECONDS = 5.0

StartReason = Literal["fanout", "wake"]
#: Starts one worker invocation with a pool-start event; raises WorkerStartError.
Invoke = Callable[[Mapping[str, str]], None]


class WorkerStartError(LeaseqError):
    """The worker function could not be invoked (Lambda refused or could not be
    reached). Its reserved place or ticket is given back, or expires after the start
    hold; the jobs wait for the next worker (at the latest the scheduled tick)."""


def lambda_starter(function_name: str, lambda_client: Any | None = None) -> Invoke:
    """An :data:`Invoke` that sends the event to ``function_name`` (name or ARN) as an
    asynchronous (``Event``) invocation, with the environment's Lambda client unless one
    is given. Lambda answers 202 once the event is queued; anything else, and every
    error of the client, is a :class:`WorkerStartError` saying what to check."""

    def invoke(event: Mapping[str, str]) -> None:
        client = lambda_client if lambda_client is not None else invoker.lambda_client()
        try:
            answer = client.invoke(FunctionName=function_name, InvocationType="Event",
                                   Payload=json.dumps(dict(event)).encode())
        except Exception as exc:
            raise WorkerStartError(
                f"invoking the worker function {function_name!r} failed: "
                f"{type(exc).__name__}: {exc}. Check that LEASEQ_WORKER_FUNCTION names the "
                "worker function, that this function may call lambda:InvokeFunction on it, "
                "and that Lambda is reachable (a VPC endpoint or NAT)") from exc
        status = answer.get("StatusCode")
        if status != 202:
            raise WorkerStartError(
                f"invoking the worker function {function_name!r} asynchronously answered "
                f"HTTP {status}, not 202: the event was not queued")

    return invoke


#: Who starts a worker and gives its place back when the start fails: the worker's face
#: (fan-out) or the producer's (the enqueue function's wake); both offer both calls.
Starter = ProducerCalls | WorkerCalls


def _release(client: Starter, place: UUID) -> None:
    """Give back a reserved place or a wake's ticket whose invocation never started
    (never raises: one that cannot be given back expires after the start hold)."""
    try:
        client.release_worker_place(place)
    except LeaseqError as exc:
        logger.warning("reserved worker place not given back; it expires after the "
                       "start hold", extra={"place": str(place), "error": exc.message})


def _start(client: Starter, invoke: Invoke, place: UUID, reason: StartReason) -> None:
    try:
        invoke(pool_start_event(reason, place))
    except Exception as exc:
        _release(client, place)
        if isinstance(exc, WorkerStartError):
            raise
        raise WorkerStartError(f"starting a worker failed: {type(exc).__name__}: {exc}") from exc


# The pool membership of one invocation -------------------------------------------------


class PoolMembership:
    """One worker invocation's place in the pool: joined before the first claim, left
    when the invocation ends (and expiring with it if it is killed), with the fan-out
    that starts more invocations while it drains.

    With the pool off (``LEASEQ_MAX_WORKERS`` 0) every invocation is admitted, nothing
    is written and nothing started: the worker behaves as it did before the pool.

    For example::

        pool = PoolMembership(client, settings.pool, owner)
        if pool.join(tick, deadline):
            try:
                worker = runtime.worker(owner, deadline=deadline, poll_idle=pool.poll_idle,
                                        on_claim=pool.fan_out)
                worker.drain(deadline)
            finally:
                pool.finish(deadline)
    """

    def __init__(self, client: WorkerCalls, settings: PoolSettings, owner: str, *,
                 invoke: Invoke | None = None) -> None:
        self.client = client
        self.settings = settings
        self.owner = owner
        self.joined = False
        self.tick: Tick | None = None
        self.fan_out: FanOut | None = None
        self._invoke = invoke

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def join(self, tick: Tick, deadline: Deadline) -> bool:
        """Take the tick's reservation, or free room; False when the pool is full (a
        duplicate or retried start event, a tick while the pool is at its maximum):
        the invocation must then return without claiming. The place expires a margin
        after the invocation's ``deadline``."""
        self.tick = tick
        if not self.enabled:
            # No pool to refuse it: a paused queue's invocation still returns at once.
            return not self._paused()
        self.joined = self.client.join_worker_pool(
            self.owner, tick.pool_reason, tick.reservation, self.settings.max_workers,
            deadline.remaining() + POOL_EXPIRY_MARGIN, self.settings.queue)
        if self.joined:
            self.fan_out = FanOut(self.client, self.settings, invoke=self._invoke)
        return self.joined

    def refusal(self) -> str:
        """Why :meth:`join` said no: ``paused`` (an operator paused the queue) or
        ``pool_full``; read only after a refusal (``pool_full`` when it cannot be read)."""
        return "paused" if self._paused() else "pool_full"

    def _paused(self) -> bool:
        try:
            return self.client.queue_state(self.settings.queue).paused
        except LeaseqError as exc:
            logger.warning("queue state unavailable", extra={"error": exc.message})
            return False

    @property
    def poll_idle(self) -> float | None:
        """How long the invocation polls an empty queue: one started by fan-out or a
        wake stops after ``LEASEQ_FANOUT_IDLE_SECONDS``; a scheduled or manual one keeps
        the worker's ``LEASEQ_POLL_IDLE_SECONDS`` (None)."""
        if self.enabled and self.tick is not None and self.tick.started:
            return float(self.settings.fanout_idle_seconds)
        return None

    def size(self) -> PoolSize | None:
        """Live and reserved places now; None with the pool off or the database failing."""
        if not self.enabled:
            return None
        try:
            return self.client.worker_pool_size(self.settings.queue)
        except LeaseqError as exc:
            logger.warning("worker pool size unavailable", extra={"error": exc.message})
            return None

    def hand_over(self) -> bool:
        """After :meth:`finish`, when the drain stopped at its deadline with jobs still
        ready: start one successor in the place this invocation left. Every member of a
        pool started within a second also reaches its deadline within a second, and none
        of them claims again, so without a successor a backlog longer than one
        invocation's claiming time waits for the next schedule tick. Reserved like a
        fan-out (never beyond the maximum: with the pool still full, nothing starts).
        True when one was started; never raises (the tick drains what is left)."""
        if not self.enabled or self.fan_out is None:
            return False
        try:
            places = self.client.reserve_worker_places(
                1, self.settings.max_workers, float(self.settings.start_hold_seconds),
                self.settings.queue)
        except LeaseqError as exc:
            logger.warning("reserving a successor's place failed", extra={"error": exc.message})
            return False
        for place in places:
            try:
                _start(self.client, self.fan_out.invoke, place, "fanout")
            except WorkerStartError as exc:
                logger.warning("worker start failed", extra={"error": exc.message,
                                                             "place": str(place)})
                return False
            logger.info("worker started", extra={"reason": "hand_over", "place": str(place)})
            return True
        return False

    def finish(self, deadline: Deadline) -> FanOutReport | None:
        """End of the invocation: stop the fan-out (waiting for a start under way at most
        until half a second before ``deadline``, and :data:`CLOSE_SECONDS`) and free the
        place at once. Never raises: a place not freed expires with the invocation. None
        with the pool off."""
        report = None
        if self.fan_out is not None:
            time_left = deadline.remaining()
            report = self.fan_out.close(min(CLOSE_SECONDS, max(0.0, time_left - 0.5)))
        if self.joined:
            try:
                self.client.leave_worker_pool(self.owner)
            except LeaseqError as exc:
                logger.warning("leaving the worker pool failed; the place expires with the "
                               "invocation", extra={"error": exc.message})
            self.joined = False
        return report if self.enabled else None


# Fan-out ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FanOutReport:
    """What one invocation's fan-out did: invocations started, starts that failed, and
    scale-ups the pool had no room for."""

    started: int = 0
    failed: int = 0
    pool_full: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"workers_started": self.started, "worker_starts_failed": self.failed,
                "scale_ups_refused": self.pool_full}


class FanOut:
    """The worker's ``on_claim`` hook: more worker invocations while the backlog lasts.

    Called after every claim from the thread that made it, it only asks
    :class:`~leaseq.base.pool.ScaleUp` (no I/O) and hands a wanted start to a background
    thread, which reserves the places (``app.reserve_worker_places``: never beyond
    ``LEASEQ_MAX_WORKERS``) and invokes the worker function for each. A failed invoke
    gives its place back and is logged and counted. :meth:`close` ends it before the
    invocation returns, so no thread is left to run in a frozen environment.

    For example::

        fan_out = FanOut(client, settings.pool)
        worker = Worker(client, registry, config, on_claim=fan_out)
    """

    def __init__(self, client: WorkerCalls, settings: PoolSettings, *,
                 invoke: Invoke | None = None, scale_up: ScaleUp | None = None) -> None:
        self.client = client
        self.settings = settings
        self.scale_up = scale_up or ScaleUp()
        self._invoke = invoke
        self._cond = threading.Condition()
        self._wanted = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._started = self._failed = self._full = 0

    @property
    def invoke(self) -> Invoke:
        if self._invoke is None:
            if not self.settings.worker_function:
                raise WorkerStartError(
                    "LEASEQ_WORKER_FUNCTION is not set: name the worker function (its name "
                    "or ARN) so that a busy worker can start more of itself")
            self._invoke = lambda_starter(self.settings.worker_function)
        return self._invoke

    def __call__(self, claimed: Sequence[ClaimedJob], limit: int) -> None:
        wanted = self.scale_up.wanted(claimed, limit)
        if wanted <= 0:
            return
        with self._cond:
            if self._closed:
                return
            self._wanted += wanted
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="leaseq-fan-out",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._closed:
                    self._cond.wait()
                if not self._wanted:
                    return  # closed, and every start asked for is done
                wanted, self._wanted = self._wanted, 0
            try:
                self._grow(wanted)
            except Exception:  # never let the thread die silently
                logger.exception("fan-out failed; the scheduled tick drains the backlog")

    def _grow(self, wanted: int) -> None:
        try:
            invoke = self.invoke
            places = self.client.reserve_worker_places(
                wanted, self.settings.max_workers, float(self.settings.start_hold_seconds),
                self.settings.queue)
        except LeaseqError as exc:
            with self._cond:
                self._failed += wanted
            logger.warning("worker start failed", extra={"error": exc.message})
            return
        with self._cond:
            self._full += int(len(places) < wanted)
        for place in places:
            try:
                _start(self.client, invoke, place, "fanout")
            except WorkerStartError as exc:
                with self._cond:
                    self._failed += 1
                logger.warning("worker start failed", extra={"error": exc.message,
                                                             "place": str(place)})
                continue
            with self._cond:
                self._started += 1
            logger.info("worker started", extra={"reason": "fanout", "place": str(place)})

    def close(self, timeout: float = CLOSE_SECONDS) -> FanOutReport:
        """Take no more claims, and wait up to ``timeout`` seconds for the starts already
        asked for (a place left reserved by one still under way expires after the start
        hold)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, timeout))
            if thread.is_alive():
                logger.warning("a worker start was still under way when the invocation "
                               "ended", extra={"waited_seconds": round(timeout, 3)})
        return self.report()

    def report(self) -> FanOutReport:
        with self._cond:
            return FanOutReport(self._started, self._failed, self._full)


# Wake ---------------------------------------------------------------------------------


def wake(client: ProducerCalls, settings: PoolSettings, lambda_client: Any | None = None, *,
         invoke: Invoke | None = None, queue: str | None = None) -> bool:
    """Start one worker invocation if nobody is polling or starting and this login's
    last wake is older than the schema owner's debounce; True when one was started.

    Call it after the commit that made jobs ready. A failed invoke gives the ticket back
    and raises :class:`WorkerStartError`; a database failure raises its own error. The
    enqueue function treats both as best effort: the jobs are stored either way.
    """
    if not settings.enabled:
        return False
    queue = queue or settings.queue
    function = settings.worker_of(queue)
    place = client.wake_worker_place(queue)
    if place is None:
        return False
    if invoke is None:
        if function is None and queue != settings.queue:
            # A queue declared in a stack of its own: its deploy registered the worker
            # (app.queue_workers). Read only now, with the ticket won: the common answer
            # above costs no second query.
            function = client.queue_worker_function(queue)
            if function is None:
                _release(client, place)
                logger.info("no worker function registered for the queue; its tick "
                            "drains it", extra={"queue": queue})
                return False
        if not function:
            _release(client, place)
            raise WorkerStartError(
                "LEASEQ_WORKER_FUNCTION is not set: name the worker function (its name or "
                "ARN) so that an enqueue can wake it")
        invoke = lambda_starter(function, lambda_client)
    _start(client, invoke, place, "wake")
    logger.info("worker woken", extra={"place": str(place), "queue": queue})
    return True


def wake_after_enqueue(client: ProducerCalls, settings: PoolSettings,
                       lambda_client: Any | None = None, *,
                       queues: Sequence[str] = ()) -> tuple[bool, bool]:
    """:func:`wake` as the enqueue function calls it after its commit, once per queue of
    ``queues`` (the queues of the jobs it made ready; none: the settings' own queue):
    best effort, never raising. Returns (a worker was started, a start failed); a
    failure is logged, and the jobs it was for are stored all the same."""
    started = failed = False
    for queue in queues or (settings.queue,):
        try:
            started = wake(client, settings, lambda_client, queue=queue) or started
            continue
        except LeaseqError as exc:
            logger.warning("waking a worker failed; the scheduled worker runs the jobs",
                           extra={"error": exc.message, "sqlstate": exc.sqlstate,
                                  "queue": queue})
        except Exception as exc:  # a bug must not fail an enqueue that has committed
            logger.exception("waking a worker failed; the scheduled worker runs the jobs",
                             extra={"error": f"{type(exc).__name__}: {exc}", "queue": queue})
        failed = True
    return started, failed


def wake_worker(connection: psycopg.Connection[Any], function_name: str, *,
                lambda_client: Any | None = None, queue: str = DEFAULT_QUEUE) -> bool:
    """Wake a worker after committing jobs enqueued in your own transaction.

    ``leaseq.enqueue_jobs(conn, ...)`` stores jobs in the caller's transaction, and the
    enqueue function's wake never sees them; call this once the transaction has
    committed, on the same connection (or any connection as a member of
    ``leaseq_producer``, ``leaseq_tenant_producer`` or ``leaseq_worker``), with the
    worker function's name or ARN (the stack output ``WorkerFunctionName``). The caller
    needs ``lambda:InvokeFunction`` on it. It is debounced in the database as the
    enqueue function's wake is, by the schema owner's debounce and start hold, per
    login: calling it after every commit is cheap, it starts an invocation only when no
    worker is polling or starting, and what this login's wakes do never holds back
    another login's. Returns True when it started one.

    Best effort by design: when it raises (the database or Lambda failing), the jobs are
    committed all the same and the scheduled worker runs them within one tick.

    For example::

        with conn.transaction():
            order_id = save_order(conn, order)
            leaseq.enqueue_jobs(conn, [EnqueueRequest(tenant_id=tenant, kind="ship",
                                       operation_key=f"ship-{order_id}", payload={...})])
        wake_worker(conn, "my-stack-worker")

    ``queue`` is the named queue whose pool is woken: ``function_name`` must be that
    queue's worker function (the stack output of its nested queue application).

    Called inside an open transaction it raises :class:`leaseq.InvalidRequestError` and
    does nothing: a worker woken before the commit would not see the jobs.
    """
    if connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise InvalidRequestError(
            "wake_worker was called inside an open transaction: commit the transaction "
            "that enqueued the jobs first, then call wake_worker, so that the worker it "
            "starts can see them")
    place = wake_worker_place(connection, queue)
    if place is None:
        return False
    invoke = lambda_starter(function_name, lambda_client)
    try:
        invoke(pool_start_event("wake", place))
    except WorkerStartError:
        try:
            release_worker_place(connection, place)
        except LeaseqError as exc:
            logger.warning("worker wake failed and its ticket was not given back; it "
                           "expires after the start hold",
                           extra={"place": str(place), "error": exc.message})
        raise
    return True
