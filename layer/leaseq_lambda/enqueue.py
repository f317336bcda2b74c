"""Enqueue the valid items of an event and answer for every item.

All valid items go to the database in one call (one round trip, one statement). If
the database refuses that call as a whole, which validation should have prevented,
the items are sent one by one so that only the offending ones are rejected.

A door bound to some tenants (``LEASEQ_ENQUEUE_TENANTS``) rejects the items of any other
tenant before anything is sent, each with SQLSTATE 42501, so that the rest of the batch
is stored. That is the answer, not the fence: the function's login is bound to the same
tenants in the database, which refuses a call naming any other one as a whole
(PermissionDeniedError, raised: the setting and the binding disagree, which is a
deployment fault, never an item's).

A rejection the database decided carries its SQLSTATE (``sqlstate`` in the answer):
22023 for an item it refused, 23505 for an idempotency conflict, whose answer names no
job: the id of an existing job is only ever returned to a request that repeats it.

With a handlers registry (``LEASEQ_ENQUEUE_HANDLERS``), a job of a kind it does not
register, or whose payload its kind's model refuses, is rejected before anything is
sent, with the model's errors field by field (``errors``, no ``sqlstate``, as for a job
that did not validate): a worker would record it dead without running it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal
from uuid import UUID

from leaseq import (
    EnqueueRequest,
    EnqueueResult,
    InvalidRequestError,
    LeaseqError,
    Registry,
)
from leaseq.base.errors import PayloadRejectedError, UnknownKindError
from leaseq.base.limits import DEFAULT_QUEUE
from leaseq.store.duties import ProducerCalls

from leaseq_lambda.events import EnqueueBatch, FieldProblem, Rejection

Status = Literal["created", "existing", "rejected"]

#: SQLSTATEs of the rejections the database decides (sql/README.md, "Errors"), and of a
#: tenant this door is not bound to.
INVALID_ITEM: Final = "22023"
IDEMPOTENCY_CONFLICT: Final = "23505"
TENANT_NOT_BOUND: Final = "42501"


@dataclass(frozen=True)
class ItemResult:
    """The answer for one item of the event, in the event's order."""

    index: int
    status: Status
    job_id: UUID | None = None
    reason: str | None = None
    request: EnqueueRequest | None = None
    errors: tuple[FieldProblem, ...] = ()
    #: The SQLSTATE of a rejection the database decided, or this door's 42501.
    sqlstate: str | None = None
    #: The queue the job went to (created or existing).
    queue: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The item as the function answers it: ``errors`` only for an item that did
        not validate (field, pydantic error type, message), ``sqlstate`` only for a
        rejection with one."""
        item: dict[str, Any] = {"index": self.index, "status": self.status}
        if self.job_id is not None:
            item["job_id"] = str(self.job_id)
        if self.queue is not None:
            item["queue"] = self.queue
        if self.reason is not None:
            item["reason"] = self.reason
        if self.sqlstate is not None:
            item["sqlstate"] = self.sqlstate
        if self.errors:
            item["errors"] = [{"field": e.field, "type": e.type, "message": e.message}
                              for e in self.errors]
        return item


def _conflict(request: EnqueueRequest) -> str:
    return (f"idempotency conflict: operation_key {request.operation_key!r} of tenant "
            f"{request.tenant_id} already names a job with a different kind or payload; "
            "use a new operation_key for a different job, or repeat the original exactly")


def _not_bound(request: EnqueueRequest) -> str:
    return (f"tenant {request.tenant_id} is not one this enqueue function may enqueue for: "
            "it is bound to the tenants of LEASEQ_ENQUEUE_TENANTS (the stack's "
            "EnqueueTenants); nothing was stored for this job")


def _result(index: int, request: EnqueueRequest, result: EnqueueResult) -> ItemResult:
    if result.status == "conflict":
        return ItemResult(index, "rejected", reason=_conflict(request), request=request,
                          sqlstate=IDEMPOTENCY_CONFLICT)
    if result.status == "rejected" or result.job_id is None:
        return ItemResult(index, "rejected", reason=result.error or "rejected by the database",
                          request=request, sqlstate=INVALID_ITEM)
    return ItemResult(index, result.status, job_id=result.job_id, request=request,
                      queue=result.queue)


def _one_by_one(client: ProducerCalls, pending: list[tuple[int, EnqueueRequest]]
                ) -> list[ItemResult]:
    results = []
    for index, request in pending:
        try:
            (result,) = client.enqueue_jobs([request])
        except InvalidRequestError as exc:
            results.append(ItemResult(index, "rejected", reason=exc.message, request=request,
                                      sqlstate=exc.sqlstate))
            continue
        results.append(_result(index, request, result))
    return results


def _no_tenants() -> Collection[UUID]:
    return ()


def _no_registry() -> Registry | None:
    return None


def registry_problem(registry: Registry, request: EnqueueRequest) -> Rejection | None:
    """Why ``registry`` refuses ``request`` (an unknown kind, a payload its model refuses),
    field by field; None when it accepts it."""
    try:
        registry.check(request.kind, request.payload)
    except UnknownKindError as exc:
        return Rejection(exc.message, (FieldProblem("kind", "unknown_kind", exc.message),))
    except PayloadRejectedError as exc:
        return Rejection(exc.message, tuple(FieldProblem(*error) for error in exc.errors))
    return None


def submit(connect: Callable[[], ProducerCalls], batch: EnqueueBatch,
           tenants: Callable[[], Collection[UUID]] = _no_tenants,
           registry: Callable[[], Registry | None] = _no_registry) -> list[ItemResult]:
    """Enqueue ``batch``'s valid requests; one result per item, in the event's order.

    ``connect`` is only called when there is something to send, so an event that is
    rejected as a whole is answered without touching the database; so are ``tenants``,
    the tenants this door is bound to (none: any tenant), and ``registry``, the handlers
    registry jobs are checked against (None: no check). A request for another tenant, of
    a kind the registry does not know, or with a payload its model refuses, is rejected
    without being sent.
    """
    results = {i: ItemResult(i, "rejected", reason=item.reason, errors=item.errors)
               for i, item in enumerate(batch.items) if isinstance(item, Rejection)}
    pending = batch.requests
    checked = registry() if pending else None
    if checked is not None:
        refused = {i: problem for i, request in pending
                   if (problem := registry_problem(checked, request)) is not None}
        results.update((i, ItemResult(i, "rejected", reason=problem.reason,
                                      errors=problem.errors, request=request))
                       for i, request in pending if (problem := refused.get(i)) is not None)
        pending = [(i, checked.routed(request)) for i, request in pending
                   if i not in refused]
    bound = tenants() if pending else ()
    if bound:
        results.update((i, ItemResult(i, "rejected", reason=_not_bound(request),
                                      request=request, sqlstate=TENANT_NOT_BOUND))
                       for i, request in pending if request.tenant_id not in bound)
        pending = [(i, request) for i, request in pending if request.tenant_id in bound]
    if pending:
        client = connect()
        try:
            sent = client.enqueue_jobs([request for _, request in pending])
            done = [_result(i, request, result)
                    for (i, request), result in zip(pending, sent, strict=True)]
        except InvalidRequestError:
            done = _one_by_one(client, pending)
        results.update((r.index, r) for r in done)
    return [results[i] for i in range(len(batch.items))]


def ready_now(results: list[ItemResult], now: datetime | None = None) -> bool:
    """Whether a job this call created can be claimed at once (no ``available_at`` in
    the future): only then is a worker worth waking."""
    return bool(ready_queues(results, now))


def ready_queues(results: list[ItemResult], now: datetime | None = None) -> list[str]:
    """The queues, by name, of the jobs this call created that can be claimed at once:
    the pools worth waking, each its own."""
    moment = now or datetime.now(UTC)
    return sorted({r.queue or DEFAULT_QUEUE for r in results
                   if r.status == "created" and r.request is not None
                   and (r.request.available_at is None or r.request.available_at <= moment)})


def response(results: list[ItemResult]) -> dict[str, Any]:
    """The function's answer: per-item results and a count per status."""
    counts = {status: sum(1 for r in results if r.status == status)
              for status in ("created", "existing", "rejected")}
    return {"results": [r.as_dict() for r in results], **counts}


#: The most of the reasons an asynchronous failure carries: Lambda's invocation record
#: must fit an SQS message (256 KiB) beside the request payload.
MAX_REJECTION_MESSAGE = 32_000


class EnqueueRejectedError(LeaseqError):
    """Raised by an asynchronous invocation after enqueueing its valid jobs when some were
    rejected, so that Lambda's on-failure destination gets the reasons. Resubmitting the
    record finds the enqueued jobs again (idempotent on tenant and operation key)."""


def rejection_error(results: list[ItemResult]) -> EnqueueRejectedError:
    """The error for an asynchronous invocation with rejected jobs, one reason per job."""
    rejected = [r for r in results if r.status == "rejected"]
    head = (f"{len(rejected)} of {len(results)} jobs rejected (the other "
            f"{len(results) - len(rejected)} were enqueued): ")
    reasons: list[str] = []
    size = len(head)
    for shown, item in enumerate(rejected):
        reason = f"job {item.index}: {item.reason}"
        if size + len(reason) > MAX_REJECTION_MESSAGE:
            reasons.append(f"... and {len(rejected) - shown} more")
            break
        reasons.append(reason)
        size += len(reason) + 2
    return EnqueueRejectedError(head + "; ".join(reasons))
