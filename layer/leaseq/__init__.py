"""leaseq: a durable, multi-tenant job queue in PostgreSQL, drained by AWS Lambda."""

from leaseq.admission import DeclaredLimit, LimitName, Rate, parse_limit_name, parse_rate
from leaseq.client import (
    QueueClient,
    enqueue_job,
    enqueue_jobs,
    set_worker_pool_limits,
    wait_for_result,
)
from leaseq.config import WorkerConfig
from leaseq.db import connect
from leaseq.deadline import Deadline, MonotonicDeadline, lease_for
from leaseq.decoding import UndecodableJson
from leaseq.errors import (
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
from leaseq.job_context import JobContext, JobLogFields, current_job, job_log_fields
from leaseq.jobs import ClaimedJob, EnqueueRequest, EnqueueResult, JobOutcome, JobState
from leaseq.migrate import MigrationReport, migrate
from leaseq.pool import PoolLimits, PoolSize, ScaleUp
from leaseq.reaper import LimitState, ReapReport, reap_once
from leaseq.recorder import JobRecord
from leaseq.registry import Registration, Registry
from leaseq.results import JobResult
from leaseq.retry import RetryPolicy
from leaseq.schedules import SHARED_TENANT, Schedule, TickedSchedule
from leaseq.settings import (
    DatabaseSettings,
    LeaseqSettings,
    PoolSettings,
    ReaperSettings,
    WorkerSettings,
)
from leaseq.signals import DiscardJob, JobTimeout, RetryJob
from leaseq.worker import ClaimHook, DrainReport, Worker

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
