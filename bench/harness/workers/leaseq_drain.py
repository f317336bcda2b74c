"""leaseq: the library's own drain, the call the worker Lambda handler makes.

A ``QueueClient`` over one connection, a registry with a no-op handler for kind
``noop``, and ``Worker.drain`` with a 900 s deadline (the Lambda maximum), run in the
main thread as in Lambda. Audit events are written by the SQL functions it calls.

Usage: python -m harness.workers.leaseq_drain DSN OWNER BATCH
"""

from __future__ import annotations

import sys
from typing import Any

from leaseq import MonotonicDeadline, QueueClient, Registry, Worker, WorkerConfig, connect

from harness.workers import protocol

LAMBDA_MAX_SECONDS = 900.0


def noop(payload: Any, context: Any) -> None:
    """The no-op job."""


def main(dsn: str, owner: str, batch: int) -> None:
    client = QueueClient(lambda: connect(dsn, application_name=owner))
    client.check()  # connect now, outside the timed window
    registry = Registry()
    registry.register("noop", noop)
    worker = Worker(client, registry, WorkerConfig(owner=owner, batch_size=batch, poll_idle=0))
    protocol.ready_then_wait_for_go()
    report = worker.drain(MonotonicDeadline(LAMBDA_MAX_SECONDS))
    if report.claimed != report.succeeded:
        raise SystemExit(f"drain did not succeed every job: {report.as_dict()}")
    protocol.done(report.succeeded)
    protocol.wait_for_quit()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
