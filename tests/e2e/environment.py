"""One Lambda execution environment of the end-to-end drain, as a process.

It imports functions/worker/app.py as Lambda does (a cold start), then invokes its
handler with the scheduled event over and over, each time with a short budget, until
told to stop. Each invocation's answer goes back to the test through a queue. If a
handler kills the process, the test starts a new environment in its place.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

from tests.support.fakes import FakeLambdaContext

ROOT = Path(__file__).resolve().parents[2]


def run(name: str, stop: str, results: multiprocessing.Queue[Any], budget_ms: int) -> None:
    spec = importlib.util.spec_from_file_location("worker_app", ROOT / "functions/worker/app.py")
    assert spec is not None
    assert spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    event = json.loads((ROOT / "events" / "worker_schedule.json").read_text())
    invocation = 0
    while not Path(stop).exists():
        invocation += 1
        context = FakeLambdaContext(remaining_ms=budget_ms, function_name=name,
                                    aws_request_id=f"{name}-{invocation}")
        summary = app.lambda_handler(event, context)
        results.put(summary)
        if summary["claimed"] == 0:
            time.sleep(0.1)  # an idle worker waits for its next tick
