"""The one place that reads a Lambda context's clock, and the worker's owner id."""

from __future__ import annotations

from typing import Protocol


class LambdaContextLike(Protocol):
    """What leaseq reads from the runtime's context object (tests pass their own)."""

    @property
    def function_name(self) -> str: ...

    @property
    def aws_request_id(self) -> str: ...

    def get_remaining_time_in_millis(self) -> int: ...


class LambdaDeadline:
    """A :class:`leaseq.Deadline` that is the invocation's own timeout.

    The runtime computes the remaining time from the wall clock on every call, so the
    worker sees time pass (and a test's context can be given any budget).
    """

    def __init__(self, context: LambdaContextLike) -> None:
        self._context = context

    def remaining(self) -> float:
        return max(0.0, self._context.get_remaining_time_in_millis() / 1000.0)


#: The SQL contract's bound on a lease owner's length.
MAX_OWNER_LENGTH = 200


def owner_id(context: LambdaContextLike, worker_id: str | None = None) -> str:
    """``<LEASEQ_WORKER_ID or function name>:<request id>``: unique per invocation, so a
    late duplicate delivery of the same schedule tick can never finish this one's jobs,
    and readable in the audit trail."""
    request_id = context.aws_request_id
    prefix = worker_id or context.function_name or "leaseq"
    return f"{prefix[: MAX_OWNER_LENGTH - len(request_id) - 1]}:{request_id}"
