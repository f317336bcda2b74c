"""The events the three functions accept, validated with pydantic before anything else.

Scheduled ticks (worker, reaper):
  * EventBridge Scheduler with the template's Input:
    ``{"source": "leaseq.schedule", "task": "worker", "scheduled_time": "<iso>"}``;
  * the classic EventBridge rule envelope (``"detail-type": "Scheduled Event"``);
  * ``{}``, a manual invoke from the console or the CLI.

Pool starts (worker only): an asynchronous invoke by a busy worker (fan-out) or by a
producer after its commit (wake), holding the place reserved for it in the worker pool:
``{"source": "leaseq.pool", "reason": "fanout" | "wake", "reservation": "<uuid>"}``
(see :mod:`leaseq_lambda.scaling`).

Enqueue (direct invoke from another Lambda, or an EventBridge event):
  * one job ``{tenant_id, operation_key, kind, payload, available_at?, max_attempts?,
    correlation_id?}`` or a batch ``{"jobs": [...]}`` of at most 1000, whose payloads
    hold at most 16 MiB together (``leaseq.base.limits.MAX_ENQUEUE_BYTES``; every job of a
    larger batch is rejected with the database's message, nothing is stored);
  * an EventBridge event with ``"detail-type": "leaseq.enqueue"`` whose detail is either.

Bad enqueue input never raises: every item gets a result, and an item that does not
validate is rejected with pydantic's explanation (one line, and field by field), while
its valid neighbours go ahead. The model refuses every value the SQL contract refuses,
so a bad value costs its own item, not the statement that stores the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from aws_lambda_powertools.utilities.parser import parse
from leaseq import EnqueueRequest, InvalidRequestError
from leaseq.base.errors import field_path, one_line
from leaseq.base.jobs import enqueue_call_problem
from leaseq.base.limits import MAX_ENQUEUE
from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

Task = Literal["worker", "reaper"]

#: The SQL contract's bound on one enqueue call.
MAX_BATCH = MAX_ENQUEUE
ENQUEUE_DETAIL_TYPE = "leaseq.enqueue"
SCHEDULE_SOURCE = "leaseq.schedule"
POOL_SOURCE = "leaseq.pool"


class InvalidEventError(InvalidRequestError):
    """The event is none of the shapes this function accepts."""


def _event_bridge_model() -> type[EventBridgeModel]:
    """Powertools' EventBridge envelope, imported when an event has that shape: the
    schedules send their own Input, so a worker or reaper tick never needs the model."""
    from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

    return EventBridgeModel


def describe(exc: ValidationError) -> str:
    """Pydantic's errors as one line: ``field: problem; other.field: problem``."""
    return one_line(exc, "event")


def problems(exc: ValidationError) -> tuple[FieldProblem, ...]:
    """Pydantic's errors one by one, for a caller that acts on them: the field, the
    kind of problem (pydantic's error type) and the message. Inputs are left out, so
    that a rejection never echoes a payload back."""
    return tuple(FieldProblem(field_path(err, "event"), err["type"], err["msg"])
                 for err in exc.errors(include_url=False, include_input=False))


# Scheduled ticks ----------------------------------------------------------------------------


class ScheduleInput(BaseModel):
    """The Input the template's ScheduleV2 targets send."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["leaseq.schedule"]
    task: Task
    scheduled_time: datetime | None = None


class PoolStartInput(BaseModel):
    """The event a worker invocation is started with by fan-out or by a wake."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["leaseq.pool"]
    reason: Literal["fanout", "wake"]
    reservation: UUID


Origin = Literal["scheduler", "eventbridge-rule", "manual", "fanout", "wake"]
#: Why an invocation joins the worker pool (``app.join_worker_pool``'s ``p_reason``).
PoolReason = Literal["schedule", "manual", "fanout", "wake"]


@dataclass(frozen=True)
class Tick:
    """A validated start of a scheduled function: where it came from, when it was due
    (schedules), and the pool place reserved for it (fan-out and wake starts)."""

    origin: Origin
    scheduled_time: datetime | None = None
    reservation: UUID | None = None

    @property
    def started(self) -> bool:
        """Started by another invocation (fan-out or wake), not by a schedule or a person:
        such an invocation stops after the pool's idle time instead of the worker's."""
        return self.origin in ("fanout", "wake")

    @property
    def pool_reason(self) -> PoolReason:
        """The reason the invocation gives when it joins the worker pool."""
        if self.origin in ("fanout", "wake", "manual"):
            return self.origin
        return "schedule"


def _shapes(task: Task) -> str:
    shapes = (f'a schedule tick {{"source": "{SCHEDULE_SOURCE}", "task": "{task}", '
              '"scheduled_time": "<iso>"}, an EventBridge \'Scheduled Event\', ')
    if task == "worker":
        shapes += (f'a pool start {{"source": "{POOL_SOURCE}", "reason": "fanout" or "wake", '
                   '"reservation": "<uuid>"}, ')
    return shapes + "or {} for a manual run"


def parse_tick(event: Any, task: Task) -> Tick:
    """Accept the shapes a scheduled ``task`` function is invoked with, or raise
    :class:`InvalidEventError` saying which shapes those are."""
    if event is None or event == {}:
        return Tick("manual")
    if isinstance(event, dict) and event.get("source") == SCHEDULE_SOURCE:
        try:
            tick = parse(event=event, model=ScheduleInput)
        except ValidationError as exc:
            raise InvalidEventError(f"invalid schedule input: {describe(exc)}") from exc
        if tick.task != task:
            raise InvalidEventError(
                f"this is the {task} function, but the schedule's input names task "
                f"{tick.task!r}: point each schedule at its own function")
        return Tick("scheduler", tick.scheduled_time)
    if isinstance(event, dict) and event.get("source") == POOL_SOURCE:
        if task != "worker":
            raise InvalidEventError(
                f"this is the {task} function, but the event is a worker pool start: "
                f"set LEASEQ_WORKER_FUNCTION to the worker function. The {task} function "
                f"expects {_shapes(task)}")
        try:
            start = parse(event=event, model=PoolStartInput)
        except ValidationError as exc:
            raise InvalidEventError(
                f"invalid pool start: {describe(exc)}. The worker function expects "
                f"{_shapes(task)}") from exc
        return Tick(start.reason, reservation=start.reservation)
    if isinstance(event, dict) and event.get("detail-type") == "Scheduled Event":
        try:
            envelope = parse(event=event, model=_event_bridge_model())
        except ValidationError as exc:
            raise InvalidEventError(f"invalid scheduled event: {describe(exc)}") from exc
        return Tick("eventbridge-rule", envelope.time)
    raise InvalidEventError(f"the {task} function expects {_shapes(task)}")


def pool_start_event(reason: Literal["fanout", "wake"], reservation: UUID) -> dict[str, str]:
    """The event a worker invocation is started with to take the place ``reservation``."""
    return {"source": POOL_SOURCE, "reason": reason, "reservation": str(reservation)}


# Enqueue ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldProblem:
    """One field of a rejected item, and what is wrong with it."""

    field: str
    type: str
    message: str


@dataclass(frozen=True)
class Rejection:
    """An item refused before the database: the reason in one line, and field by field
    when the item is a job that did not validate."""

    reason: str
    errors: tuple[FieldProblem, ...] = ()


@dataclass
class EnqueueBatch:
    """The items of one enqueue event, in order: a request to send, or a rejection."""

    items: list[EnqueueRequest | Rejection] = field(default_factory=list)
    origin: Literal["direct", "eventbridge"] = "direct"
    #: Invoked asynchronously (EventBridge, or a batch marked ``"asynchronous": true``):
    #: nobody reads the answer, so rejections must fail the invocation to be seen.
    asynchronous: bool = False

    @property
    def requests(self) -> list[tuple[int, EnqueueRequest]]:
        return [(i, item) for i, item in enumerate(self.items) if isinstance(item, EnqueueRequest)]


#: The batch key an asynchronous caller sets (``enqueue_async`` does): Lambda does not tell
#: a function how it was invoked, and an answer to an ``InvocationType=Event`` call is lost.
ASYNCHRONOUS = "asynchronous"


def _rejected_envelope(reason: str, count: int = 1) -> list[EnqueueRequest | Rejection]:
    return [Rejection(reason) for _ in range(max(1, count))]


def _type_name(value: Any) -> str:
    return "null" if value is None else {
        dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
        float: "number"}.get(type(value), type(value).__name__)


def _item(raw: Any, correlation_id: str) -> EnqueueRequest | Rejection:
    if not isinstance(raw, dict):
        return Rejection(f"a job must be a JSON object (got {_type_name(raw)})")
    if raw.get("correlation_id") is None:
        raw = {**raw, "correlation_id": correlation_id}
    try:
        return EnqueueRequest.model_validate(raw)
    except ValidationError as exc:
        return Rejection(describe(exc), problems(exc))


def _body(body: Any, correlation_id: str) -> list[EnqueueRequest | Rejection]:
    if not isinstance(body, dict):
        return _rejected_envelope(
            f"the event must be a JSON object: one job or {{\"jobs\": [...]}} "
            f"(got {_type_name(body)})")
    if "jobs" not in body:
        return [_item(body, correlation_id)]
    jobs = body["jobs"]
    extra = sorted(set(body) - {"jobs", ASYNCHRONOUS})
    if extra:
        return _rejected_envelope(
            f"a batch has only the key \"jobs\" (unexpected: {', '.join(extra)})",
            len(jobs) if isinstance(jobs, list) else 1)
    if not isinstance(jobs, list):
        return _rejected_envelope(f"\"jobs\" must be an array (got {_type_name(jobs)})")
    if not isinstance(body.get(ASYNCHRONOUS, False), bool):
        return _rejected_envelope(
            f"\"{ASYNCHRONOUS}\" must be true or false "
            f"(got {_type_name(body[ASYNCHRONOUS])})", len(jobs))
    if not 1 <= len(jobs) <= MAX_BATCH:
        return _rejected_envelope(
            f"a batch holds 1 to {MAX_BATCH} jobs (got {len(jobs)}); split it", len(jobs))
    items = [_item(raw, correlation_id) for raw in jobs]
    # The valid jobs go to the database in one call: over the call's size bound, the
    # database would refuse it whole, so every job is refused here with its message.
    too_large = enqueue_call_problem([(i, item) for i, item in enumerate(items, 1)
                                      if isinstance(item, EnqueueRequest)])
    if too_large is not None:
        return _rejected_envelope(too_large, len(jobs))
    return items


def parse_enqueue(event: Any, request_id: str) -> EnqueueBatch:
    """Split an enqueue event into per-item requests and rejections.

    Items without a correlation id get the invocation's request id, or the EventBridge
    event's id, so the job's log lines can be traced back to the call that made it.
    """
    if isinstance(event, dict) and "detail-type" in event:
        try:
            envelope = parse(event=event, model=_event_bridge_model())
        except ValidationError as exc:
            return EnqueueBatch(_rejected_envelope(f"invalid EventBridge event: {describe(exc)}"),
                                "eventbridge", True)
        if envelope.detail_type != ENQUEUE_DETAIL_TYPE:
            return EnqueueBatch(_rejected_envelope(
                f"EventBridge detail-type must be {ENQUEUE_DETAIL_TYPE!r} "
                f"(got {envelope.detail_type!r})"), "eventbridge", True)
        return EnqueueBatch(_body(envelope.detail, envelope.id), "eventbridge", True)
    marked = isinstance(event, dict) and "jobs" in event and event.get(ASYNCHRONOUS) is True
    return EnqueueBatch(_body(event, request_id), "direct", marked)
