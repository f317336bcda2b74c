"""PgQueuer: its own QueueManager in drain mode, batch size 10, one entrypoint.

Uses asyncpg, the driver PgQueuer's own command line tries first. Without HANDLER_MS
the entrypoint is a no-op; with it, the entrypoint waits that many milliseconds
(``asyncio.sleep``) and is registered with ``concurrency_limit=SLOTS``.

Usage: python -m harness.workers.pgqueuer_drain DSN BATCH [HANDLER_MS SLOTS]
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

from harness.workers import protocol


async def main(dsn: str, batch: int, handler_ms: float | None = None, slots: int = 0) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    jobs = 0
    wait = None if handler_ms is None else handler_ms / 1000

    @qm.entrypoint("noop", concurrency_limit=slots if wait is not None else 0)
    async def noop(job: Job) -> None:
        nonlocal jobs
        if wait is not None:
            await asyncio.sleep(wait)
        jobs += 1

    protocol.ready_then_wait_for_go()
    await qm.run(
        batch_size=batch,
        mode=QueueExecutionMode.drain,
        dequeue_timeout=timedelta(seconds=1),
    )
    protocol.done(jobs)
    protocol.wait_for_quit()
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]),
                     float(sys.argv[3]) if len(sys.argv) > 3 else None,
                     int(sys.argv[4]) if len(sys.argv) > 4 else 0))
