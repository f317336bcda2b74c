"""One face of the queue per duty, and the names of the SQL groups that grant each duty.

The SQL contract is split by duty: each ``app`` function is granted to the groups of the
duties that need it (``sql/functions/*.sql``). :class:`~leaseq.store.client.QueueClient` holds
the connection and implements every call; a face offers only the calls its duty's group
may execute, so code handed a :class:`WorkerClient` cannot reach an operator's redrive,
and a reader of the code sees what each caller may do:

=====================  =====================================  ==============================
face                   duty                                   SQL groups
=====================  =====================================  ==============================
:class:`ProducerClient`  enqueue, read one's own results,       ``leaseq_producer``,
                         wake a worker                          ``leaseq_tenant_producer``
:class:`WorkerClient`    claim, renew, record, give back, the   ``leaseq_worker``
                         worker pool
:class:`ReaperClient`    release expired leases, repair turns,  ``leaseq_reaper``
                         end stalled sessions, tick schedules,
                         prune retained
:class:`OperatorClient`  status, dead jobs, redrive, cancel,    ``leaseq_operator``
                         prune, schedules, the dashboard's
                         reads
:class:`ReaderClient`    one tenant's reads (row-level          ``authenticated``
                         security)
=====================  =====================================  ==============================

A face delegates to the client it is given, so several faces may share one connection
(the command line does every duty over one login)::

    client = QueueClient(lambda: connect(dsn))
    producer, worker = ProducerClient(client), WorkerClient(client)

The group names are defined here once: the migrations custom resource grants them to the
functions' logins, the embedded server to its login, and the privilege tests connect as
members of each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, Concatenate, Final, ParamSpec, TypeAlias, TypeVar
from uuid import UUID

from leaseq.base.results import JobResult
from leaseq.store.client import QueueClient

__all__ = [
    "DASHBOARD",
    "DUTY_GROUPS",
    "OPERATOR",
    "PRODUCER",
    "READER_GROUP",
    "REAPER",
    "TENANT_PRODUCER",
    "WORKER",
    "DutyClient",
    "OperatorClient",
    "ProducerCalls",
    "ProducerClient",
    "ReaderClient",
    "ReaperCalls",
    "ReaperClient",
    "WorkerCalls",
    "WorkerClient",
]

#: Producers of any tenant: enqueue, read results, wake a worker.
PRODUCER: Final = "leaseq_producer"
#: Producers bound to their tenants (``app.tenant_producers``): the producer's calls.
TENANT_PRODUCER: Final = "leaseq_tenant_producer"
#: Workers: claim, renew, record outcomes, give back, the worker pool.
WORKER: Final = "leaseq_worker"
#: The reaper: expired leases, tenant turns, stalled sessions, retention.
REAPER: Final = "leaseq_reaper"
#: Operators: every tenant's status and dead jobs, redrive, cancel, prune.
OPERATOR: Final = "leaseq_operator"
#: The dashboard's own login: the operator's reads, redrive and cancel by id.
DASHBOARD: Final = "leaseq_dashboard"
#: Tenant readers (row-level security), each login bound to one tenant; never a
#: function's login.
READER_GROUP: Final = "authenticated"
#: The NOLOGIN duty groups the schema migrations create, by the duty they grant.
DUTY_GROUPS: Final = (PRODUCER, TENANT_PRODUCER, WORKER, REAPER, OPERATOR, DASHBOARD)

P = ParamSpec("P")
R = TypeVar("R")


def _call(method: Callable[Concatenate[QueueClient, P], R]) -> Callable[Concatenate[DutyClient, P],
                                                                          R]:
    """One of the client's calls, offered by a face: the client's own implementation,
    run on the face's client, with its name and docstring."""

    @functools.wraps(method)
    def call(self: DutyClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(self.client, *args, **kwargs)

    return call


class DutyClient:
    """What every face has: the client it delegates to (which holds the connection),
    and the connection's own calls (:meth:`close`, :meth:`check`).

    >>> from leaseq import QueueClient, connect
    >>> worker = WorkerClient(QueueClient(lambda: connect(dsn)))  # dsn: the database's URL
    >>> worker.release_all_expired_jobs  # a reaper's call
    Traceback (most recent call last):
    ...
    AttributeError: 'WorkerClient' object has no attribute 'release_all_expired_jobs'
    >>> worker.groups
    ('leaseq_worker',)
    """

    #: The SQL groups whose grants this face's calls need (any one of them suffices).
    groups: ClassVar[tuple[str, ...]] = ()

    def __init__(self, client: QueueClient) -> None:
        self.client = client

    close = _call(QueueClient.close)
    check = _call(QueueClient.check)


class ProducerClient(DutyClient):
    """The producer's face: enqueue, read the results of one's own jobs, wake a worker
    (``leaseq_producer``; ``leaseq_tenant_producer`` for the tenants it is bound to)."""

    groups = (PRODUCER, TENANT_PRODUCER)

    enqueue_jobs = _call(QueueClient.enqueue_jobs)
    enqueue_job = _call(QueueClient.enqueue_job)
    get_job_result = _call(QueueClient.get_job_result)
    get_job_result_by_key = _call(QueueClient.get_job_result_by_key)
    job_result = _call(QueueClient.job_result)
    wake_worker_place = _call(QueueClient.wake_worker_place)
    release_worker_place = _call(QueueClient.release_worker_place)
    queue_worker_function = _call(QueueClient.queue_worker_function)

    def wait_for_result(self, tenant_id: UUID, *, job_id: UUID | None = None,
                        operation_key: str | None = None, timeout: float,
                        **polling: Any) -> JobResult | None:
        """:meth:`QueueClient.wait_for_result`: wait up to ``timeout`` seconds for the
        job to finish (written out: its polling options keep it from being forwarded
        like the other calls)."""
        return self.client.wait_for_result(tenant_id, job_id=job_id,
                                           operation_key=operation_key, timeout=timeout,
                                           **polling)


class WorkerClient(DutyClient):
    """The worker's face: claim, renew, record outcomes, give back, and the worker pool
    (``leaseq_worker``)."""

    groups = (WORKER,)

    claim_ready_jobs = _call(QueueClient.claim_ready_jobs)
    claim_jobs = _call(QueueClient.claim_jobs)
    ready_tenants = _call(QueueClient.ready_tenants)
    oldest_ready_at = _call(QueueClient.oldest_ready_at)
    renew_job_lease = _call(QueueClient.renew_job_lease)
    renew_job_lease_status = _call(QueueClient.renew_job_lease_status)
    finish_jobs = _call(QueueClient.finish_jobs)
    finish_and_claim_jobs = _call(QueueClient.finish_and_claim_jobs)
    release_jobs = _call(QueueClient.release_jobs)
    join_worker_pool = _call(QueueClient.join_worker_pool)
    leave_worker_pool = _call(QueueClient.leave_worker_pool)
    reserve_worker_places = _call(QueueClient.reserve_worker_places)
    release_worker_place = _call(QueueClient.release_worker_place)
    wake_worker_place = _call(QueueClient.wake_worker_place)
    worker_pool_size = _call(QueueClient.worker_pool_size)
    queue_overview = _call(QueueClient.queue_overview)
    queue_state = _call(QueueClient.queue_state)


class ReaperClient(DutyClient):
    """The reaper's face: release expired leases, repair tenant turns, end stalled
    sessions, prune what retention allows (``leaseq_reaper``)."""

    groups = (REAPER,)

    release_expired_jobs = _call(QueueClient.release_expired_jobs)
    release_all_expired_jobs = _call(QueueClient.release_all_expired_jobs)
    repair_tenant_turns = _call(QueueClient.repair_tenant_turns)
    end_stalled_sessions = _call(QueueClient.end_stalled_sessions)
    prune_retained_jobs = _call(QueueClient.prune_retained_jobs)
    roll_event_days = _call(QueueClient.roll_event_days)
    tick_schedules = _call(QueueClient.tick_schedules)
    queue_overview = _call(QueueClient.queue_overview)
    admit_held_jobs = _call(QueueClient.admit_held_jobs)
    limit_status = _call(QueueClient.limit_status)


class OperatorClient(DutyClient):
    """The operator's face: every tenant's status, jobs and dead jobs, redrive, cancel,
    prune, pause and resume queues, and the dashboard's reads (``leaseq_operator``)."""

    groups = (OPERATOR,)

    queue_status = _call(QueueClient.queue_status)
    get_job = _call(QueueClient.get_job)
    job_timeline = _call(QueueClient.job_timeline)
    dead_jobs = _call(QueueClient.dead_jobs)
    redrive_jobs = _call(QueueClient.redrive_jobs)
    cancel_jobs = _call(QueueClient.cancel_jobs)
    redrive_jobs_by_id = _call(QueueClient.redrive_jobs_by_id)
    cancel_jobs_by_id = _call(QueueClient.cancel_jobs_by_id)
    request_job_cancel = _call(QueueClient.request_job_cancel)
    prune_jobs = _call(QueueClient.prune_jobs)
    repair_tenant_turns = _call(QueueClient.repair_tenant_turns)
    oldest_ready_at = _call(QueueClient.oldest_ready_at)
    worker_pool_size = _call(QueueClient.worker_pool_size)
    queue_depth = _call(QueueClient.queue_depth)
    queue_depth_by_kind = _call(QueueClient.queue_depth_by_kind)
    job_activity = _call(QueueClient.job_activity)
    list_jobs = _call(QueueClient.list_jobs)
    job_wait_reasons = _call(QueueClient.job_wait_reasons)
    waiting_jobs = _call(QueueClient.waiting_jobs)
    put_schedule = _call(QueueClient.put_schedule)
    pause_schedule = _call(QueueClient.pause_schedule)
    remove_schedule = _call(QueueClient.remove_schedule)
    list_schedules = _call(QueueClient.list_schedules)
    sync_schedules = _call(QueueClient.sync_schedules)
    pause_queue = _call(QueueClient.pause_queue)
    resume_queue = _call(QueueClient.resume_queue)
    queue_overview = _call(QueueClient.queue_overview)
    queue_state = _call(QueueClient.queue_state)
    queue_history = _call(QueueClient.queue_history)
    set_limit = _call(QueueClient.set_limit)
    remove_limit = _call(QueueClient.remove_limit)
    list_limits = _call(QueueClient.list_limits)
    sync_limits = _call(QueueClient.sync_limits)
    limit_status = _call(QueueClient.limit_status)
    admit_held_jobs = _call(QueueClient.admit_held_jobs)


class ReaderClient(DutyClient):
    """A tenant reader's face: the dashboard's reads as ``reader_tenant``'s reader, rows
    chosen by row-level security (``authenticated``)."""

    groups = (READER_GROUP,)

    reader_queue_depth = _call(QueueClient.reader_queue_depth)
    reader_job_activity = _call(QueueClient.reader_job_activity)
    reader_list_jobs = _call(QueueClient.reader_list_jobs)
    reader_get_job = _call(QueueClient.reader_get_job)
    reader_job_timeline = _call(QueueClient.reader_job_timeline)
    reader_job_wait_reasons = _call(QueueClient.reader_job_wait_reasons)


#: What the producer's code (the enqueue function, its wake, its result reads) takes: the
#: producer's face, or the all-duties client.
ProducerCalls: TypeAlias = QueueClient | ProducerClient
#: What the worker's code (the drain, its recorder, the worker pool) takes: the worker's
#: face, or the all-duties client.
WorkerCalls: TypeAlias = QueueClient | WorkerClient
#: What the reaper's code takes: the reaper's face, or the all-duties client.
ReaperCalls: TypeAlias = QueueClient | ReaperClient
