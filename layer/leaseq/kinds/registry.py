"""Job kinds and the functions that run them.

A handler is a plain function or an ``async def`` one; both take ``(payload, ctx)``. A
worker with ``concurrency`` above 1 runs up to that many at once: async handlers as
tasks on one event loop, sync ones in threads (see docs/reliability.md, "Choosing a
handler style").

A registration may name a pydantic model for the payload: the worker validates the
payload before calling the handler, and a payload that does not fit makes the job
dead at once (retrying cannot fix it), with the validation errors as its last_error.
A door that enqueues can refuse such a job before it is stored (:meth:`Registry.check`).

The decorator form returns a :class:`DeclaredKind`: still the handler (the worker and a
test call it as before), and the typed way to enqueue its kind. Its ``defer`` takes the
payload as the handler's first parameter is annotated, so mypy checks a producer's
payload against the handler's model::

    @registry.handler("send_welcome_email", payload=Welcome)
    def send_welcome_email(welcome: Welcome, ctx: JobContext) -> None: ...

    with conn.transaction():                      # in the producer's transaction
        send_welcome_email.defer(conn, tenant, f"welcome-{user.id}", Welcome(user=user.id))

A kind may also be declared periodic (:meth:`Registry.periodic`), beside its handler: the
registry then holds a :class:`leaseq.base.schedules.Schedule` for it, checked at import, which
``leaseq schedules sync`` writes into the database as an operator. Workers never write
schedules: their login has no right to.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from uuid import UUID

import psycopg
from pydantic import BaseModel, ValidationError

from leaseq.base.admission import DeclaredLimit, parse_rate
from leaseq.base.errors import (
    ConfigurationError,
    InvalidRequestError,
    PayloadRejectedError,
    UnknownKindError,
    one_line,
)
from leaseq.base.jobs import EnqueueRequest, EnqueueResult
from leaseq.base.limits import queue_name_problem
from leaseq.base.schedules import SHARED_TENANT, Schedule
from leaseq.base.storable import character_problem, is_blank
from leaseq.kinds.retry import RetryPolicy

if TYPE_CHECKING:
    from leaseq.kinds.job_context import JobContext

JobHandler = Callable[[Any, "JobContext"], Any]
F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P")
R = TypeVar("R")


def is_async_handler(handler: JobHandler) -> bool:
    """Whether calling ``handler`` gives a coroutine to await (``async def``, also
    behind ``functools.partial`` or as an object's ``async def __call__``)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


@dataclass(frozen=True)
class Registration:
    """One kind's handler and its rules; ``is_async`` says how the worker calls it."""

    kind: str
    handler: JobHandler
    payload_model: type[BaseModel] | None = None
    timeout: float | None = None
    retry: RetryPolicy | None = None
    is_async: bool = field(default=False)
    #: The named queue the kind's jobs go to when the producer names none (None: the
    #: database's route for the kind, else "default").
    queue: str | None = None

    def check(self, payload: Any) -> None:
        """Refuse ``payload`` if it does not fit the payload model
        (:class:`PayloadRejectedError`, the model's errors field by field)."""
        if self.payload_model is None:
            return
        try:
            self.payload_model.model_validate(payload)
        except ValidationError as exc:
            raise PayloadRejectedError(self.kind, exc) from None


class JobSink(Protocol):
    """Where :meth:`DeclaredKind.defer` can enqueue besides a connection: a
    :class:`leaseq.QueueClient`, or ``leaseq_lambda.producer.EnqueueFunction``."""

    def enqueue_job(self, request: EnqueueRequest) -> EnqueueResult:
        """Enqueue one job; a conflict or a rejection raises."""
        ...


class DeclaredKind(Generic[P, R]):
    """A registered handler, callable as the handler itself, that enqueues its own kind
    with a payload of the type its first parameter declares (checked by mypy)."""

    def __init__(self, registration: Registration, handler: Callable[[P, JobContext], R]
                 ) -> None:
        self.registration = registration
        self._handler = handler
        functools.update_wrapper(self, handler)

    def __call__(self, payload: P, ctx: JobContext) -> R:
        return self._handler(payload, ctx)

    @property
    def handler(self) -> Callable[[P, JobContext], R]:
        """The function that was declared, as the worker calls it."""
        return self._handler

    @property
    def kind(self) -> str:
        """The job kind this handler is registered for."""
        return self.registration.kind

    def request(self, tenant_id: UUID, operation_key: str, payload: P, *,
                available_at: datetime | None = None, max_attempts: int | None = None,
                correlation_id: str | None = None,
                queue: str | None = None) -> EnqueueRequest:
        """The :class:`EnqueueRequest` of this kind for ``payload`` (a model is stored as
        its JSON form); a payload its model refuses raises :class:`PayloadRejectedError`.
        The job goes to ``queue``, else to the queue the kind was declared with."""
        if isinstance(payload, BaseModel):
            document: Any = payload.model_dump(mode="json")
        else:
            document = payload
        self.registration.check(document)
        return EnqueueRequest(tenant_id=tenant_id, operation_key=operation_key,
                              kind=self.kind, payload=document, available_at=available_at,
                              max_attempts=max_attempts, correlation_id=correlation_id,
                              queue=queue or self.registration.queue)

    def defer(self, to: psycopg.Connection[Any] | JobSink, tenant_id: UUID,
              operation_key: str, payload: P, *, available_at: datetime | None = None,
              max_attempts: int | None = None,
              correlation_id: str | None = None,
              queue: str | None = None) -> EnqueueResult:
        """Enqueue one job of this kind: on a connection (inside the caller's open
        transaction, if any), or through ``to.enqueue_job`` (a QueueClient, the enqueue
        function). A conflict or a rejection raises, as :func:`leaseq.enqueue_job` does.
        The job goes to ``queue``, else to the kind's declared queue."""
        request = self.request(tenant_id, operation_key, payload, available_at=available_at,
                               max_attempts=max_attempts, correlation_id=correlation_id,
                               queue=queue)
        if isinstance(to, psycopg.Connection):
            from leaseq.store.client import enqueue_job

            return enqueue_job(to, request)
        return to.enqueue_job(request)


class Registry:
    """Kinds and their handlers, looked up by the worker for every claimed job.

    One registry per handlers module (``LEASEQ_HANDLERS`` names it in Lambda). A kind's
    ``timeout`` is its budget in seconds (the worker's ``job_timeout`` otherwise),
    ``payload`` a pydantic model the payload must fit, ``retry`` its backoff.

    >>> from pydantic import BaseModel, ValidationError
    >>> from leaseq import RetryPolicy
    >>> class Receipt(BaseModel):
    ...     order: int
    >>> registry = Registry()
    >>> @registry.handler("send_receipt", payload=Receipt, timeout=10,
    ...                   retry=RetryPolicy(base_delay=2, max_attempts=5))
    ... async def send_receipt(receipt: Receipt, ctx: JobContext) -> None:
    ...     await ctx.renew_lease_async()
    >>> registry.kinds, registry.get("send_receipt").is_async
    (['send_receipt'], True)
    """

    def __init__(self) -> None:
        self._by_kind: dict[str, Registration] = {}
        self._schedules: dict[tuple[UUID, str], Schedule] = {}
        self._limits: dict[str, DeclaredLimit] = {}

    def register(
        self,
        kind: str,
        handler: JobHandler,
        *,
        payload: type[BaseModel] | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        queue: str | None = None,
    ) -> Registration:
        """Register ``handler`` for ``kind`` (see the class docstring for the options);
        a kind the queue would refuse, a kind registered twice or a timeout that is not
        positive is a :class:`ConfigurationError`."""
        # The enqueue rule for kinds: a kind that shows nothing, or holds a character
        # kinds may not hold, could never be enqueued.
        if not kind or is_blank(kind) or len(kind) > 128:
            raise ConfigurationError(
                f"job kind {kind!r} is invalid: use 1 to 128 characters, at least one of "
                "them visible (not white space or an invisible format character)")
        problem = character_problem(kind)
        if problem is not None:
            raise ConfigurationError(f"job kind {kind!r} is invalid: it {problem}")
        if kind in self._by_kind:
            raise ConfigurationError(
                f"job kind {kind!r} is registered twice; register each kind once")
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"timeout for kind {kind!r} must be positive seconds")
        if queue is not None and queue_name_problem(queue) is not None:
            raise ConfigurationError(f"queue of kind {kind!r} {queue_name_problem(queue)}")
        if isinstance(handler, DeclaredKind):
            # A handler declared for another kind: the worker calls the function itself,
            # so that an async one is still seen as async.
            handler = handler.handler
        registration = Registration(kind, handler, payload, timeout, retry,
                                    is_async=is_async_handler(handler), queue=queue)
        self._by_kind[kind] = registration
        return registration

    def handler(
        self,
        kind: str,
        *,
        payload: type[BaseModel] | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        queue: str | None = None,
        concurrency: int | None = None,
        rate: str | None = None,
        burst: int | None = None,
        per_tenant: bool = False,
    ) -> Callable[[Callable[[P, JobContext], R]], DeclaredKind[P, R]]:
        """Decorator form of :meth:`register`, for ``def`` and ``async def`` handlers: the
        handler becomes a :class:`DeclaredKind` (callable as before, with ``defer``).
        ``queue`` names the queue the kind's jobs go to when their producer names none
        (its ``defer``, the enqueue function and ``leaseq enqueue`` with this registry).

        ``concurrency`` (at most N of the kind running at once) and ``rate`` (at most R
        starts per period: ``"10/s"``, ``"100/m"``, ``"5/10s"``; ``burst`` of them at once)
        declare the kind's limit, for the kind as a whole or, with ``per_tenant``, for
        the kind within each tenant (:mod:`leaseq.base.admission`). ``leaseq limits sync``
        writes it into the database; an operator's limit on the same subject is in force
        over it. A limit that could never admit a job is a :class:`ConfigurationError`.

        >>> registry = Registry()
        >>> @registry.handler("build_report", concurrency=2, rate="10/s", per_tenant=True)
        ... def build_report(payload, ctx): ...
        >>> [str(x.name) for x in registry.limits]
        ['kind:build_report/tenant:*']
        """
        declared = self._declare_limit(kind, concurrency, rate, burst, per_tenant)

        def decorate(func: Callable[[P, JobContext], R]) -> DeclaredKind[P, R]:
            registration = self.register(kind, func, payload=payload, timeout=timeout,
                                         retry=retry, queue=queue)
            if declared is not None:
                self._limits[kind] = declared
            return DeclaredKind(registration, func)

        return decorate

    def queue_of(self, kind: str) -> str | None:
        """The queue ``kind`` was declared with, or None (unknown, or declared without)."""
        registration = self._by_kind.get(kind)
        return None if registration is None else registration.queue

    def routed(self, request: EnqueueRequest) -> EnqueueRequest:
        """``request`` with its kind's declared queue when it names none itself: the
        producer's choice wins, then the declaration, then the database's route."""
        if request.queue is not None:
            return request
        queue = self.queue_of(request.kind)
        return request if queue is None else request.model_copy(update={"queue": queue})

    def check(self, kind: str, payload: Any) -> None:
        """Refuse a job the worker would record dead without running it: a kind with no
        handler here (:class:`UnknownKindError`) or a payload its model refuses
        (:class:`PayloadRejectedError`). Both are InvalidRequestError."""
        registration = self._by_kind.get(kind)
        if registration is None:
            raise UnknownKindError(kind, self.kinds)
        registration.check(payload)

    def periodic(
        self,
        expression: str,
        *,
        tz: str = "UTC",
        payload: dict[str, Any] | None = None,
        kind: str | None = None,
        name: str | None = None,
        tenant: UUID = SHARED_TENANT,
        fill: int = 0,
        max_attempts: int = 6,
    ) -> Callable[[F], F]:
        """Declare a schedule for a kind: put it above :meth:`handler` (the kind is then
        the decorated handler's), or give ``kind``. ``name`` (the kind by default) is
        unique within ``tenant`` (the shared tenant by default); ``fill`` missed slots
        are enqueued after an outage or a pause (0 skips them). An expression, time zone
        or payload the database would refuse is a :class:`ConfigurationError` here.

        >>> registry = Registry()
        >>> @registry.periodic("*/5 * * * *", tz="Europe/Berlin", payload={"scope": "all"})
        ... @registry.handler("cleanup")
        ... def cleanup(payload, ctx): ...
        >>> [(s.name, s.expression, s.time_zone) for s in registry.schedules]
        [('cleanup', '*/5 * * * *', 'Europe/Berlin')]
        """

        def decorate(func: F) -> F:
            found = kind
            if found is None and isinstance(func, DeclaredKind):
                found = func.kind
            if found is None:
                found = next((r.kind for r in self._by_kind.values() if r.handler is func),
                             None)
            if found is None:
                raise ConfigurationError(
                    f"periodic({expression!r}) decorates {getattr(func, '__name__', func)!r}, "
                    "which is no registered handler: put it above @registry.handler(...), "
                    "or give kind=")
            self.add_schedule(expression, kind=found, tz=tz, payload=payload, name=name,
                              tenant=tenant, fill=fill, max_attempts=max_attempts)
            return func

        return decorate

    def add_schedule(self, expression: str, *, kind: str, tz: str = "UTC",
                     payload: dict[str, Any] | None = None, name: str | None = None,
                     tenant: UUID = SHARED_TENANT, fill: int = 0,
                     max_attempts: int = 6) -> Schedule:
        """The call form of :meth:`periodic`."""
        try:
            schedule = Schedule(tenant_id=tenant, name=name or kind, kind=kind,
                                expression=expression, time_zone=tz, payload=payload or {},
                                fill_limit=fill, max_attempts=max_attempts)
        except ValidationError as exc:
            raise ConfigurationError(
                f"schedule {name or kind!r} of kind {kind!r} is invalid: {one_line(exc)}"
            ) from exc
        key = (schedule.tenant_id, schedule.name)
        if key in self._schedules:
            raise ConfigurationError(
                f"schedule {schedule.name!r} is declared twice in tenant {schedule.tenant_id}; "
                "give each schedule of a kind its own name=")
        self._schedules[key] = schedule
        return schedule

    @property
    def schedules(self) -> list[Schedule]:
        """The declared schedules, by tenant and name."""
        return [self._schedules[key] for key in sorted(self._schedules)]

    @property
    def limits(self) -> list[DeclaredLimit]:
        """The kinds' declared limits, by kind (``leaseq limits sync`` writes them)."""
        return [self._limits[kind] for kind in sorted(self._limits)]

    @staticmethod
    def _declare_limit(kind: str, concurrency: int | None, rate: str | None,
                       burst: int | None, per_tenant: bool) -> DeclaredLimit | None:
        if concurrency is None and rate is None:
            if burst is not None or per_tenant:
                raise ConfigurationError(
                    f"kind {kind!r}: burst and per_tenant need a concurrency or a rate")
            return None
        try:
            parsed = None if rate is None else parse_rate(rate, burst)
            if parsed is None and burst is not None:
                raise ConfigurationError(f"kind {kind!r}: burst needs a rate")
            return DeclaredLimit(kind, concurrency=concurrency, rate=parsed,
                                 per_tenant=per_tenant)
        except InvalidRequestError as exc:
            raise ConfigurationError(f"kind {kind!r}: {exc.message}") from None

    def get(self, kind: str) -> Registration | None:
        """The registration of ``kind``, or None (the worker records a job of a kind it
        does not know dead, with code UNKNOWN_KIND)."""
        return self._by_kind.get(kind)

    @property
    def has_async(self) -> bool:
        """Whether any kind has an ``async def`` handler (the worker then runs an event
        loop, whatever its concurrency)."""
        return any(r.is_async for r in self._by_kind.values())

    @property
    def kinds(self) -> list[str]:
        """The registered kinds, sorted."""
        return sorted(self._by_kind)

    def __len__(self) -> int:
        return len(self._by_kind)
