"""QueueClient: one method per SQL function, over one reusable connection.

The client owns a single connection (no pool: a Lambda execution environment runs one
invocation at a time) and re-validates it before use, because a connection frozen
with its execution environment may be dead when the environment thaws. Every call
is safe to repeat once after a reconnect: enqueue is idempotent, finishes and renewals
are fenced by the lease token, and a repeated claim at worst leaves a lease to expire.

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
from psycopg.types.json import Jsonb

from leaseq import queries
from leaseq.db import Connection, fetch_rows, prepare_connection
from leaseq.errors import DatabaseUnavailableError, IdempotencyConflictError, InvalidRequestError
from leaseq.jobs import ClaimedJob, EnqueueRequest, EnqueueResult, JobOutcome, JobState
from leaseq.pool import PoolSize

T = TypeVar("T")

#: Reconnect proactively after this long without use: idle connections of frozen
#: Lambda environments are purged by the network long before a server would notice.
DEFAULT_MAX_IDLE_SECONDS = 240.0


def enqueue_jobs(conn: psycopg.Connection[Any],
                 requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
    """Enqueue many jobs in one round trip on the caller's connection.

    Runs inside the caller's open transaction when there is one, so the jobs exist if
    and only if the caller's work commits. Conflicts are reported per item, not raised,
    and so are items the database rejects (status "rejected", with its 22023 message in
    ``error``): the batch's other items are stored all the same.
    """
    if not requests:
        return []
    params = {
        "tenant_ids": [r.tenant_id for r in requests],
        "operation_keys": [r.operation_key for r in requests],
        "kinds": [r.kind for r in requests],
        "payloads": [Jsonb(r.payload) for r in requests],
        "available_ats": [r.available_at for r in requests],
        "max_attempts": [r.max_attempts for r in requests],
        "correlation_ids": [r.correlation_id for r in requests],
    }
    rows = fetch_rows(conn, queries.ENQUEUE_JOBS, params)
    return [
        EnqueueResult(
            index=int(row["ord"]) - 1,
            job_id=row["job_id"],
            status=row["status"],
            state=None if row["state"] is None else JobState(row["state"]),
            error=row["error"],
        )
        for row in rows
    ]


def enqueue_job(conn: psycopg.Connection[Any], request: EnqueueRequest) -> EnqueueResult:
    """Enqueue one job on the caller's connection; a conflicting repeat raises, and so
    does a request the database rejects (InvalidRequestError, SQLSTATE 22023)."""
    (result,) = enqueue_jobs(conn, [request])
    if result.status == "rejected":
        raise InvalidRequestError(result.error or "the job was rejected", sqlstate="22023")
    if result.status == "conflict":
        raise IdempotencyConflictError(
            f"operation_key {request.operation_key!r} of tenant {request.tenant_id} already "
            f"names job {result.job_id} with a different kind or payload; use a new "
            "operation_key for a different job, or repeat the original kind and payload",
            sqlstate="23505",
        )
    return result


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
    """The queue's SQL contract as methods, named after the functions they call."""

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
        if not requests:
            return []
        return self._call(lambda conn: enqueue_jobs(conn, requests))

    def enqueue_job(self, request: EnqueueRequest) -> EnqueueResult:
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

    # Claim and lease ----------------------------------------------------------------

    def claim_ready_jobs(self, owner: str, limit: int, lease: timedelta) -> list[ClaimedJob]:
        rows = self._query(
            queries.CLAIM_READY_JOBS, {"owner": owner, "limit": limit, "lease": lease}
        )
        return [ClaimedJob.from_row(row) for row in rows]

    def claim_jobs(self, tenant_id: UUID, owner: str, limit: int,
                   lease: timedelta) -> list[ClaimedJob]:
        rows = self._query(
            queries.CLAIM_JOBS,
            {"tenant_id": tenant_id, "owner": owner, "limit": limit, "lease": lease},
        )
        return [ClaimedJob.from_row(row) for row in rows]

    def ready_tenants(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._query(queries.READY_TENANTS, {"limit": limit})

    def oldest_ready_at(self) -> datetime | None:
        """available_at of the oldest job ready now, of any tenant (None when none): one
        index probe, whatever the number of tenants."""
        (row,) = self._query(queries.OLDEST_READY_AT, {})
        oldest: datetime | None = row["oldest_ready_at"]
        return oldest

    def renew_job_lease(self, job: ClaimedJob, lease: timedelta) -> bool:
        rows = self._query(
            queries.RENEW_JOB_LEASE,
            {"tenant_id": job.tenant_id, "job_id": job.id, "owner": job.lease_owner,
             "token": job.lease_token, "lease": lease},
        )
        return bool(rows[0]["renewed"])

    # Finish -------------------------------------------------------------------------

    def finish_jobs(self, owner: str, outcomes: Sequence[JobOutcome]) -> dict[UUID, JobState]:
        """Record outcomes in one statement; jobs whose lease was lost are absent."""
        if not outcomes:
            return {}
        rows = self._query(queries.FINISH_JOBS, _outcome_params(owner, outcomes))
        return {row["job_id"]: JobState(row["state"]) for row in rows}

    def finish_and_claim_jobs(
        self, owner: str, outcomes: Sequence[JobOutcome], limit: int, lease: timedelta
    ) -> tuple[dict[UUID, JobState], list[ClaimedJob]]:
        """Record a batch's outcomes and claim the next batch: one round trip, one commit.

        Returns the states of the outcomes applied (a lost lease is absent) and the
        jobs claimed. A refused outcome refuses the claim too (one transaction).
        """
        params = {**_outcome_params(owner, outcomes), "limit": limit, "lease": lease}
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
                         max_workers: int, expires_in: float) -> bool:
        """Take a place in the worker pool for this invocation: the one ``reservation``
        names (reserved for it by a fan-out or a wake), the owner's own place (its
        expiry refreshed), or free room under ``max_workers``. False when the pool is
        full: the invocation must return without claiming (a duplicate or retried
        event, a tick while the pool is full). ``reason`` is ``schedule``, ``manual``,
        ``fanout`` or ``wake``; the place expires ``expires_in`` seconds from now (the
        invocation's time left plus a margin) unless joined again or left."""
        rows = self._query(queries.JOIN_WORKER_POOL, {
            "owner": owner, "reason": reason, "reservation": reservation,
            "max_workers": max_workers, "expires_in": _seconds("expires_in", expires_in)})
        return bool(rows[0]["joined"])

    def leave_worker_pool(self, owner: str) -> None:
        """Free the owner's place at once (the end of its invocation, also after a
        failure); nothing when it holds none."""
        self._query(queries.LEAVE_WORKER_POOL, {"owner": owner})

    def reserve_worker_places(self, wanted: int, max_workers: int,
                              hold: float) -> list[UUID]:
        """Reserve up to ``wanted`` places, as many as ``max_workers`` leaves room for:
        one per invocation to start, each named by that invocation's event. A
        reservation no invocation takes frees its room after ``hold`` seconds."""
        rows = self._query(queries.RESERVE_WORKER_PLACES, {
            "wanted": wanted, "max_workers": max_workers, "hold": _seconds("hold", hold)})
        return [row["place"] for row in rows]

    def release_worker_place(self, place: UUID) -> None:
        """Free a reservation whose invocation could not be started (the invoke failed);
        a place an invocation already took is left alone."""
        self._query(queries.RELEASE_WORKER_PLACE, {"place": place})

    def wake_worker_place(self, debounce: float, hold: float, max_workers: int) -> UUID | None:
        """After an enqueue: a reserved place for one invocation to start, when no worker
        is polling or starting and the last wake is older than ``debounce`` seconds;
        else None (the common answer, without waiting for any lock). The reservation
        frees its room after ``hold`` seconds unless an invocation takes it."""
        (row,) = self._query(queries.WAKE_WORKER_PLACE, {
            "debounce": _seconds("debounce", debounce), "hold": _seconds("hold", hold),
            "max_workers": max_workers})
        place: UUID | None = row["place"]
        return place

    def worker_pool_size(self) -> PoolSize:
        """The unexpired places: held by running invocations and reserved for starting
        ones."""
        (row,) = self._query(queries.WORKER_POOL_SIZE, {})
        return PoolSize(live=int(row["live"]), reserved=int(row["reserved"]))

    # Reaper -------------------------------------------------------------------------

    def release_expired_jobs(self, tenant_id: UUID, limit: int = 100) -> int:
        rows = self._query(queries.RELEASE_EXPIRED_JOBS, {"tenant_id": tenant_id, "limit": limit})
        return int(rows[0]["released"])

    def release_all_expired_jobs(self, limit: int = 1000) -> int:
        rows = self._query(queries.RELEASE_ALL_EXPIRED_JOBS, {"limit": limit})
        return int(rows[0]["released"])

    def repair_tenant_turns(self, limit: int = 1000) -> tuple[int, int]:
        """Check the next ``limit`` tenants that have claimable jobs and give a turn to any
        that lacks one; returns (tenants checked, turns repaired). Fewer checked than
        ``limit`` means the sweep reached the last tenant and starts again."""
        (row,) = self._query(queries.REPAIR_TENANT_TURNS, {"limit": limit})
        return int(row["tenants_checked"]), int(row["turns_repaired"])

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
