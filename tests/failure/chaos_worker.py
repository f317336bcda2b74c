"""One worker process of the chaos drain: invocation after invocation, like a scheduled
Lambda, each with a short random time budget.

Run as ``python -m tests.failure.chaos_worker`` from the repository root. It writes
one JSON line per invocation to ``--report`` (flushed at once, so a process killed
later loses nothing it already reported) and runs until it is killed or ``--stop``
exists.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from leaseq import (
    DatabaseUnavailableError,
    JobRecord,
    MonotonicDeadline,
    QueueClient,
    RetryPolicy,
    Worker,
    WorkerConfig,
    connect,
)

from tests.failure.chaos_handlers import SideEffects, build_async_registry, build_registry
from tests.failure.chaos_kinds import JOB_TIMEOUT


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--budget-min", type=float, default=3.0)
    parser.add_argument("--budget-max", type=float, default=5.0)
    parser.add_argument("--lease-margin", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--handlers", choices=["sync", "async"], default="sync")
    parser.add_argument("--poll-idle", type=float, default=0.5)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    owner = f"{args.name}-{random.getrandbits(32):08x}"
    client = QueueClient(lambda: connect(args.dsn, application_name=f"chaos-queue-{args.name}"))
    effects = SideEffects(
        lambda: connect(args.dsn, application_name=f"chaos-effects-{args.name}"), owner)
    fenced: Counter[str] = Counter()

    def observe(record: JobRecord) -> None:
        if record.state is None:
            fenced[record.outcome] += 1

    worker = Worker(
        client,
        build_registry(effects) if args.handlers == "sync" else build_async_registry(
            lambda: psycopg.AsyncConnection.connect(
                args.dsn, autocommit=True, application_name=f"chaos-effects-{args.name}"),
            owner),
        WorkerConfig(
            owner=owner,
            batch_size=args.batch_size,
            lease_margin=args.lease_margin,
            job_timeout=JOB_TIMEOUT,
            retry=RetryPolicy(base_delay=0.05, max_delay=0.5),
            concurrency=args.concurrency,
            poll_idle=args.poll_idle,
        ),
        on_job=observe,
    )
    with args.report.open("a", encoding="utf-8") as out:
        while not args.stop.exists():
            deadline = MonotonicDeadline(random.uniform(args.budget_min, args.budget_max))
            line: dict[str, Any] = {"owner": owner}
            try:
                client.check()
                report = worker.drain(deadline)
                line.update(report.as_dict())
            except DatabaseUnavailableError as exc:
                line["failed"] = str(exc)[:200]
            line["fenced"] = dict(fenced)
            line["reconnects"] = client.reconnects
            out.write(json.dumps(line) + "\n")
            out.flush()
            if "failed" in line:
                time.sleep(0.2)
            elif line.get("stopped") == "queue_empty":
                time.sleep(0.05)


if __name__ == "__main__":
    main()
