"""The job handlers of the elastic benchmark (``python3 bench/run.py elastic``).

A module like the one a deployment names in ``LEASEQ_HANDLERS``: a module-level
``registry`` with one kind, ``sleep``, an ``async def`` handler that waits
``LEASEQ_BENCH_HANDLER_MS`` milliseconds (100 unless set; a network call's wait, no CPU)
and then appends the job's number, enqueue time (``t`` in the payload, when the
producer set one), start and end to this process's records file (harness/records.py).
The local Lambda service imports it in every worker execution environment, with bench/
on the path.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from harness.records import writer_from_env
from leaseq import JobContext, Registry

registry = Registry()

KIND = "sleep"
_WAIT = float(os.environ.get("LEASEQ_BENCH_HANDLER_MS", "100")) / 1000
_records = writer_from_env()


@registry.handler(KIND)
async def sleep(payload: Any, ctx: JobContext) -> None:
    """Wait, then say when this job started and ended."""
    started = time.time()
    await asyncio.sleep(_WAIT)
    _records.write(int(payload["n"]), float(payload.get("t", 0.0)), started, time.time())
