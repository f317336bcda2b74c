"""A test function that does what its event says and leaves a record of each attempt.

Event keys (all optional): ``sleep`` seconds; ``fail`` (raise ValueError with it);
``counter`` (a file counting attempts) with ``fail_until`` (fail while the attempt
number is at most this); ``record`` (a folder; else $PROBE_RECORD_DIR) where each
attempt writes ``<request id>-<attempt>.json`` with its event, pid and start/end times.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

CALLS = 0


def _attempt(counter: str | None) -> int:
    if not counter:
        return 1
    path = Path(counter)
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    global CALLS
    CALLS += 1
    started = time.time()
    attempt = _attempt(event.get("counter"))
    if event.get("sleep"):
        time.sleep(float(event["sleep"]))
    record = event.get("record") or os.environ.get("PROBE_RECORD_DIR")
    if record:
        name = f"{context.aws_request_id}-{attempt}.json"
        (Path(record) / name).write_text(json.dumps({
            "event": event, "pid": os.getpid(), "start": started, "end": time.time(),
            "attempt": attempt, "function": context.function_name}))
    if event.get("fail"):
        raise ValueError(event["fail"])
    if attempt <= int(event.get("fail_until", 0)):
        raise ValueError(f"attempt {attempt} fails on purpose")
    return {"pid": os.getpid(), "calls": CALLS, "attempt": attempt,
            "remaining_ms": context.get_remaining_time_in_millis(),
            "request_id": context.aws_request_id, "arn": context.invoked_function_arn,
            "name": context.function_name, "memory": context.memory_limit_in_mb,
            "version": context.function_version,
            "trace": os.environ.get("_X_AMZN_TRACE_ID"),
            "task_root": os.environ.get("LAMBDA_TASK_ROOT"),
            "marker": os.environ.get("PROBE_MARKER"),
            "client_custom": getattr(context.client_context, "custom", None)}
