"""Test doubles for time and Lambda, never for the database."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


class ManualClock:
    """A clock that moves only when told to (or by ``tick`` per reading)."""

    def __init__(self, start: float = 1000.0, *, tick: float = 0.0) -> None:
        self.now = start
        self.tick = tick

    def __call__(self) -> float:
        value = self.now
        self.now += self.tick
        return value

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeDeadline:
    """A deadline whose remaining time the test sets and moves."""

    def __init__(self, remaining: float) -> None:
        self._remaining = remaining

    def remaining(self) -> float:
        return max(0.0, self._remaining)

    def spend(self, seconds: float) -> None:
        self._remaining -= seconds


@dataclass
class FakeLambdaContext:
    """The attributes of awslambdaric's LambdaContext that leaseq and Powertools read.

    Remaining time follows the runtime's formula (deadline minus wall clock, floored
    at zero), with a deadline the test chooses.
    """

    remaining_ms: float = 60_000
    function_name: str = "leaseq-worker"
    function_version: str = "$LATEST"
    memory_limit_in_mb: str = "256"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:leaseq-worker"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = "/aws/lambda/leaseq-worker"
    log_stream_name: str = "2026/11/29/[$LATEST]test"
    _deadline_ms: float = 0.0

    def __post_init__(self) -> None:
        self._deadline_ms = time.time() * 1000 + self.remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self._deadline_ms - time.time() * 1000))
