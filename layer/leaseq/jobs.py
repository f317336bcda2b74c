"""Value types that cross the library's boundary: requests in, jobs and results out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: The SQL contract's payload and result size bound, in bytes of JSON text (sql/0003).
MAX_DOCUMENT_BYTES = 262_144


#: The SQL contract's nesting bound (sql/0003): no value more than this many levels below
#: the payload object. Far deeper documents cannot be decoded by Python's json module,
#: so a worker could never read them back.
MAX_PAYLOAD_DEPTH = 100

_NUL = "must not contain NUL characters (U+0000); PostgreSQL cannot store them"


def nesting_depth(value: Any) -> int:
    """Levels below ``value`` (0 for a scalar), without recursion, so any depth is safe."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, level + 1) for child in item)
    return deepest


def contains_nul(value: Any) -> bool:
    """Whether a JSON-like value holds U+0000 anywhere, which text and jsonb cannot store."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(contains_nul(k) or contains_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(contains_nul(item) for item in value)
    return False


def json_size(value: Any) -> int:
    """Bytes of ``value`` as strict JSON text, the way PostgreSQL prints jsonb.

    Raises ValueError or TypeError when the value is not strict JSON (NaN, sets, ...).
    """
    return len(json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8"))


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


class EnqueueRequest(BaseModel):
    """One job to enqueue. The bounds mirror the SQL contract, so bad input is refused
    before it reaches the database, with pydantic's field-by-field explanation."""

    # Built on first use: a worker never enqueues, so it does not pay for the schema
    # at import (about a fifth of the worker handler module's import time).
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    tenant_id: UUID
    operation_key: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=128)
    payload: dict[str, Any] = Field(default_factory=dict)
    available_at: datetime | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=20)
    correlation_id: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("operation_key", "kind")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("operation_key", "kind", "correlation_id")
    @classmethod
    def _no_nul_text(cls, value: str | None) -> str | None:
        if value is not None and contains_nul(value):
            raise ValueError(_NUL)
        return value

    @field_validator("payload")
    @classmethod
    def _storable_payload(cls, value: dict[str, Any]) -> dict[str, Any]:
        depth = nesting_depth(value)
        if depth > MAX_PAYLOAD_DEPTH:
            raise ValueError(f"must nest at most {MAX_PAYLOAD_DEPTH} levels (got {depth})")
        try:
            size = json_size(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must be strict JSON (no NaN, Infinity, sets...): {exc}") from exc
        if contains_nul(value):
            raise ValueError(_NUL)
        if size > MAX_DOCUMENT_BYTES:
            raise ValueError(f"must be at most {MAX_DOCUMENT_BYTES} bytes as JSON (got {size})")
        return value

    @field_validator("available_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must include a time zone (for example 2026-01-01T00:00:00Z)")
        return value


EnqueueStatus = Literal["created", "existing", "conflict", "rejected"]


@dataclass(frozen=True)
class EnqueueResult:
    """What happened to one request: a new job, the job the key already named, a
    conflict (the key names a job with another kind or payload; nothing was written),
    or a rejection (the database refused this item, whose ``error`` says why; nothing
    was written for it, so ``job_id`` and ``state`` are None, while the batch's other
    items were stored). A result per item, like a conflict, rather than an exception:
    the other items of the batch are stored either way, and the caller needs to know
    which."""

    index: int
    job_id: UUID | None
    status: EnqueueStatus
    state: JobState | None
    error: str | None = None

    @property
    def created(self) -> bool:
        return self.status == "created"

    @property
    def rejected(self) -> bool:
        return self.status == "rejected"


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds a lease on; ``lease_token`` fences every later write."""

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

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ClaimedJob:
        return cls(
            id=row["id"],
            tenant_id=row["tenant_id"],
            operation_key=row["operation_key"],
            kind=row["kind"],
            payload=row["payload"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            available_at=row["available_at"],
            created_at=row["created_at"],
            lease_owner=row["lease_owner"],
            lease_token=row["lease_token"],
            lease_expires_at=row["lease_expires_at"],
            correlation_id=row.get("correlation_id"),
        )

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


OutcomeKind = Literal["succeeded", "retry", "dead", "exhausted"]


@dataclass(frozen=True)
class JobOutcome:
    """The result of running one job, waiting to be recorded under its lease."""

    job: ClaimedJob
    outcome: OutcomeKind
    detail: Any = None
    retry_delay: timedelta | None = None
