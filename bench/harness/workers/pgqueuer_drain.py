"""PgQueuer: its own QueueManager in drain mode, batch size 10, one entrypoint.

Uses asyncpg, the driver PgQueuer's own command line tries first. Without HANDLER_MS
the entrypoint is a no-op; with it, the entrypoint waits that many milliseconds
(``asyncio.sleep``) and is registered with ``concurrency_limit=SLOTS``.

PgQueuer 1.6 enforces ``concurrency_limit`` in its dequeue query across *all* workers
of the entrypoint, not per process. With one process that is the same thing; the
elastic benchmark runs several, so it passes ``--per-worker``: the entrypoint is
unlimited and each process takes at most SLOTS jobs at once (``max_concurrent_tasks``,
PgQueuer's per-worker cap), which makes the total processes x SLOTS as with leaseq.

``--continuous`` runs PgQueuer's default mode (LISTEN/NOTIFY, waits for new jobs)
after ``go`` until the orchestrator sends ``stop``, instead of ending when the queue is
empty. With ``LEASEQ_BENCH_RECORDS`` set, each job whose payload carries ``n`` (and
``t``, its enqueue time, when it has one) is recorded with its start and end
(harness/records.py).

Usage: python -m harness.workers.pgqueuer_drain DSN BATCH [HANDLER_MS SLOTS]
       [--per-worker] [--continuous]
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

from harness.records import writer_from_env
from harness.workers import protocol


async def main(dsn: str, batch: int, handler_ms: float | None = None, slots: int = 0,
               *, per_worker: bool = False, continuous: bool = False) -> None:
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "pgqueuer-worker"})
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    jobs = 0
    wait = None if handler_ms is None else handler_ms / 1000
    records = writer_from_env()
    limit = slots if wait is not None and not per_worker else 0

    @qm.entrypoint("noop", concurrency_limit=limit)
    async def noop(job: Job) -> None:
        nonlocal jobs
        started = time.time()
        if wait is not None:
            await asyncio.sleep(wait)
        jobs += 1
        if records.enabled and job.payload:
            document = json.loads(job.payload)
            if "n" in document:
                records.write(int(document["n"]), float(document.get("t", 0.0)), started,
                              time.time())

    protocol.ready_then_wait_for_go()
    loop = asyncio.get_running_loop()
    if continuous:
        def stop_on_word() -> None:
            protocol.wait_for("stop")
            loop.call_soon_threadsafe(qm.shutdown.set)

        threading.Thread(target=stop_on_word, daemon=True).start()
    await qm.run(
        batch_size=batch,
        mode=QueueExecutionMode.continuous if continuous else QueueExecutionMode.drain,
        dequeue_timeout=timedelta(seconds=1),
        max_concurrent_tasks=slots if per_worker and slots else None,
    )
    protocol.done(jobs)
    protocol.wait_for_quit()
    await conn.close()


if __name__ == "__main__":
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(main(args[0], int(args[1]),
                     float(args[2]) if len(args) > 2 else None,
                     int(args[3]) if len(args) > 3 else 0,
                     per_worker="--per-worker" in flags, continuous="--continuous" in flags))
