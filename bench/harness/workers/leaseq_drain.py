"""leaseq: the library's own drain, the call the worker Lambda handler makes.

A ``QueueClient`` over one connection, a registry with one handler for kind ``noop``,
and ``Worker.drain`` with a 900 s deadline (the Lambda maximum), run in the main thread
as in Lambda. Audit events are written by the SQL functions it calls.

Without HANDLER_MS the handler is a sync no-op, run one job at a time (the default
worker). With HANDLER_MS it is an ``async def`` handler that waits that many
milliseconds (``asyncio.sleep``: a network call's wait), SLOTS of them at once.

Usage: python -m harness.workers.leaseq_drain DSN OWNER BATCH [HANDLER_MS SLOTS]
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

from leaseq import MonotonicDeadline, QueueClient, Registry, Worker, WorkerConfig, connect

from harness.workers import protocol

LAMBDA_MAX_SECONDS = 900.0


def noop(payload: Any, context: Any) -> None:
    """The no-op job."""


def waiting_handler(seconds: float) -> Any:
    async def wait(payload: Any, context: Any) -> None:
        """A job that waits on the network and does nothing else."""
        await asyncio.sleep(seconds)

    return wait


def main(dsn: str, owner: str, batch: int, handler_ms: float | None = None,
         slots: int = 1) -> None:
    client = QueueClient(lambda: connect(dsn, application_name=owner))
    client.check()  # connect now, outside the timed window
    registry = Registry()
    registry.register("noop", noop if handler_ms is None else waiting_handler(handler_ms / 1000))
    known = {f.name for f in dataclasses.fields(WorkerConfig)}
    # The drain ends when the queue is empty, as before polling existed (older code
    # under test has no such setting).
    extra: dict[str, Any] = {"poll_idle": 0} if "poll_idle" in known else {}
    if handler_ms is not None:
        extra["concurrency"] = slots
    worker = Worker(client, registry, WorkerConfig(owner=owner, batch_size=batch, **extra))
    protocol.ready_then_wait_for_go()
    report = worker.drain(MonotonicDeadline(LAMBDA_MAX_SECONDS))
    if report.claimed != report.succeeded:
        raise SystemExit(f"drain did not succeed every job: {report.as_dict()}")
    protocol.done(report.succeeded)
    protocol.wait_for_quit()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
         float(sys.argv[4]) if len(sys.argv) > 4 else None,
         int(sys.argv[5]) if len(sys.argv) > 5 else 1)
