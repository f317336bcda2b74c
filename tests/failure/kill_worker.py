"""One worker process for the hard-kill tests: a single drain, killed by the test.

Jobs of kind ``work`` wait ``--job-seconds`` (``time.sleep`` in a sync handler,
``asyncio.sleep`` in an async one), then write their side effect (job id, lease token,
the database's clock) over a connection of their own, then return: a side effect marks
a finished handler run. Run as ``python -m tests.failure.kill_worker`` from the
repository root; it prints ``ready`` once connected.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import psycopg
from leaseq import (
    JobContext,
    MonotonicDeadline,
    QueueClient,
    Registry,
    Worker,
    WorkerConfig,
    connect,
)

from tests.failure.chaos_handlers import AsyncSideEffects, SideEffects


def build_registry(dsn: str, name: str, style: str, seconds: float) -> Registry:
    registry = Registry()
    if style == "sync":
        effects = SideEffects(lambda: connect(dsn, application_name=f"kill-effects-{name}"), name)

        @registry.handler("work", timeout=30)
        def work(payload: Any, ctx: JobContext) -> None:
            time.sleep(seconds)
            effects.record(ctx)
    else:
        async_effects = AsyncSideEffects(lambda: psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name=f"kill-effects-{name}"), name)

        @registry.handler("work", timeout=30)
        async def work_async(payload: Any, ctx: JobContext) -> None:
            await asyncio.sleep(seconds)
            await async_effects.record(ctx)
    return registry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--handlers", choices=["sync", "async"], required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--job-seconds", type=float, required=True)
    parser.add_argument("--record-interval", type=float, default=1.0)
    args = parser.parse_args()
    client = QueueClient(lambda: connect(args.dsn, application_name=f"kill-queue-{args.name}"))
    client.check()
    worker = Worker(client, build_registry(args.dsn, args.name, args.handlers, args.job_seconds),
                    WorkerConfig(owner=args.name, concurrency=args.concurrency,
                                 batch_size=args.batch_size, record_interval=args.record_interval,
                                 lease_margin=1, poll_idle=0))
    print("ready", flush=True)
    worker.drain(MonotonicDeadline(120))


if __name__ == "__main__":
    main()
