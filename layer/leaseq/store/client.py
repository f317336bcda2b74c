"""QueueClient: one method per SQL function, over one reusable connection.

Every caller of the queue's SQL functions goes through it: the worker and reaper, the
Lambda functions, the dashboard and the command line; their statements are those of
:mod:`leaseq.store.queries`. It is long because it is the one module that sends them (one
method per function, each a few lines); callers see it split by duty through
:mod:`leaseq.store.duties`.

The client owns a single connection (no pool: a Lambda execution environment runs one
invocation at a time) and re-validates it before use, because a connection frozen
with its execution environment may be dead when the environment thaws. Every call
is safe to repeat once after a reconnect: enqueue is idempotent, finishes and renewals
are fenced by the lease token, a repeated claim at worst leaves a lease to expire, reads
change nothing, a repeated redrive or cancel finds the jobs it changed no longer dead or
pending (each is changed and audited once), and a repeated prune deletes only what is
still older than its age.

One client may be used from several threads (a worker's recorder thread, its event
loop's database thread, handler threads renewing their leases): a lock makes each call,
with its reconnect, one step, so the statements of one connection never interleave.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString, TypeVar
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from leaseq.base.admission import DeclaredLimit, LimitName, Rate, check_concurrency
from leaseq.base.errors import (
    DatabaseError,
    DatabaseUnavailableError,
    IdempotencyConflictError,
    InvalidRequestError,
    ResultTimeoutError,
)
from leaseq.base.jobs import (
    ClaimedJob,
    EnqueueRequest,
    EnqueueResult,
    JobOutcome,
    JobState,
    LeaseRenewal,
    Selection,
    enqueue_call_problem,
)
from leaseq.base.limits import DEFAULT_QUEUE
from leaseq.base.pool import PoolLimits, PoolSize
from leaseq.base.queues import QueueOverview, QueueState
from leaseq.base.results import JobResult, poll_until_finished
from leaseq.base.schedules import Schedule, TickedSchedule
from leaseq.base.sessions import StalledSession
from leaseq.store import queries
from leaseq.store.db import Connection, fetch_rows, prepare_connection, translate_errors

T = TypeVar("T")

#: Reconnect proactively after this long without use: idle connections of frozen
#: Lambda environments are purged by the network long before a server would notice.
DEFAULT_MAX_IDLE_SECONDS = 240.0

#: The operator functions' per-call bound for redrive and cancel (app.check_filters).
MAX_OPERATOR_BATCH = 1000


def enqueue_jobs(conn: psycopg.Connection[Any],
                 requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
    """Enqueue many jobs in one round trip on the caller's connection.

    Runs inside the caller's open transaction when there is one, so the jobs exist if
    and only if the caller's work commits. Conflicts are reported per item, not raised,
    and so are items the database rejects (status "rejected", with its 22023 message in
    ``error``): the batch's other items are stored all the same. A batch whose payloads
    together pass :data:`leaseq.base.limits.MAX_ENQUEUE_BYTES` is refused whole before
    anything is sent (InvalidRequestError, SQLSTATE 22023, the database's message).
    """
    if not requests:
        return []
    problem = enqueue_call_problem(list(enumerate(requests, 1)))
    if problem is not None:
        raise InvalidRequestError(problem, sqlstate="22023")
    params = {
        "tenant_ids": [r.tenant_id for r in requests],
        "operation_keys": [r.operation_key for r in requests],
        "kinds": [r.kind for r in requests],
        "payloads": [Jsonb(r.payload) for r in requests],
        "available_ats": [r.available_at for r in requests],
        "max_attempts": [r.max_attempts for r in requests],
        "correlation_ids": [r.correlation_id for r in requests],
        "priorities": [r.priority for r in requests],
        "queues": [r.queue for r in requests],
        "limit_keys": [r.limit_key for r in requests],
    }
    rows = fetch_rows(conn, queries.ENQUEUE_JOBS, params)
    return [
        EnqueueResult(
            index=int(row["ord"]) - 1,
            job_id=row["job_id"],
            status=row["status"],
            state=None if row["state"] is None else JobState(row["state"]),
            error=row["error"],
            queue=row["queue"],
        )
        for row in rows
    ]


def wake_worker_place(conn: psycopg.Connection[Any], queue: str = DEFAULT_QUEUE) -> UUID | None:
    """:meth:`QueueClient.wake_worker_place` on the caller's connection, in a transaction
    of its own, for producers that enqueue on their own connection. The debounce, the
    ticket's hold and whether the pool wakes at all are the schema owner's
    (``app.settings``): a producer chooses none of them, only which queue's pool."""
    with translate_errors(conn), conn.transaction():
        rows = fetch_rows(conn, queries.WAKE_WORKER_PLACE, {"queue": queue})
    place: UUID | None = rows[0]["place"] if rows else None
    return place


def set_worker_pool_limits(conn: psycopg.Connection[Any], *, max_workers: int | None = None,
                           start_hold: float | None = None,
                           wake_debounce: float | None = None) -> PoolLimits:
    """Set the worker pool's limits (``app.settings``) on the schema owner's connection,
    in a transaction of its own; None keeps a limit. Returns the limits now in force.

    The deploy calls it with the template's ``MaxWorkers`` and ``WakeDebounceSeconds``,
    and the command line on its embedded server; every other login is refused
    (:class:`leaseq.PermissionDeniedError`, 42501), and a value out of range is an
    :class:`InvalidRequestError` (22023) that changes nothing. Durations in seconds."""
    params = {
        "max_workers": max_workers,
        "start_hold": None if start_hold is None else _seconds("start_hold", start_hold),
        "wake_debounce": None if wake_debounce is None else _seconds("wake_debounce",
                                                                      wake_debounce),
    }
    with translate_errors(conn), conn.transaction():
        (row,) = fetch_rows(conn, queries.SET_WORKER_POOL_LIMITS, params)
    return PoolLimits.from_row(row)


def route_kinds(conn: psycopg.Connection[Any], queue: str, kinds: Sequence[str]) -> int:
    """Route ``kinds`` to ``queue`` on the schema owner's connection (app.route_kinds),
    in a transaction of its own: their jobs enqueued without a queue go there, and their
    jobs waiting in ``default`` move there; returns how many moved. Only the owner may
    (42501 otherwise). ``queue`` "default" removes the routes."""
    with translate_errors(conn), conn.transaction():
        (row,) = fetch_rows(conn, queries.ROUTE_KINDS, {"queue": queue, "kinds": list(kinds)})
    return int(row["moved"])


def set_queue_limits(conn: psycopg.Connection[Any], queue: str, max_workers: int | None) -> int:
    """Set ``queue``'s own worker limit (app.set_queue_limits; None: the owner's
    max_workers) on the schema owner's connection; returns the limit now in force."""
    with translate_errors(conn), conn.transaction():
        (row,) = fetch_rows(conn, queries.SET_QUEUE_LIMITS,
                            {"queue": queue, "max_workers": max_workers})
    return int(row["max_workers"])


def register_queue_worker(conn: psycopg.Connection[Any], queue: str, function_name: str,
                          connections: int, stack_id: str, limit: int | None = None) -> int:
    """Register ``queue``'s worker for ``stack_id`` on the schema owner's connection
    (app.register_queue_worker); returns what the deployment can open with it. Refused
    with 53400 when that exceeds ``limit``, with 23505 when another stack holds the
    queue."""
    with translate_errors(conn), conn.transaction():
        (row,) = fetch_rows(conn, queries.REGISTER_QUEUE_WORKER, {
            "queue": queue, "function_name": function_name, "connections": connections,
            "stack_id": stack_id, "limit": limit})
    return int(row["total"])


def unregister_queue_worker(conn: psycopg.Connection[Any], queue: str, stack_id: str) -> bool:
    """Remove ``queue``'s registration if ``stack_id`` made it; whether one was removed."""
    with translate_errors(conn), conn.transaction():
        (row,) = fetch_rows(conn, queries.UNREGISTER_QUEUE_WORKER,
                            {"queue": queue, "stack_id": stack_id})
    return bool(row["removed"])


def queue_connections(conn: psycopg.Connection[Any],
                      except_queue: str | None = None) -> dict[str, Any] | None:
    """What the connection budget holds (app.queue_connections): the leaseq stack's own
    figure and proxy share, and the registered queues' but ``except_queue``'s; None
    before the schema has the registry."""
    with translate_errors(conn), conn.transaction():
        (present,) = fetch_rows(conn, queries.QUEUE_REGISTRY_PRESENT, {})
        if not present["present"]:
            return None
        (row,) = fetch_rows(conn, queries.QUEUE_CONNECTIONS, {"except_queue": except_queue})
    return dict(row)


def set_stack_connections(conn: psycopg.Connection[Any], connections: int,
                          proxy_percent: int | None) -> None:
    """Keep the leaseq stack's own connections and proxy share (app.set_stack_connections)."""
    with translate_errors(conn), conn.transaction():
        fetch_rows(conn, queries.SET_STACK_CONNECTIONS,
                   {"connections": connections, "proxy_percent": proxy_percent})


def release_worker_place(conn: psycopg.Connection[Any], place: UUID) -> None:
    """:meth:`QueueClient.release_worker_place` on the caller's connection: give back
    the ticket a wake took when the invocation it was for could not be started."""
    with translate_errors(conn), conn.transaction():
        fetch_rows(conn, queries.RELEASE_WORKER_PLACE, {"place": place})


def enqueue_job(conn: psycopg.Connection[Any], request: EnqueueRequest) -> EnqueueResult:
    """Enqueue one job on the caller's connection; a conflicting repeat raises, and so
    does a request the database rejects (InvalidRequestError, SQLSTATE 22023)."""
    (result,) = enqueue_jobs(conn, [request])
    if result.status == "rejected":
        raise InvalidRequestError(result.error or "the job was rejected", sqlstate="22023")
    if result.status == "conflict":
        raise IdempotencyConflictError(
            f"operation_key {request.operation_key!r} of tenant {request.tenant_id} already "
            "names a job with a different kind or payload; use a new operation_key for a "
            "different job, or repeat the original kind and payload exactly",
            sqlstate="23505",
        )
    return result


def read_result(conn: psycopg.Connection[Any], tenant_id: UUID, *, job_id: UUID | None = None,
                operation_key: str | None = None) -> JobResult | None:
    """One read of a job, named by id or by operation key, on the caller's connection."""
    if (job_id is None) == (operation_key is None):
        raise DatabaseError("name the job by job_id or by operation_key (one of them)")
    if job_id is not None:
        rows = fetch_rows(conn, queries.GET_JOB_RESULT, {"tenant_id": tenant_id,
                                                          "job_id": job_id})
    else:
        rows = fetch_rows(conn, queries.GET_JOB_RESULT_BY_KEY,
                          {"tenant_id": tenant_id, "operation_key": operation_key})
    return JobResult.from_row(rows[0]) if rows else None


def wait_for_result(conn: psycopg.Connection[Any], tenant_id: UUID, *,
                    job_id: UUID | None = None, operation_key: str | None = None,
                    timeout: float, **polling: Any) -> JobResult | None:
    """Wait up to ``timeout`` seconds on the caller's connection for a job to finish,
    then return it (None: no such job). Each read is a transaction of its own, so call it
    after the transaction that enqueued the job has committed: inside it the workers
    cannot see the job yet (a DatabaseError says so). Raises
    :class:`ResultTimeoutError` when the job is still unfinished at the timeout."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise DatabaseError(
            "wait_for_result was called inside an open transaction: a job enqueued in it "
            "is not visible to the workers until it commits; commit first, then wait")

    def read() -> JobResult | None:
        with conn.transaction():
            return read_result(conn, tenant_id, job_id=job_id, operation_key=operation_key)

    found = poll_until_finished(read, timeout, **polling)
    if found is not None and not found.finished:
        raise ResultTimeoutError(found, timeout)
    return found


def _activity_params(tenant_id: UUID | None, kind: str | None, window: timedelta,
                     buckets: int, samples: int) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "kind": kind, "window": window, "buckets": buckets,
            "samples": samples}


def _kind_filter(kinds: Sequence[str] | None,
                 exclude_kinds: Sequence[str] | None) -> dict[str, list[str] | None]:
    """A claim's kind filter as its parameters (None, None: every kind)."""
    return {"kinds": None if kinds is None else list(kinds),
            "exclude_kinds": None if exclude_kinds is None else list(exclude_kinds)}


def _outcome_params(owner: str, outcomes: Sequence[JobOutcome]) -> dict[str, Any]:
    return {
        "owner": owner,
        "tenant_ids": [o.job.tenant_id for o in outcomes],
        "job_ids": [o.job.id for o in outcomes],
        "tokens": [o.job.lease_token for o in outcomes],
        "outcomes": [o.outcome for o in outcomes],
        # SQL NULL is the contract's "no result" (stored as JSON null), and costs no
        # JSON encoding: most handlers return nothing.
        "details": [None if o.detail is None else Jsonb(o.detail) for o in outcomes],
        "retry_delays": [o.retry_delay for o in outcomes],
    }


def _seconds(name: str, value: float) -> timedelta:
    """A duration given in seconds, as the interval the SQL function takes; a value no
    interval can hold is refused here, naming the argument (the function checks the
    range)."""
    try:
        if isinstance(value, bool) or not math.isfinite(value):
            raise ValueError
        return timedelta(seconds=value)
    except (ValueError, TypeError, OverflowError):
        raise InvalidRequestError(
            f"{name} must be a finite number of seconds (got {value!r})") from None


class QueueClient:
    """The queue's SQL contract as methods, named after the functions they call: every
    duty's calls over one connection. Code that does one duty takes that duty's face of
    it (:mod:`leaseq.store.duties`: ``WorkerClient(client)`` and the others), which offers only
    the calls the duty's SQL group may execute."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        *,
        max_idle_seconds: float = DEFAULT_MAX_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._max_idle = max_idle_seconds
        self._clock = clock
        self._conn: Connection | None = None
        self._last_used = 0.0
        self._lock = threading.RLock()
        self.reconnects = 0

    # Connection lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _fresh_connection(self) -> Connection:
        self.close()
        conn = self._connect()
        # Whatever made it, the worker's connection decodes stored JSON totally.
        prepare_connection(conn)
        self._conn = conn
        self.reconnects += 1
        return conn

    def check(self) -> None:
        """Make sure the connection is usable; reconnect once if it went stale.

        Called at the start of each invocation. A connection that was idle longer
        than ``max_idle_seconds`` is pinged first; a failed ping means a new one.
        """
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                self._fresh_connection()
            elif self._clock() - self._last_used > self._max_idle:
                try:
                    fetch_rows(conn, queries.PING, {})
                except DatabaseUnavailableError:
                    self._fresh_connection()
            self._last_used = self._clock()

    @property
    def connection(self) -> Connection:
        """The open connection (opened now if there is none or it broke), for a caller's
        own transaction around :func:`enqueue_jobs`."""
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                return self._fresh_connection()
            return self._conn

    def _call(self, operation: Callable[[Connection], T]) -> T:
        with self._lock:
            try:
                result = operation(self.connection)
            except DatabaseUnavailableError:
                result = operation(self._fresh_connection())
            self._last_used = self._clock()
            return result

    def _query(self, query: LiteralString, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self._call(lambda conn: fetch_rows(conn, query, params))

    # Enqueue ------------------------------------------------------------------------

    def enqueue_jobs(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Enqueue a batch in one round trip (app.enqueue_jobs): one result per request,
        in order, created, existing, conflict or rejected (see :class:`EnqueueResult`)."""
        if not requests:
            return []
        return self._call(lambda conn: enqueue_jobs(conn, requests))

    def enqueue_job(self, request: EnqueueRequest) -> EnqueueResult:
        """Enqueue one job; a conflict or a rejection raises (see :func:`enqueue_job`)."""
        return self._call(lambda conn: enqueue_job(conn, request))

    def get_job_result(self, tenant_id: UUID, job_id: UUID) -> dict[str, Any] | None:
        """A job's state and result as its producer may see them (no lease token, no
        payload); None when the tenant has no such job. A tenant-bound producer gets
        PermissionDeniedError for a tenant it is not bound to."""
        rows = self._query(queries.GET_JOB_RESULT, {"tenant_id": tenant_id, "job_id": job_id})
        return rows[0] if rows else None

    def get_job_result_by_key(self, tenant_id: UUID,
                              operation_key: str) -> dict[str, Any] | None:
        """As :meth:`get_job_result`, for the job the producer enqueued under
        ``operation_key``."""
        rows = self._query(queries.GET_JOB_RESULT_BY_KEY,
                           {"tenant_id": tenant_id, "operation_key": operation_key})
        return rows[0] if rows else None

    def job_result(self, tenant_id: UUID, *, job_id: UUID | None = None,
                   operation_key: str | None = None) -> JobResult | None:
        """What became of a job, named by id or by operation key (one of them): a
        :class:`leaseq.base.results.JobResult`, or None when the tenant has no such job."""
        return self._call(lambda conn: read_result(conn, tenant_id, job_id=job_id,
                                                   operation_key=operation_key))

    def wait_for_result(self, tenant_id: UUID, *, job_id: UUID | None = None,
                        operation_key: str | None = None, timeout: float,
                        **polling: Any) -> JobResult | None:
        """Wait up to ``timeout`` seconds for the job to finish (bounded polling with
        backoff and jitter: :func:`leaseq.base.results.poll_until_finished`) and return it;
        None when there is no such job; :class:`ResultTimeoutError` when it is still
        unfinished at the timeout."""
        found = poll_until_finished(
            lambda: self.job_result(tenant_id, job_id=job_id, operation_key=operation_key),
            timeout, **polling)
        if found is not None and not found.finished:
            raise ResultTimeoutError(found, timeout)
        return found

    # Claim and lease ----------------------------------------------------------------

    # Every claim takes a kind filter: ``kinds`` (only these) or ``exclude_kinds`` (every
    # kind but these), not both; None for both claims every kind.

    def claim_ready_jobs(self, owner: str, limit: int, lease: timedelta, *,
                         kinds: Sequence[str] | None = None,
                         exclude_kinds: Sequence[str] | None = None,
                         queue: str | None = None) -> list[ClaimedJob]:
        """Lease up to ``limit`` ready jobs of every tenant, fairly (tenants take turns),
        to ``owner`` for ``lease``: of ``queue`` only, or of every queue when None; never
        of a paused queue."""
        rows = self._query(
            queries.CLAIM_READY_JOBS, {"owner": owner, "limit": limit, "lease": lease,
                                       **_kind_filter(kinds, exclude_kinds), "queue": queue}
        )
        return [ClaimedJob.from_row(row) for row in rows]

    def claim_jobs(self, tenant_id: UUID, owner: str, limit: int, lease: timedelta, *,
                   kinds: Sequence[str] | None = None,
                   exclude_kinds: Sequence[str] | None = None,
                   queue: str | None = None) -> list[ClaimedJob]:
        """Lease up to ``limit`` ready jobs of one tenant, oldest first (of ``queue``
        only, or of every queue that is not paused when None)."""
        rows = self._query(
            queries.CLAIM_JOBS,
            {"tenant_id": tenant_id, "owner": owner, "limit": limit, "lease": lease,
             **_kind_filter(kinds, exclude_kinds), "queue": queue},
        )
        return [ClaimedJob.from_row(row) for row in rows]

    def ready_tenants(self, limit: int = 100) -> list[dict[str, Any]]:
        """Up to ``limit`` tenants with a job ready now, in tenant id order, each with its
        oldest ready job's ``oldest_ready_at``."""
        return self._query(queries.READY_TENANTS, {"limit": limit})

    def oldest_ready_at(self) -> datetime | None:
        """available_at of the oldest job ready now, of any tenant (None when none): one
        index probe, whatever the number of tenants."""
        (row,) = self._query(queries.OLDEST_READY_AT, {})
        oldest: datetime | None = row["oldest_ready_at"]
        return oldest

    def renew_job_lease(self, job: ClaimedJob, lease: timedelta) -> bool:
        """Extend ``job``'s lease to ``lease`` from now; False when the lease was lost
        (expired and taken back, or taken by another worker), fenced by its token."""
        rows = self._query(
            queries.RENEW_JOB_LEASE,
            {"tenant_id": job.tenant_id, "job_id": job.id, "owner": job.lease_owner,
             "token": job.lease_token, "lease": lease},
        )
        return bool(rows[0]["renewed"])

    def renew_job_lease_status(self, job: ClaimedJob, lease: timedelta) -> LeaseRenewal:
        """:meth:`renew_job_lease`, answering in the same round trip whether an operator
        asked to cancel the job (app.renew_job_lease_status). The lease is renewed either
        way: the handler may use its grace to stop cleanly, and whatever is recorded for
        the job then ends it cancelled."""
        rows = self._query(
            queries.RENEW_JOB_LEASE_STATUS,
            {"tenant_id": job.tenant_id, "job_id": job.id, "owner": job.lease_owner,
             "token": job.lease_token, "lease": lease},
        )
        row = rows[0]
        return LeaseRenewal(bool(row["renewed"]), bool(row["cancel_requested"]))

    # Finish -------------------------------------------------------------------------

    def finish_jobs(self, owner: str, outcomes: Sequence[JobOutcome]) -> dict[UUID, JobState]:
        """Record outcomes in one statement; jobs whose lease was lost are absent."""
        if not outcomes:
            return {}
        rows = self._query(queries.FINISH_JOBS, _outcome_params(owner, outcomes))
        return {row["job_id"]: JobState(row["state"]) for row in rows}

    def finish_and_claim_jobs(
        self, owner: str, outcomes: Sequence[JobOutcome], limit: int, lease: timedelta, *,
        kinds: Sequence[str] | None = None, exclude_kinds: Sequence[str] | None = None,
        queue: str | None = None,
    ) -> tuple[dict[UUID, JobState], list[ClaimedJob]]:
        """Record a batch's outcomes and claim the next batch: one round trip, one commit.

        Returns the states of the outcomes applied (a lost lease is absent) and the
        jobs claimed. A refused outcome refuses the claim too (one transaction).
        """
        params = {**_outcome_params(owner, outcomes), "limit": limit, "lease": lease,
                  **_kind_filter(kinds, exclude_kinds), "queue": queue}
        rows = self._query(queries.FINISH_AND_CLAIM_JOBS, params)
        states = {row["id"]: JobState(row["state"]) for row in rows if not row["claimed"]}
        return states, [ClaimedJob.from_row(row) for row in rows if row["claimed"]]

    def release_jobs(self, owner: str, jobs: Iterable[ClaimedJob]) -> set[UUID]:
        """Give back claimed jobs that were never started (the attempt is not counted)."""
        jobs = list(jobs)
        if not jobs:
            return set()
        rows = self._query(
            queries.RELEASE_JOBS,
            {"owner": owner, "tenant_ids": [j.tenant_id for j in jobs],
             "job_ids": [j.id for j in jobs], "tokens": [j.lease_token for j in jobs]},
        )
        return {row["job_id"] for row in rows}

    # Worker pool --------------------------------------------------------------------
    #
    # Each is safe to repeat after a reconnect: a join refreshes the owner's own place,
    # leave and release delete at most one, a wake is debounced; a reservation repeated
    # after its first try committed holds its room until its hold ends, never more than
    # the maximum.

    def join_worker_pool(self, owner: str, reason: str, reservation: UUID | None,
                         max_workers: int, expires_in: float,
                         queue: str = DEFAULT_QUEUE) -> bool:
        """Take a place in the worker pool for this invocation: the one ``reservation``
        names (reserved for it by a fan-out; a wake's ticket is consumed and holds no
        room), the owner's own place (its expiry refreshed), or free room under the
        maximum: the schema owner's, or ``max_workers`` where that is lower. A
        ``schedule`` or ``manual`` start in a full pool takes the oldest reservation, or
        the one extra place when running invocations hold every place. False when the
        pool is full: the invocation must return without claiming (a duplicate or
        retried event, a second tick while one holds the extra place). The place
        expires ``expires_in`` seconds from now (the invocation's time left plus a
        margin; at most 16 minutes) unless joined again or left. The pool is ``queue``'s
        own (each named queue has one); a paused queue's pool takes no join (False)."""
        rows = self._query(queries.JOIN_WORKER_POOL, {
            "owner": owner, "reason": reason, "reservation": reservation,
            "max_workers": max_workers, "expires_in": _seconds("expires_in", expires_in),
            "queue": queue})
        return bool(rows[0]["joined"])

    def leave_worker_pool(self, owner: str) -> None:
        """Free the owner's place at once (the end of its invocation, also after a
        failure); nothing when it holds none."""
        self._query(queries.LEAVE_WORKER_POOL, {"owner": owner})

    def reserve_worker_places(self, wanted: int, max_workers: int,
                              hold: float, queue: str = DEFAULT_QUEUE) -> list[UUID]:
        """Reserve up to ``wanted`` places, as many as the maximum leaves room for (the
        schema owner's, or ``max_workers`` where that is lower): one per invocation to
        start, each named by that invocation's event. A reservation no invocation takes
        frees its room after the owner's start hold, or ``hold`` seconds where that is
        shorter. In ``queue``'s pool; none while the queue is paused."""
        rows = self._query(queries.RESERVE_WORKER_PLACES, {
            "wanted": wanted, "max_workers": max_workers, "hold": _seconds("hold", hold),
            "queue": queue})
        return [row["place"] for row in rows]

    def release_worker_place(self, place: UUID) -> None:
        """Free a reservation, or give back a wake's ticket, whose invocation could not
        be started (the invoke failed); a place an invocation already took is left
        alone."""
        self._query(queries.RELEASE_WORKER_PLACE, {"place": place})

    def wake_worker_place(self, queue: str = DEFAULT_QUEUE) -> UUID | None:
        """After an enqueue: a ticket for one invocation to start (its event names it),
        when no worker is polling or starting, and this login's last wake is older than
        the schema owner's debounce and its last ticket was used or has expired; else
        None (the common answer, without waiting for any lock). The ticket holds no
        room: the invocation joins with free room. Nothing here is the caller's choice
        but the queue, whose pool is woken (never while it is paused)."""
        (row,) = self._query(queries.WAKE_WORKER_PLACE, {"queue": queue})
        place: UUID | None = row["place"]
        return place

    def queue_worker_function(self, queue: str) -> str | None:
        """The worker function (name or ARN) that ``queue``'s deploy registered, or None:
        what a wake of a queue declared in a stack of its own starts, since no enqueue
        function's environment names it."""
        (row,) = self._query(queries.QUEUE_WORKER_FUNCTION, {"queue": queue})
        function: str | None = row["function_name"]
        return function

    def worker_pool_size(self, queue: str | None = None) -> PoolSize:
        """The unexpired places: held by running invocations and reserved for starting
        ones; of ``queue``'s pool, or of every queue's when None."""
        (row,) = self._query(queries.WORKER_POOL_SIZE, {"queue": queue})
        return PoolSize(live=int(row["live"]), reserved=int(row["reserved"]))

    # Named queues (sql/functions/queues.sql) -----------------------------------------

    def pause_queue(self, queue: str, actor: str, reason: str | None = None) -> QueueState:
        """Pause ``queue`` (app.pause_queue, an operator's call): its jobs are not
        claimed and its pool neither fans out nor wakes until :meth:`resume_queue`; jobs
        running finish. Audited with ``actor`` and the login; pausing again is a no-op."""
        (row,) = self._query(queries.PAUSE_QUEUE,
                             {"queue": queue, "actor": actor, "reason": reason})
        return QueueState.from_row(row)

    def resume_queue(self, queue: str, actor: str) -> QueueState:
        """Resume a paused ``queue`` (app.resume_queue), audited with ``actor``."""
        (row,) = self._query(queries.RESUME_QUEUE, {"queue": queue, "actor": actor})
        return QueueState.from_row(row)

    def queue_overview(self, queue: str | None = None) -> list[QueueOverview]:
        """Every queue's (or one's) depth, oldest ready job, running, retrying and dead
        jobs, pool and pause (app.queue_overview), by name."""
        rows = self._query(queries.QUEUE_OVERVIEW, {"queue": queue})
        return [QueueOverview.from_row(row) for row in rows]

    def queue_state(self, queue: str) -> QueueState:
        """``queue``'s pause (app.queue_state, one key probe): what a worker checks
        before it drains."""
        (row,) = self._query(queries.QUEUE_STATE, {"queue": queue})
        return QueueState.from_row(row)

    def queue_history(self, queue: str, limit: int = 100) -> list[dict[str, Any]]:
        """A queue's pauses and resumes, newest first: actor, login, reason, time."""
        return self._query(queries.QUEUE_HISTORY, {"queue": queue, "limit": limit})

    # Reaper -------------------------------------------------------------------------

    def release_expired_jobs(self, tenant_id: UUID, limit: int = 100) -> int:
        """Give one tenant's expired leases back to the queue; how many were released."""
        rows = self._query(queries.RELEASE_EXPIRED_JOBS, {"tenant_id": tenant_id, "limit": limit})
        return int(rows[0]["released"])

    def release_all_expired_jobs(self, limit: int = 1000) -> int:
        """Give up to ``limit`` expired leases of every tenant back, oldest expiry first
        (the reaper's call); fewer than ``limit`` means none are left."""
        rows = self._query(queries.RELEASE_ALL_EXPIRED_JOBS, {"limit": limit})
        return int(rows[0]["released"])

    def repair_tenant_turns(self, limit: int = 1000) -> tuple[int, int]:
        """Check the next ``limit`` tenants that have claimable jobs and give a turn to any
        that lacks one; returns (tenants checked, turns repaired). Fewer checked than
        ``limit`` means the sweep reached the last tenant and starts again."""
        (row,) = self._query(queries.REPAIR_TENANT_TURNS, {"limit": limit})
        return int(row["tenants_checked"]), int(row["turns_repaired"])

    def end_stalled_sessions(self) -> list[StalledSession]:
        """End the sessions of readers and runtime logins that are idle in a transaction,
        or run one statement, longer than their caps allow (app.end_stalled_sessions):
        one :class:`StalledSession` per session ended, refused or unseen."""
        rows = self._query(queries.END_STALLED_SESSIONS, {})
        return [StalledSession(pid=int(row["pid"]), login=str(row["login"]),
                               state=row["state"], stalled_for=row["stalled_for"],
                               outcome=row["outcome"]) for row in rows]

    # Schedules (sql/functions/schedules.sql) ------------------------------------------

    def tick_schedules(self, limit: int = 100) -> list[TickedSchedule]:
        """Enqueue the due slots of up to ``limit`` schedules (the reaper's call; slots
        from the database's clock); one :class:`TickedSchedule` per schedule ticked.
        Fewer than ``limit`` means none are left due."""
        rows = self._query(queries.TICK_SCHEDULES, {"limit": limit})
        return [TickedSchedule(**row) for row in rows]

    def put_schedule(self, schedule: Schedule, *, source: str = "operator") -> dict[str, Any]:
        """Create or change a schedule; its id, ``status`` (created, updated, unchanged)
        and next slot. An operator's (or the owner's) call."""
        (row,) = self._query(queries.PUT_SCHEDULE, {
            "tenant_id": schedule.tenant_id, "name": schedule.name, "kind": schedule.kind,
            "expression": schedule.expression, "time_zone": schedule.time_zone,
            "payload": Jsonb(schedule.payload), "fill_limit": schedule.fill_limit,
            "max_attempts": schedule.max_attempts, "source": source})
        return row

    def pause_schedule(self, tenant_id: UUID, name: str, *, paused: bool = True
                       ) -> dict[str, Any]:
        """Pause (or, with ``paused=False``, resume) a schedule; InvalidRequestError when
        there is none of that name. Slots missed while paused follow its fill limit."""
        (row,) = self._query(queries.PAUSE_SCHEDULE,
                             {"tenant_id": tenant_id, "name": name, "paused": paused})
        return row

    def remove_schedule(self, tenant_id: UUID, name: str) -> bool:
        """Remove a schedule (its jobs stay); whether there was one."""
        (row,) = self._query(queries.REMOVE_SCHEDULE, {"tenant_id": tenant_id, "name": name})
        return bool(row["removed"])

    def list_schedules(self, tenant_id: UUID | None = None, next_slots: int = 3
                       ) -> list[dict[str, Any]]:
        """Every schedule (of one tenant, or all): its definition, its next slots, the
        last slot enqueued and its job's id and state, its counters."""
        return self._query(queries.LIST_SCHEDULES, {"tenant_id": tenant_id, "next": next_slots})

    def sync_schedules(self, schedules: Sequence[Schedule]) -> list[dict[str, Any]]:
        """Make the code-declared schedules exactly ``schedules``: each created, updated
        or unchanged, every other code-declared one removed (operators' are left alone)."""
        return self._query(queries.SYNC_SCHEDULES, {
            "tenant_ids": [s.tenant_id for s in schedules],
            "names": [s.name for s in schedules], "kinds": [s.kind for s in schedules],
            "expressions": [s.expression for s in schedules],
            "time_zones": [s.time_zone for s in schedules],
            "payloads": [Jsonb(s.payload) for s in schedules],
            "fill_limits": [s.fill_limit for s in schedules],
            "max_attempts": [s.max_attempts for s in schedules]})

    # Limits (functions/admission.sql) ------------------------------------------------

    def set_limit(self, actor: str, name: LimitName, *, concurrency: int | None = None,
                  rate: Rate | None = None) -> str:
        """Set an operator's limit on ``name`` (in force over a code-declared one), at
        run time: a raised limit admits held jobs at once. Returns the limit's name. A
        limit that could never admit is refused (InvalidRequestError) before sending."""
        check_concurrency(concurrency)
        if concurrency is None and rate is None:
            raise InvalidRequestError("a limit needs a concurrency, a rate, or both",
                                      sqlstate="22023")
        (row,) = self._query(queries.SET_LIMIT, {
            "actor": actor, "scope": name.scope, "kind": name.kind, "tenant_id": name.tenant_id,
            "limit_key": name.limit_key, "concurrency": concurrency,
            "rate_count": None if rate is None else rate.count,
            "rate_period": None if rate is None else rate.period,
            "burst": None if rate is None else rate.burst})
        return str(row["name"])

    def remove_limit(self, name: LimitName) -> bool:
        """Remove the operator's limit on ``name`` (a code-declared one is in force
        again); held jobs it no longer governs are admitted. False when there was none."""
        (row,) = self._query(queries.REMOVE_LIMIT, {
            "scope": name.scope, "kind": name.kind, "tenant_id": name.tenant_id,
            "limit_key": name.limit_key})
        return bool(row["removed"])

    def list_limits(self) -> list[dict[str, Any]]:
        """Every limit declared, operators' and code's, and whether each is in force."""
        return self._query(queries.LIST_LIMITS, {})

    def sync_limits(self, limits: Sequence[DeclaredLimit]) -> list[dict[str, Any]]:
        """Make the code-declared limits exactly ``limits`` (operators' are left alone):
        each put, every other code-declared one removed."""
        return self._query(queries.SYNC_LIMITS, {
            "kinds": [x.kind for x in limits], "per_tenant": [x.per_tenant for x in limits],
            "concurrency": [x.concurrency for x in limits],
            "rate_counts": [None if x.rate is None else x.rate.count for x in limits],
            "rate_periods": [None if x.rate is None else x.rate.period for x in limits],
            "bursts": [None if x.rate is None else x.rate.burst for x in limits]})

    def limit_status(self) -> list[dict[str, Any]]:
        """Each limit instance in use (bucket): jobs admitted, running, held back, and
        when the oldest held one was held."""
        return self._query(queries.LIMIT_STATUS, {})

    def admit_held_jobs(self, limit: int = 1000) -> int:
        """Admit held jobs wherever a limit has a free slot (the reaper's pass, for what a
        race or a due time left waiting); the number admitted."""
        (row,) = self._query(queries.ADMIT_HELD_JOBS, {"limit": limit})
        return int(row["admitted"])

    # Retention ----------------------------------------------------------------------

    def prune_jobs(self, older_than: timedelta, limit: int = 1000) -> tuple[int, int]:
        """Delete up to ``limit`` jobs finished before ``older_than`` ago, with their
        events; returns (jobs deleted, events deleted). An operator's call: any age."""
        (row,) = self._query(queries.PRUNE_JOBS, {"older_than": older_than, "limit": limit})
        return int(row["jobs_deleted"]), int(row["events_deleted"])

    def prune_retained_jobs(self, older_than: timedelta, limit: int = 1000) -> tuple[int, int]:
        """The reaper's :meth:`prune_jobs`: ``older_than`` below the database's retention
        floor (``app.settings.min_retention``, set by the schema owner) is refused with
        InvalidRequestError and deletes nothing, so a reaper login cannot empty the
        recent history whatever it is configured with."""
        (row,) = self._query(queries.PRUNE_RETAINED_JOBS,
                             {"older_than": older_than, "limit": limit})
        return int(row["jobs_deleted"]), int(row["events_deleted"])

    def roll_event_days(self) -> tuple[int, int]:
        """Make the audit trail's day partitions ahead of time and close the past days,
        so every event has its day and retention can drop a whole day (the reaper's pass;
        a day whose lock is busy is made on a later pass). Returns (days added, days
        closed)."""
        (row,) = self._query(queries.ROLL_EVENT_DAYS, {})
        return int(row["days_added"]), int(row["days_closed"])

    # Operator (sql/functions/operate.sql): reads and audited changes --------------------

    def queue_status(self, tenant_id: UUID | None = None) -> list[dict[str, Any]]:
        """Jobs per tenant and state, with the ready jobs, the oldest ready job's age and
        when the next job becomes ready (app.queue_status); one tenant's, or every one."""
        return self._query(queries.QUEUE_STATUS, {"tenant_id": tenant_id})

    def get_job(self, job_id: UUID) -> dict[str, Any] | None:
        """One job of any tenant without its lease token, or None (app.get_job)."""
        rows = self._query(queries.GET_JOB, {"job_id": job_id})
        return rows[0] if rows else None

    def job_wait_reasons(self, job_ids: Sequence[UUID]) -> list[dict[str, Any]]:
        """Why each of these jobs (1..500, of any tenant) is not running: ``reason``
        (scheduled, retry_wait, behind_priority, queued, ready; None when not waiting),
        ``until``, ``jobs_ahead`` and ``higher_priority_ahead`` (app.job_wait_reasons)."""
        return self._query(queries.JOB_WAIT_REASONS, {"job_ids": list(job_ids)})

    def waiting_jobs(self, tenant_id: UUID | None = None) -> list[dict[str, Any]]:
        """The waiting jobs per tenant and reason, with the earliest time of each
        (app.waiting_jobs); one tenant's, or every one."""
        return self._query(queries.WAITING_JOBS, {"tenant_id": tenant_id})

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[dict[str, Any]]:
        """The job's audit events in order, at most ``limit`` (app.job_timeline)."""
        return self._query(queries.JOB_TIMELINE, {"job_id": job_id, "limit": limit})

    def dead_jobs(self, tenant_id: UUID | None = None, kind: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
        """Dead jobs, most recent first, with the reason they died (app.dead_jobs)."""
        return self._query(queries.DEAD_JOBS,
                           {"tenant_id": tenant_id, "kind": kind, "limit": limit})

    def redrive_jobs(self, actor: str, selection: Selection, *, reason: str | None = None,
                     limit: int | None = None) -> list[dict[str, Any]]:
        """Dead jobs of ``selection`` back to pending with a fresh set of attempts, each
        with a 'redriven' event naming ``actor`` (app.redrive_jobs); at most ``limit``
        (None: all). Returns the jobs changed: a selected job that is not dead is not."""
        return self._in_batches(queries.REDRIVE_JOBS, actor, selection, reason, limit)

    def cancel_jobs(self, actor: str, selection: Selection, *, reason: str | None = None,
                    limit: int | None = None) -> list[dict[str, Any]]:
        """Pending and retry_wait jobs of ``selection`` become cancelled, each with a
        'cancelled' event naming ``actor`` (app.cancel_jobs); as :meth:`redrive_jobs`."""
        return self._in_batches(queries.CANCEL_JOBS, actor, selection, reason, limit)

    def redrive_jobs_by_id(self, actor: str, job_ids: Sequence[UUID], *,
                           reason: str | None = None) -> list[dict[str, Any]]:
        """The dead jobs among ``job_ids`` (1 to MAX_OPERATOR_BATCH ids) back to pending,
        each with a 'redriven' event naming ``actor`` (app.redrive_jobs_by_id: the
        dashboard's form, never a filter). An empty list is refused, never "every job"."""
        return self._query(queries.REDRIVE_JOBS_BY_ID,
                           {"actor": actor, "job_ids": list(job_ids), "reason": reason})

    def cancel_jobs_by_id(self, actor: str, job_ids: Sequence[UUID], *,
                          reason: str | None = None) -> list[dict[str, Any]]:
        """The pending and retry_wait jobs among ``job_ids`` become cancelled, as
        :meth:`redrive_jobs_by_id` (app.cancel_jobs_by_id)."""
        return self._query(queries.CANCEL_JOBS_BY_ID,
                           {"actor": actor, "job_ids": list(job_ids), "reason": reason})

    def request_job_cancel(self, actor: str, job_ids: Sequence[UUID], *,
                           reason: str | None = None) -> list[dict[str, Any]]:
        """Cancel the named jobs (1 to MAX_OPERATOR_BATCH ids) whatever they are doing
        (app.request_job_cancel): pending and retry_wait ones at once, running ones by a
        cancel request naming ``actor``, which their worker learns at its next lease
        renewal or outcome; the job then ends cancelled. One row per job acted on, with
        its ``state`` after the call (``cancelled``, or ``running`` with
        ``cancel_requested_at`` and ``cancel_requested_by``); finished jobs give none."""
        return self._query(queries.REQUEST_JOB_CANCEL,
                           {"actor": actor, "job_ids": list(job_ids), "reason": reason})

    def _in_batches(self, query: LiteralString, actor: str, selection: Selection,
                    reason: str | None, limit: int | None) -> list[dict[str, Any]]:
        """Repeat a bounded change until it comes back short (or ``limit`` is reached).

        Each call is its own short transaction of at most MAX_OPERATOR_BATCH jobs, so a
        redrive or cancel of a large backlog never holds many row locks at once.
        """
        done: list[dict[str, Any]] = []
        ids = list(selection.job_ids)
        id_chunks: Sequence[list[UUID] | None] = (
            [ids[i:i + MAX_OPERATOR_BATCH] for i in range(0, len(ids), MAX_OPERATOR_BATCH)]
            if ids else [None])
        for chunk in id_chunks:
            while limit is None or len(done) < limit:
                size = MAX_OPERATOR_BATCH if limit is None else min(
                    MAX_OPERATOR_BATCH, limit - len(done))
                rows = self._query(query, {
                    "actor": actor, "tenant_id": selection.tenant_id, "job_ids": chunk,
                    "kind": selection.kind, "limit": size, "reason": reason})
                done.extend(rows)
                if len(rows) < size:
                    break
        return done

    # Dashboard reads (sql/functions/read.sql) -----------------------------------------
    # The operator forms see every tenant. The reader forms run as a tenant reader: each
    # is one short transaction that first selects ``reader_tenant`` (app.tenant_id,
    # transaction-local), so row-level security picks the rows and a connection reused
    # for another viewer never keeps the previous viewer's tenant.

    def queue_depth(self, tenant_id: UUID | None = None, kind: str | None = None,
                    limit: int = 20) -> list[dict[str, Any]]:
        """Unfinished and dead jobs per tenant, per kind and in total (app.queue_depth)."""
        return self._query(queries.QUEUE_DEPTH,
                           {"tenant_id": tenant_id, "kind": kind, "limit": limit})

    def queue_depth_by_kind(self) -> list[dict[str, Any]]:
        """Unfinished jobs per kind (app.queue_depth's kind rows: pending, ready, running,
        retry_wait; at most the 200 kinds that have waited longest)."""
        rows = self.queue_depth(limit=1)
        return [row for row in rows if row["dimension"] == "kind"]

    def job_activity(self, tenant_id: UUID | None = None, kind: str | None = None, *,
                     window: timedelta = timedelta(hours=24), buckets: int = 24,
                     samples: int = 20) -> list[dict[str, Any]]:
        """Finished jobs and start latency per time bucket (app.job_activity)."""
        return self._query(queries.JOB_ACTIVITY, _activity_params(
            tenant_id, kind, window, buckets, samples))

    def list_jobs(self, state: str, *, tenant_id: UUID | None = None, kind: str | None = None,
                  since: datetime | None = None, until: datetime | None = None,
                  after_at: datetime | None = None, after_id: UUID | None = None,
                  limit: int = 50) -> list[dict[str, Any]]:
        """One keyset page of the jobs in ``state`` (app.list_jobs): those after
        (``after_at``, ``after_id``), between ``since`` and ``until`` of the state's
        sort time."""
        return self._query(queries.LIST_JOBS, {
            "state": state, "tenant_id": tenant_id, "kind": kind, "since": since,
            "until": until, "after_at": after_at, "after_id": after_id, "limit": limit})

    def reader_queue_depth(self, reader_tenant: UUID, tenant_id: UUID | None = None,
                           kind: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """:meth:`queue_depth` as ``reader_tenant``'s reader (app.reader_queue_depth)."""
        return self._as_reader(reader_tenant, queries.READER_QUEUE_DEPTH,
                               {"tenant_id": tenant_id, "kind": kind, "limit": limit})

    def reader_job_activity(self, reader_tenant: UUID, tenant_id: UUID | None = None,
                            kind: str | None = None, *, window: timedelta = timedelta(hours=24),
                            buckets: int = 24, samples: int = 20) -> list[dict[str, Any]]:
        """:meth:`job_activity` as ``reader_tenant``'s reader (app.reader_job_activity)."""
        return self._as_reader(reader_tenant, queries.READER_JOB_ACTIVITY, _activity_params(
            tenant_id, kind, window, buckets, samples))

    def reader_list_jobs(self, reader_tenant: UUID, state: str, *,
                         tenant_id: UUID | None = None, kind: str | None = None,
                         since: datetime | None = None, until: datetime | None = None,
                         after_at: datetime | None = None, after_id: UUID | None = None,
                         limit: int = 50) -> list[dict[str, Any]]:
        """:meth:`list_jobs` as ``reader_tenant``'s reader (app.reader_list_jobs)."""
        return self._as_reader(reader_tenant, queries.READER_LIST_JOBS, {
            "state": state, "tenant_id": tenant_id, "kind": kind, "since": since,
            "until": until, "after_at": after_at, "after_id": after_id, "limit": limit})

    def reader_get_job(self, reader_tenant: UUID, job_id: UUID) -> dict[str, Any] | None:
        """:meth:`get_job` as ``reader_tenant``'s reader: None for another tenant's job
        too (app.reader_get_job)."""
        rows = self._as_reader(reader_tenant, queries.READER_GET_JOB, {"job_id": job_id})
        return rows[0] if rows else None

    def reader_job_wait_reasons(self, reader_tenant: UUID,
                                job_ids: Sequence[UUID]) -> list[dict[str, Any]]:
        """:meth:`job_wait_reasons` as ``reader_tenant``'s reader: no row for another
        tenant's job, and only its own jobs counted ahead (app.reader_job_wait_reasons)."""
        return self._as_reader(reader_tenant, queries.READER_JOB_WAIT_REASONS,
                               {"job_ids": list(job_ids)})

    def reader_job_timeline(self, reader_tenant: UUID, job_id: UUID,
                            limit: int = 1000) -> list[dict[str, Any]]:
        """:meth:`job_timeline` as ``reader_tenant``'s reader (app.reader_job_timeline)."""
        return self._as_reader(reader_tenant, queries.READER_JOB_TIMELINE,
                               {"job_id": job_id, "limit": limit})

    def _as_reader(self, reader_tenant: UUID, query: LiteralString,
                   params: Mapping[str, Any]) -> list[dict[str, Any]]:
        def run(conn: Connection) -> list[dict[str, Any]]:
            with translate_errors(conn), conn.transaction():
                fetch_rows(conn, queries.SET_READER_TENANT, {"tenant_id": str(reader_tenant)})
                return fetch_rows(conn, query, params)

        return self._call(run)
