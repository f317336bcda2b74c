"""Job kinds and the functions that run them.

A registration may name a pydantic model for the payload: the worker validates the
payload before calling the handler, and a payload that does not fit makes the job
dead at once (retrying cannot fix it), with the validation errors as its last_error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from leaseq.errors import ConfigurationError
from leaseq.retry import RetryPolicy
from leaseq.storable import is_blank

if TYPE_CHECKING:
    from leaseq.job_context import JobContext

JobHandler = Callable[[Any, "JobContext"], Any]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Registration:
    kind: str
    handler: JobHandler
    payload_model: type[BaseModel] | None = None
    timeout: float | None = None
    retry: RetryPolicy | None = None


class Registry:
    def __init__(self) -> None:
        self._by_kind: dict[str, Registration] = {}

    def register(
        self,
        kind: str,
        handler: JobHandler,
        *,
        payload: type[BaseModel] | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Registration:
        # The enqueue rule for kinds: a kind that shows nothing could never be enqueued.
        if not kind or is_blank(kind) or len(kind) > 128:
            raise ConfigurationError(
                f"job kind {kind!r} is invalid: use 1 to 128 characters, at least one of "
                "them visible (not white space or an invisible format character)")
        if kind in self._by_kind:
            raise ConfigurationError(
                f"job kind {kind!r} is registered twice; register each kind once")
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"timeout for kind {kind!r} must be positive seconds")
        registration = Registration(kind, handler, payload, timeout, retry)
        self._by_kind[kind] = registration
        return registration

    def handler(
        self,
        kind: str,
        *,
        payload: type[BaseModel] | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`register`."""

        def decorate(func: F) -> F:
            self.register(kind, func, payload=payload, timeout=timeout, retry=retry)
            return func

        return decorate

    def get(self, kind: str) -> Registration | None:
        return self._by_kind.get(kind)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._by_kind)

    def __len__(self) -> int:
        return len(self._by_kind)
