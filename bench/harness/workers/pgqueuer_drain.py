"""PgQueuer: its own QueueManager in drain mode, batch size 10, no-op entrypoint.

Uses asyncpg, the driver PgQueuer's own command line tries first.

Usage: python -m harness.workers.pgqueuer_drain DSN BATCH
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

from harness.workers import protocol


async def main(dsn: str, batch: int) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    jobs = 0

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        nonlocal jobs
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
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
