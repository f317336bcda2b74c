"""What a dashboard reads and does, as Python calls of the SQL functions that do it.

Two implementations of one protocol, so a page never knows who is looking:

* :class:`OperatorViews`, on a connection of a ``service_role`` member: the operator
  forms of the reads (every tenant) and the two actions, redrive and cancel;
* :class:`TenantViews`, on a connection of a tenant reader (a member of
  ``authenticated`` bound in ``app.tenant_readers``): each read runs in its own short
  transaction that first selects the tenant (``app.tenant_id``, transaction-local),
  then calls the reader form, so row-level security decides which rows come back. It
  has no actions: a reader is granted none.

Like the rest of the library, no SQL text lives here (see :mod:`leaseq.queries`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString, Protocol
from uuid import UUID

from leaseq import queries
from leaseq.db import Connection, translate_errors

#: Job states, in the order a dashboard lists them.
STATES: tuple[str, ...] = ("pending", "running", "retry_wait", "succeeded", "dead", "cancelled")

Row = dict[str, Any]


@dataclass(frozen=True)
class JobFilter:
    """The filters of a job list (None = any). ``since``/``until`` bound the list's own
    sort time: available_at for pending and retry_wait, lease expiry for running,
    completion for finished jobs."""

    state: str
    tenant_id: UUID | None = None
    kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: the last row's sort time and id (keyset paging)."""

    after_at: datetime
    after_id: UUID


class QueueViews(Protocol):
    """The reads a dashboard page needs, whoever the viewer is."""

    def queue_depth(self, tenant_id: UUID | None = None, kind: str | None = None,
                    limit: int = 20) -> list[Row]:
        """Unfinished and dead jobs per tenant, per kind and in total (app.queue_depth)."""
        ...

    def job_activity(self, tenant_id: UUID | None = None, kind: str | None = None, *,
                     window: timedelta = timedelta(hours=24), buckets: int = 24,
                     samples: int = 20) -> list[Row]:
        """Finished jobs and start latency per time bucket (app.job_activity)."""
        ...

    def list_jobs(self, where: JobFilter, after: Cursor | None = None,
                  limit: int = 50) -> list[Row]:
        """One keyset page of the jobs in a state (app.list_jobs)."""
        ...

    def get_job(self, job_id: UUID) -> Row | None:
        """One job without its lease token, or None (app.get_job)."""
        ...

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[Row]:
        """The job's audit events in order (app.job_timeline)."""
        ...


def _list_params(where: JobFilter, after: Cursor | None, limit: int) -> dict[str, Any]:
    return {"state": where.state, "tenant_id": where.tenant_id, "kind": where.kind,
            "since": where.since, "until": where.until,
            "after_at": after.after_at if after else None,
            "after_id": after.after_id if after else None, "limit": limit}


def _activity_params(tenant_id: UUID | None, kind: str | None, window: timedelta,
                     buckets: int, samples: int) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "kind": kind, "window": window, "buckets": buckets,
            "samples": samples}


class OperatorViews:
    """Every tenant's jobs, and the operator's actions, on a service_role connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _rows(self, query: LiteralString, params: dict[str, Any]) -> list[Row]:
        with translate_errors():
            return self.conn.execute(query, params).fetchall()

    def queue_depth(self, tenant_id: UUID | None = None, kind: str | None = None,
                    limit: int = 20) -> list[Row]:
        """See :meth:`QueueViews.queue_depth`."""
        return self._rows(queries.QUEUE_DEPTH,
                          {"tenant_id": tenant_id, "kind": kind, "limit": limit})

    def job_activity(self, tenant_id: UUID | None = None, kind: str | None = None, *,
                     window: timedelta = timedelta(hours=24), buckets: int = 24,
                     samples: int = 20) -> list[Row]:
        """See :meth:`QueueViews.job_activity`."""
        return self._rows(queries.JOB_ACTIVITY,
                          _activity_params(tenant_id, kind, window, buckets, samples))

    def list_jobs(self, where: JobFilter, after: Cursor | None = None,
                  limit: int = 50) -> list[Row]:
        """See :meth:`QueueViews.list_jobs`."""
        return self._rows(queries.LIST_JOBS, _list_params(where, after, limit))

    def get_job(self, job_id: UUID) -> Row | None:
        """See :meth:`QueueViews.get_job`."""
        rows = self._rows(queries.GET_JOB, {"job_id": job_id})
        return rows[0] if rows else None

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[Row]:
        """See :meth:`QueueViews.job_timeline`."""
        return self._rows(queries.JOB_TIMELINE, {"job_id": job_id, "limit": limit})

    def redrive_jobs(self, actor: str, job_ids: Sequence[UUID],
                     reason: str | None = None) -> list[Row]:
        """Dead jobs among ``job_ids`` back to pending, each with a 'redriven' event
        naming ``actor``; returns the jobs it changed (others were not dead)."""
        return self._rows(queries.REDRIVE_JOBS, {
            "actor": actor, "tenant_id": None, "job_ids": list(job_ids), "kind": None,
            "limit": max(1, len(job_ids)), "reason": reason})

    def cancel_jobs(self, actor: str, job_ids: Sequence[UUID],
                    reason: str | None = None) -> list[Row]:
        """Pending or retry_wait jobs among ``job_ids`` become cancelled, each with a
        'cancelled' event naming ``actor``; returns the jobs it changed."""
        return self._rows(queries.CANCEL_JOBS, {
            "actor": actor, "tenant_id": None, "job_ids": list(job_ids), "kind": None,
            "limit": max(1, len(job_ids)), "reason": reason})


class TenantViews:
    """One tenant's jobs, read as a tenant reader: row-level security filters them."""

    def __init__(self, conn: Connection, tenant_id: UUID) -> None:
        self.conn = conn
        self.tenant_id = tenant_id

    def _rows(self, query: LiteralString, params: dict[str, Any]) -> list[Row]:
        # The tenant is selected for this transaction only, so a connection reused for
        # another viewer can never keep the previous viewer's tenant.
        with translate_errors(), self.conn.transaction():
            self.conn.execute(queries.SET_READER_TENANT, {"tenant_id": str(self.tenant_id)})
            return self.conn.execute(query, params).fetchall()

    def queue_depth(self, tenant_id: UUID | None = None, kind: str | None = None,
                    limit: int = 20) -> list[Row]:
        """See :meth:`QueueViews.queue_depth` (only this reader's tenant)."""
        return self._rows(queries.READER_QUEUE_DEPTH,
                          {"tenant_id": tenant_id, "kind": kind, "limit": limit})

    def job_activity(self, tenant_id: UUID | None = None, kind: str | None = None, *,
                     window: timedelta = timedelta(hours=24), buckets: int = 24,
                     samples: int = 20) -> list[Row]:
        """See :meth:`QueueViews.job_activity` (only this reader's tenant)."""
        return self._rows(queries.READER_JOB_ACTIVITY,
                          _activity_params(tenant_id, kind, window, buckets, samples))

    def list_jobs(self, where: JobFilter, after: Cursor | None = None,
                  limit: int = 50) -> list[Row]:
        """See :meth:`QueueViews.list_jobs` (only this reader's tenant)."""
        return self._rows(queries.READER_LIST_JOBS, _list_params(where, after, limit))

    def get_job(self, job_id: UUID) -> Row | None:
        """See :meth:`QueueViews.get_job`: None for another tenant's job too."""
        rows = self._rows(queries.READER_GET_JOB, {"job_id": job_id})
        return rows[0] if rows else None

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[Row]:
        """See :meth:`QueueViews.job_timeline` (only this reader's tenant)."""
        return self._rows(queries.READER_JOB_TIMELINE, {"job_id": job_id, "limit": limit})
