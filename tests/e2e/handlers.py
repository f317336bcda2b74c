"""The handlers module of the end-to-end drain (LEASEQ_HANDLERS=tests.e2e.handlers).

* ``work`` succeeds and returns the attempt it ran in;
* ``crash`` kills its execution environment on its first attempt, abandoning the
  leases of its whole batch, as a Lambda that runs out of memory would;
* ``overrun`` hangs past its 0.5 s budget on its first attempt;
* ``poison`` can never succeed and says so with DiscardJob.

Jobs of any other kind have no handler.
"""

from __future__ import annotations

import os
import time
from typing import Any

from leaseq import DiscardJob, JobContext, Registry

registry = Registry()


@registry.handler("work")
def work(payload: Any, ctx: JobContext) -> dict[str, Any]:
    return {"attempt": ctx.attempt}


@registry.handler("crash")
def crash(payload: Any, ctx: JobContext) -> dict[str, Any]:
    if ctx.attempt == 1:
        os._exit(17)
    return {"attempt": ctx.attempt}


@registry.handler("overrun", timeout=0.5)
def overrun(payload: Any, ctx: JobContext) -> dict[str, Any]:
    if ctx.attempt == 1:
        time.sleep(5)
    return {"attempt": ctx.attempt}


@registry.handler("poison")
def poison(payload: Any, ctx: JobContext) -> None:
    raise DiscardJob("the payload references a deleted account")
