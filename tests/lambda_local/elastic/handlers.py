"""Job handlers of the elastic drain tests, run inside the worker function's execution
environments (``LEASEQ_HANDLERS=tests.lambda_local.elastic.handlers``).

Each handler that succeeds first writes its side effect to ``public.side_effects`` over a
connection of its own (``ELASTIC_EFFECTS_DSN``), as the failure suite's handlers do, so
the audit can tell a second execution (allowed) from a second completion (never).

* ``elastic.work``     sleeps ``sleep`` seconds (default 0.05), then succeeds;
* ``elastic.crash``    on its first attempt records its effect, then kills its own
  process (an invocation killed mid-flight: out of memory, a crash);
* ``elastic.stubborn`` on its first attempt swallows its interruption and sleeps until
  the service kills the invocation at its deadline (Lambda's timeout).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import psycopg
from leaseq import JobContext, Registry

from tests.failure.chaos_handlers import SideEffects

effects = SideEffects(
    lambda: psycopg.connect(os.environ["ELASTIC_EFFECTS_DSN"], autocommit=True),
    f"{os.environ.get('AWS_LAMBDA_FUNCTION_NAME', 'worker')}:{os.getpid()}")
registry = Registry()


@registry.handler("elastic.work")
def work(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
    time.sleep(float(payload.get("sleep", 0.05)))
    effects.record(context)
    return {"n": payload.get("n")}


@registry.handler("elastic.crash")
def crash(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
    if context.attempt == 1:
        effects.record(context)
        os.kill(os.getpid(), signal.SIGKILL)
    return work(payload, context)


@registry.handler("elastic.stubborn", timeout=1.0)
def stubborn(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
    if context.attempt == 1:
        while True:  # the point: it ignores its interruption (JobTimeout)
            with contextlib.suppress(BaseException):
                time.sleep(3600)
    return work(payload, context)
