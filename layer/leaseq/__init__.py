"""leaseq: a durable, multi-tenant job queue in PostgreSQL, drained by AWS Lambda."""

from leaseq import _moved
from leaseq.base.admission import DeclaredLimit, LimitName, Rate, parse_limit_name, parse_rate
from leaseq.base.deadline import Deadline, MonotonicDeadline, lease_for
from leaseq.base.decoding import UndecodableJson
from leaseq.base.errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailableError,
    IdempotencyConflictError,
    InvalidRequestError,
    LeaseqError,
    MigrationBlockedError,
    PermissionDeniedError,
    ResultTimeoutError,
    SchemaVersionError,
    TlsVerificationError,
)
from leaseq.base.jobs import ClaimedJob, EnqueueRequest, EnqueueResult, JobOutcome, JobState
from leaseq.base.pool import PoolLimits, PoolSize, ScaleUp
from leaseq.base.results import JobResult
from leaseq.base.schedules import SHARED_TENANT, Schedule, TickedSchedule
from leaseq.drain.config import WorkerConfig
from leaseq.drain.recorder import JobRecord
from leaseq.drain.worker import ClaimHook, DrainReport, Worker
from leaseq.kinds.job_context import JobContext, JobLogFields, current_job, job_log_fields
from leaseq.kinds.registry import Registration, Registry
from leaseq.kinds.retry import RetryPolicy
from leaseq.kinds.signals import DiscardJob, JobTimeout, RetryJob
from leaseq.settings import (
    DatabaseSettings,
    LeaseqSettings,
    PoolSettings,
    ReaperSettings,
    WorkerSettings,
)
from leaseq.store.client import (
    QueueClient,
    enqueue_job,
    enqueue_jobs,
    set_worker_pool_limits,
    wait_for_result,
)
from leaseq.store.db import connect
from leaseq.store.migrate import MigrationReport, migrate
from leaseq.upkeep.reaper import LimitState, ReapReport, reap_once

__all__ = [
    "SHARED_TENANT",
    "ClaimHook",
    "ClaimedJob",
    "ConfigurationError",
    "DatabaseError",
    "DatabaseSettings",
    "DatabaseUnavailableError",
    "Deadline",
    "DeclaredLimit",
    "DiscardJob",
    "DrainReport",
    "EnqueueRequest",
    "EnqueueResult",
    "IdempotencyConflictError",
    "InvalidRequestError",
    "JobContext",
    "JobLogFields",
    "JobOutcome",
    "JobRecord",
    "JobResult",
    "JobState",
    "JobTimeout",
    "LeaseqError",
    "LeaseqSettings",
    "LimitName",
    "LimitState",
    "MigrationBlockedError",
    "MigrationReport",
    "MonotonicDeadline",
    "PermissionDeniedError",
    "PoolLimits",
    "PoolSettings",
    "PoolSize",
    "QueueClient",
    "Rate",
    "ReapReport",
    "ReaperSettings",
    "Registration",
    "Registry",
    "ResultTimeoutError",
    "RetryJob",
    "RetryPolicy",
    "ScaleUp",
    "Schedule",
    "SchemaVersionError",
    "TickedSchedule",
    "TlsVerificationError",
    "UndecodableJson",
    "Worker",
    "WorkerConfig",
    "WorkerSettings",
    "connect",
    "current_job",
    "enqueue_job",
    "enqueue_jobs",
    "job_log_fields",
    "lease_for",
    "migrate",
    "parse_limit_name",
    "parse_rate",
    "reap_once",
    "set_worker_pool_limits",
    "wait_for_result",
]

# The module paths before the sub-packages by duty (leaseq.client, leaseq.worker, ...)
# still import, with a DeprecationWarning: leaseq._moved.
_moved.install()
