"""A Lambda context for invocations the command line makes in its own process.

It carries the attributes the runtime's LambdaContext has and that the handlers and
Powertools read; the remaining time follows the runtime's formula (deadline minus
wall clock, never negative), with the budget the operator chose.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass
class LocalLambdaContext:
    budget_seconds: float
    function_name: str = "leaseq-worker"
    function_version: str = "$LATEST"
    memory_limit_in_mb: str = "512"
    aws_request_id: str = field(default_factory=lambda: f"local-{uuid.uuid4()}")
    log_group_name: str = "local"
    log_stream_name: str = "local"
    _deadline_ms: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._deadline_ms = time.time() * 1000 + self.budget_seconds * 1000

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:local:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self._deadline_ms - time.time() * 1000))
