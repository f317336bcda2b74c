"""Value types that cross the library's boundary: requests in, jobs and results out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaseq.base.decoding import UndecodableJson
from leaseq.base.limits import (
    DEFAULT_PRIORITY,
    MAX_ATTEMPTS,
    MAX_ENQUEUE_BYTES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    enqueue_size_problem,
    queue_name_problem,
)
from leaseq.base.storable import (
    MAX_DOCUMENT_BYTES,
    MAX_PAYLOAD_DEPTH,
    MAX_SCHEDULE_AHEAD,
    NUL_PROBLEM,
    blank_problem,
    character_problem,
    json_size,
    nesting_depth,
    storage_problem,
)


class JobState(StrEnum):
    """The states of ``app.job_state``: a job waits (``pending``, ``retry_wait``), runs
    under a lease (``running``), and ends ``succeeded``, ``dead`` or ``cancelled``. A
    ``str`` too, so it compares with the database's text.

    >>> JobState("retry_wait") is JobState.RETRY_WAIT, JobState.DEAD == "dead"
    (True, True)
    """

    PENDING = "pending"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


class EnqueueRequest(BaseModel):
    """One job to enqueue. The bounds mirror the SQL contract, so bad input is refused
    before it reaches the database, with pydantic's field-by-field explanation: in a
    batch, a value PostgreSQL would refuse costs the whole statement, a value refused
    here costs only its own item.

    ``operation_key`` names the operation for its tenant: enqueueing it again (a
    producer's retry) finds the job already there instead of making a second.
    ``max_attempts`` left None takes the queue's default of 6. ``priority`` is 1 (least
    urgent) .. 9 (most urgent); None takes 5. Within its tenant's turn a claim takes the
    more urgent job first, but a job is overtaken only by work that became due less than
    (priority difference) x the owner's priority step after it. ``limit_key`` (1..200
    characters) puts the job under the limits an operator set on that key, for example
    a partner account's rate. The operation key, the
    kind and the correlation id are plain text: no control, format (invisible or
    bidirectional) or line separator character (:func:`leaseq.base.storable.character_problem`),
    as each is written into log lines and listings as it is. Letters of any script are
    fine. The payloads of one call may hold :data:`leaseq.base.limits.MAX_ENQUEUE_BYTES`
    together, which :meth:`QueueClient.enqueue_jobs` checks for the batch.

    >>> from uuid import UUID
    >>> tenant = UUID("6f1c2d3e-0000-4000-8000-000000000001")
    >>> EnqueueRequest(tenant_id=tenant, operation_key="order-42/receipt",
    ...                kind="send_receipt", payload={"order": 42}).max_attempts is None
    True
    >>> EnqueueRequest(tenant_id=tenant, operation_key=" ", kind="send_receipt")
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for EnqueueRequest
    operation_key
    ...
    """

    # Built on first use: a worker never enqueues, so it does not pay for the schema
    # at import (about a fifth of the worker handler module's import time).
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    tenant_id: UUID
    operation_key: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=128)
    payload: dict[str, Any] = Field(default_factory=dict)
    available_at: datetime | None = None
    # Strict: pydantic would otherwise read true as 1 and "5" as 5.
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS, strict=True)
    correlation_id: str | None = Field(default=None, min_length=1, max_length=200)
    priority: int | None = Field(default=None, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)
    # The named queue whose workers run the job; None: the kind's route, else "default".
    queue: str | None = None

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        problem = None if value is None else queue_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    # The producer's limit key: jobs naming the same key share the limits set on it
    # (leaseq limits set key:NAME ...), whatever their kind or tenant.
    limit_key: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("operation_key", "kind", "limit_key")
    @classmethod
    def _visible(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problem = blank_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("operation_key", "kind", "correlation_id", "limit_key")
    @classmethod
    def _no_nul_text(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError(NUL_PROBLEM)
        return value

    @field_validator("operation_key", "kind", "correlation_id", "limit_key")
    @classmethod
    def _plain_text(cls, value: str | None) -> str | None:
        """No control, format or line separator characters: these values are written
        into logs, metric dimensions and listings as they are (app.character_problem)."""
        problem = None if value is None else character_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("payload")
    @classmethod
    def _storable_payload(cls, value: dict[str, Any]) -> dict[str, Any]:
        depth = nesting_depth(value)
        if depth > MAX_PAYLOAD_DEPTH:
            raise ValueError(f"must nest at most {MAX_PAYLOAD_DEPTH} levels (got {depth})")
        problem = storage_problem(value)
        if problem is not None:
            raise ValueError(problem)
        try:
            size = json_size(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must be strict JSON (no NaN, Infinity, sets...): {exc}") from exc
        if size > MAX_DOCUMENT_BYTES:
            raise ValueError(f"must be at most {MAX_DOCUMENT_BYTES} bytes as JSON (got {size})")
        return value

    @field_validator("available_at")
    @classmethod
    def _utc_and_bounded(cls, value: datetime | None) -> datetime | None:
        """Kept as the same instant in UTC: PostgreSQL refuses UTC offsets beyond
        ±15:59, which Python allows up to ±23:59."""
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("must include a time zone (for example 2026-01-01T00:00:00Z)")
        try:
            utc = value.astimezone(UTC)
        except OverflowError:
            raise ValueError(f"is out of range ({value.isoformat()} is not a time in "
                             "years 1 to 9999 once moved to UTC)") from None
        latest = datetime.now(UTC) + MAX_SCHEDULE_AHEAD
        if utc > latest:
            raise ValueError(f"must be at most {MAX_SCHEDULE_AHEAD.days} days ahead "
                             f"(got {utc.isoformat()}, later than {latest.isoformat()})")
        return utc


def enqueue_call_problem(requests: Sequence[tuple[int, EnqueueRequest]]) -> str | None:
    """Why ``requests`` cannot go to the database in one enqueue call, or None: their
    payloads together pass :data:`~leaseq.base.limits.MAX_ENQUEUE_BYTES` (the message is
    app.enqueue_jobs's, naming the job that takes the sum past it). ``requests`` are
    ``(position, request)``, positions counted from 1 as the caller numbers its jobs.

    Each payload is measured as JSON text, as PostgreSQL writes it; a call of at most 64
    jobs always fits (64 payloads of 256 KiB are 16 MiB) and costs nothing. The database
    checks the same bound, so this only refuses early; it can differ from the database's
    count for numbers that PostgreSQL writes longer than Python (``1e300``)."""
    if len(requests) * MAX_DOCUMENT_BYTES <= MAX_ENQUEUE_BYTES:
        return None
    return enqueue_size_problem((position, _payload_size(request))
                                for position, request in requests)


def _payload_size(request: EnqueueRequest) -> int:
    try:
        return json_size(request.payload)
    except (TypeError, ValueError, RecursionError):
        return 0  # not JSON (a request built without validation): sending it fails anyway


EnqueueStatus = Literal["created", "existing", "conflict", "rejected"]


@dataclass(frozen=True)
class EnqueueResult:
    """What happened to one request: a new job, the job the key already named (the
    request repeats its kind and payload exactly: an idempotent retry), a conflict (the
    key names a job with another kind or payload; nothing was written), or a rejection
    (the database refused this item, whose ``error`` says why; nothing was written for
    it, while the batch's other items were stored). A result per item, like a conflict,
    rather than an exception: the other items of the batch are stored either way, and
    the caller needs to know which.

    ``job_id`` and ``state`` are None for a conflict and for a rejection. A conflict
    names no job: a producer that may write into several tenants would otherwise learn
    the id and progress of another tenant's job from its operation key alone. Only a
    request identical to the stored one (an idempotent retry) gets the job back.

    >>> from uuid import uuid4
    >>> from leaseq import EnqueueRequest, QueueClient, connect
    >>> client = QueueClient(lambda: connect(dsn))  # dsn: the database's URL
    >>> request = EnqueueRequest(tenant_id=uuid4(), operation_key="order-42/receipt",
    ...                          kind="send_receipt", payload={"order": 42})
    >>> (first,), (again,) = client.enqueue_jobs([request]), client.enqueue_jobs([request])
    >>> first.status, again.status, again.job_id == first.job_id, again.created
    ('created', 'existing', True, False)
    """

    index: int
    job_id: UUID | None
    status: EnqueueStatus
    state: JobState | None
    error: str | None = None
    #: The queue the job is in (the request's, its kind's route, or "default"); None for a
    #: conflict and a rejection.
    queue: str | None = None

    @property
    def created(self) -> bool:
        """Whether this request made a new job."""
        return self.status == "created"

    @property
    def rejected(self) -> bool:
        """Whether the database refused this item (``error`` says why)."""
        return self.status == "rejected"


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds a lease on; ``lease_token`` fences every later write.

    ``payload_error`` is set (and ``payload`` empty) when the stored payload cannot be
    decoded by Python: the worker then records the job dead without running it. A handler
    sees its job as ``ctx.job``.

    >>> from datetime import timedelta
    >>> from uuid import uuid4
    >>> from leaseq import EnqueueRequest, QueueClient, connect
    >>> client = QueueClient(lambda: connect(dsn))  # dsn: the database's URL
    >>> _ = client.enqueue_job(EnqueueRequest(tenant_id=uuid4(), operation_key="k-1",
    ...                                       kind="send_receipt", payload={"order": 42}))
    >>> (job,) = client.claim_ready_jobs("worker-1", 10, timedelta(seconds=30))
    >>> job.kind, job.payload, job.attempts, job.is_last_attempt, job.lease_owner
    ('send_receipt', {'order': 42}, 1, False, 'worker-1')
    """

    id: UUID
    tenant_id: UUID
    operation_key: str
    kind: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    available_at: datetime
    created_at: datetime
    lease_owner: str
    lease_token: UUID
    lease_expires_at: datetime
    correlation_id: str | None = None
    payload_error: UndecodableJson | None = None
    priority: int = DEFAULT_PRIORITY

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ClaimedJob:
        """The job of a claimed row (``app.claimed_job``: the job with its lease and
        priority)."""
        payload = row["payload"]
        payload_error = None
        if isinstance(payload, UndecodableJson):
            payload_error, payload = payload, {}
        return cls(
            id=row["id"],
            tenant_id=row["tenant_id"],
            operation_key=row["operation_key"],
            kind=row["kind"],
            payload=payload,
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            available_at=row["available_at"],
            created_at=row["created_at"],
            lease_owner=row["lease_owner"],
            lease_token=row["lease_token"],
            lease_expires_at=row["lease_expires_at"],
            correlation_id=row.get("correlation_id"),
            payload_error=payload_error,
            priority=row.get("priority") or DEFAULT_PRIORITY,
        )

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure of this run makes the job dead rather than retried (by its
        own ``max_attempts``; a kind's RetryPolicy may stop it sooner)."""
        return self.attempts >= self.max_attempts


OutcomeKind = Literal["succeeded", "retry", "dead", "exhausted"]


@dataclass(frozen=True)
class JobOutcome:
    """The result of running one job, waiting to be recorded under its lease: ``succeeded``
    (``detail`` is the result), ``retry`` after ``retry_delay``, ``dead`` (``detail`` is
    the error), or ``exhausted`` (a retry with no attempt left: dead, reason
    max_attempts). The worker makes them; a caller of the client's claim and finish
    functions makes its own.

    >>> from datetime import timedelta
    >>> from uuid import uuid4
    >>> from leaseq import EnqueueRequest, QueueClient, connect
    >>> client = QueueClient(lambda: connect(dsn))  # dsn: the database's URL
    >>> _ = client.enqueue_job(EnqueueRequest(tenant_id=uuid4(), operation_key="k-1",
    ...                                       kind="send_receipt"))
    >>> (job,) = client.claim_ready_jobs("worker-1", 10, timedelta(seconds=30))
    >>> client.finish_jobs("worker-1", [JobOutcome(job, "succeeded", {"sent": True})])[job.id]
    <JobState.SUCCEEDED: 'succeeded'>
    """

    job: ClaimedJob
    outcome: OutcomeKind
    detail: Any = None
    retry_delay: timedelta | None = None


@dataclass(frozen=True)
class LeaseRenewal:
    """What a lease renewal answers: whether the lease is still this worker's
    (``renewed``), and whether an operator asked to cancel the job
    (``cancel_requested``; False when the lease was lost, which says nothing of it)."""

    renewed: bool
    cancel_requested: bool = False


@dataclass(frozen=True)
class Selection:
    """Which jobs an operator's redrive or cancel acts on: explicit ids, or filters
    (None = any). With neither it is every job the call applies to, of every tenant and
    kind, which is why a command line asks for ``--all`` before it builds one."""

    job_ids: tuple[UUID, ...] = ()
    tenant_id: UUID | None = None
    kind: str | None = None

    @property
    def everything(self) -> bool:
        """No id and no filter: the selection names every job."""
        return not self.job_ids and self.tenant_id is None and self.kind is None
