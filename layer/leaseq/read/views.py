"""What a dashboard reads and does, as Python calls of the SQL functions that do it.

Two implementations of one protocol, so a page never knows who is looking:

* :class:`OperatorViews`, on the client of a ``leaseq_dashboard`` login (or an
  operator's): the operator forms of the reads (every tenant) and the two actions,
  redrive and cancel, by job id only (``app.redrive_jobs_by_id``,
  ``app.request_job_cancel``: a dashboard login may not act by filter);
* :class:`TenantViews`, on the client of a tenant reader (a member of
  ``authenticated`` bound in ``app.tenant_readers``): the reader forms, each one short
  transaction that first selects the tenant, so row-level security decides which rows
  come back (:meth:`leaseq.store.client.QueueClient.reader_queue_depth` and kin). It has no
  actions: a reader is granted none.

Both are the protocol's names for :class:`~leaseq.store.client.QueueClient` calls: the
client sends every statement, as it does for every other caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from leaseq.base.queues import QueueOverview, QueueState
from leaseq.store.client import QueueClient
from leaseq.store.duties import OperatorClient, ReaderClient

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

    def job_wait(self, job_id: UUID) -> Row | None:
        """Why the job is not running: its priority and wait reason, or None for an
        unknown id (app.job_wait_reasons)."""

    def list_schedules(self) -> list[Row] | None:
        """Every schedule with its next slots, last slot and its job (app.list_schedules),
        or None for a viewer who is shown no schedules (a tenant reader)."""
        ...

    def list_queues(self) -> list[QueueOverview] | None:
        """Every named queue's depth, workers and pause (app.queue_overview), or None for
        a viewer who is shown no queues (a tenant reader: queues hold every tenant's jobs)."""
        ...

    def limit_status(self) -> list[Row] | None:
        """Each limit instance in use: admitted, running and held jobs, the oldest held
        one's wait (app.limit_status), or None for a viewer shown no limits (a tenant
        reader: an instance may name another tenant)."""
        ...


def _list_args(where: JobFilter, after: Cursor | None) -> dict[str, Any]:
    return {"tenant_id": where.tenant_id, "kind": where.kind, "since": where.since,
            "until": where.until, "after_at": after.after_at if after else None,
            "after_id": after.after_id if after else None}


class OperatorViews:
    """Every tenant's jobs, and the actions by id, on a leaseq_dashboard (or operator)
    login's client: the operator's face, or the all-duties client."""

    def __init__(self, client: QueueClient | OperatorClient) -> None:
        self.client = client

    def queue_depth(self, tenant_id: UUID | None = None, kind: str | None = None,
                    limit: int = 20) -> list[Row]:
        """See :meth:`QueueViews.queue_depth`."""
        return self.client.queue_depth(tenant_id, kind, limit)

    def job_activity(self, tenant_id: UUID | None = None, kind: str | None = None, *,
                     window: timedelta = timedelta(hours=24), buckets: int = 24,
                     samples: int = 20) -> list[Row]:
        """See :meth:`QueueViews.job_activity`."""
        return self.client.job_activity(tenant_id, kind, window=window, buckets=buckets,
                                        samples=samples)

    def list_jobs(self, where: JobFilter, after: Cursor | None = None,
                  limit: int = 50) -> list[Row]:
        """See :meth:`QueueViews.list_jobs`."""
        return self.client.list_jobs(where.state, **_list_args(where, after), limit=limit)

    def get_job(self, job_id: UUID) -> Row | None:
        """See :meth:`QueueViews.get_job`."""
        return self.client.get_job(job_id)

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[Row]:
        """See :meth:`QueueViews.job_timeline`."""
        return self.client.job_timeline(job_id, limit)

    def job_wait(self, job_id: UUID) -> Row | None:
        """See :meth:`QueueViews.job_wait`."""
        rows = self.client.job_wait_reasons([job_id])
        return rows[0] if rows else None

    def list_schedules(self) -> list[Row] | None:
        """See :meth:`QueueViews.list_schedules` (every tenant's)."""
        return self.client.list_schedules(None, 3)

    def list_queues(self) -> list[QueueOverview] | None:
        """See :meth:`QueueViews.list_queues`."""
        return self.client.queue_overview()

    def pause_queue(self, actor: str, queue: str, reason: str | None = None) -> QueueState:
        """Pause ``queue``, audited with ``actor`` (app.pause_queue)."""
        return self.client.pause_queue(queue, actor, reason)

    def resume_queue(self, actor: str, queue: str) -> QueueState:
        """Resume ``queue``, audited with ``actor`` (app.resume_queue)."""
        return self.client.resume_queue(queue, actor)

    def limit_status(self) -> list[Row] | None:
        """See :meth:`QueueViews.limit_status` (every limit's)."""
        return self.client.limit_status()

    def redrive_jobs(self, actor: str, job_ids: Sequence[UUID],
                     reason: str | None = None) -> list[Row]:
        """Dead jobs among ``job_ids`` back to pending, each with a 'redriven' event
        naming ``actor``; returns the jobs it changed (others were not dead)."""
        if not job_ids:  # no ids is no job, never the unfiltered "every job"
            return []
        return self.client.redrive_jobs_by_id(actor, job_ids, reason=reason)

    def cancel_jobs(self, actor: str, job_ids: Sequence[UUID],
                    reason: str | None = None) -> list[Row]:
        """Jobs among ``job_ids`` cancelled whatever they are doing, naming ``actor``
        (``app.request_job_cancel``): pending or retry_wait ones at once, running ones
        by a cancel request their worker learns at its next lease renewal or outcome.
        Returns the jobs acted on, each with its ``state`` after the call
        (``cancelled``, or ``running`` with the request)."""
        if not job_ids:
            return []
        return self.client.request_job_cancel(actor, job_ids, reason=reason)


class TenantViews:
    """One tenant's jobs, read as a tenant reader: row-level security filters them."""

    def __init__(self, client: QueueClient | ReaderClient, tenant_id: UUID) -> None:
        self.client = client
        self.tenant_id = tenant_id

    def queue_depth(self, tenant_id: UUID | None = None, kind: str | None = None,
                    limit: int = 20) -> list[Row]:
        """See :meth:`QueueViews.queue_depth` (only this reader's tenant)."""
        return self.client.reader_queue_depth(self.tenant_id, tenant_id, kind, limit)

    def job_activity(self, tenant_id: UUID | None = None, kind: str | None = None, *,
                     window: timedelta = timedelta(hours=24), buckets: int = 24,
                     samples: int = 20) -> list[Row]:
        """See :meth:`QueueViews.job_activity` (only this reader's tenant)."""
        return self.client.reader_job_activity(self.tenant_id, tenant_id, kind, window=window,
                                               buckets=buckets, samples=samples)

    def list_jobs(self, where: JobFilter, after: Cursor | None = None,
                  limit: int = 50) -> list[Row]:
        """See :meth:`QueueViews.list_jobs` (only this reader's tenant)."""
        return self.client.reader_list_jobs(self.tenant_id, where.state,
                                            **_list_args(where, after), limit=limit)

    def get_job(self, job_id: UUID) -> Row | None:
        """See :meth:`QueueViews.get_job`: None for another tenant's job too."""
        return self.client.reader_get_job(self.tenant_id, job_id)

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[Row]:
        """See :meth:`QueueViews.job_timeline` (only this reader's tenant)."""
        return self.client.reader_job_timeline(self.tenant_id, job_id, limit)

    def job_wait(self, job_id: UUID) -> Row | None:
        """See :meth:`QueueViews.job_wait` (only this reader's tenant's jobs, and only
        they are counted ahead)."""
        rows = self.client.reader_job_wait_reasons(self.tenant_id, [job_id])
        return rows[0] if rows else None

    def list_schedules(self) -> list[Row] | None:
        """None: schedules are the operators' rows, which a tenant reader may not read
        (the shared tenant's and other tenants' among them)."""
        return None

    def list_queues(self) -> list[QueueOverview] | None:
        """None: a queue's counts are every tenant's jobs."""
        return None

    def limit_status(self) -> list[Row] | None:
        """None: a limit instance may count other tenants' jobs."""
        return None
