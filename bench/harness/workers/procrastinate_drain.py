"""procrastinate: its own worker, run until the queue is caught up (``wait=False``).

Usage: python -m harness.workers.procrastinate_drain DSN CONCURRENCY
"""

from __future__ import annotations

import asyncio
import logging
import sys

from harness.workers import procrastinate_app, protocol


async def main(dsn: str, concurrency: int) -> None:
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = procrastinate_app.build_app(dsn, pool_size=concurrency + 2)
    async with app.open_async():
        protocol.ready_then_wait_for_go()
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False)
        protocol.done(procrastinate_app.processed)
        protocol.wait_for_quit()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
