#!/usr/bin/env python3
"""How late a producer waiting for a job's result learns that it finished, and what the
wait costs the database: ``leaseq.base.results.poll_until_finished`` as ``wait_for_result``
and the enqueue function's result operation use it.

``python3 bench/result_wait.py --dsn SUPERUSER_DSN [--rounds 40] [--seed 1]`` (in the
project's environment: ``source scripts/bootstrap`` first). A database of its own is
created, migrated with this checkout's ``sql/``, and dropped at the end.

Each round enqueues one job and waits for it (defaults: first interval 0.1 s, doubling
to 2 s, jitter) while another thread, after a delay drawn uniformly from 0 to
``--max-delay`` seconds, claims and finishes it as a worker would. Reported: the delay
from the worker's commit to the waiter's return (median, 95th percentile, max), and the
reads per wait (each one ``app.get_job_result``, an index lookup by primary key), with
their mean rate per second of waiting. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layer"))

from leaseq import EnqueueRequest, JobOutcome, QueueClient, connect
from leaseq.base.results import JobResult, poll_until_finished
from leaseq.store.migrate import load_functions, load_migrations, migrate

SQL = Path(__file__).resolve().parents[1] / "sql"


def fresh_database(admin_dsn: str) -> tuple[str, str]:
    name = f"leaseq_bench_results_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    dsn = make_conninfo(admin_dsn, dbname=name)
    with connect(dsn) as conn:
        migrate(conn, load_migrations(SQL / "migrations"), load_functions(SQL / "functions"))
    return name, dsn


def one_round(producer: QueueClient, worker: QueueClient, tenant: uuid.UUID, n: int,
              delay: float) -> dict[str, float]:
    created = producer.enqueue_job(EnqueueRequest(tenant_id=tenant, operation_key=f"r-{n}",
                                                  kind="bench"))
    finished_at: list[float] = []

    def work() -> None:
        time.sleep(delay)
        (job,) = worker.claim_ready_jobs("bench-worker", 1, timedelta(seconds=60))
        worker.finish_jobs("bench-worker", [JobOutcome(job, "succeeded", {"n": n})])
        finished_at.append(time.monotonic())

    reads = 0

    def read() -> JobResult | None:
        nonlocal reads
        reads += 1
        return producer.job_result(tenant, job_id=created.job_id)

    thread = threading.Thread(target=work)
    started = time.monotonic()
    thread.start()
    found = poll_until_finished(read, 60)
    returned = time.monotonic()
    thread.join()
    assert found is not None
    assert found.finished
    return {"late_ms": (returned - finished_at[0]) * 1000, "reads": reads,
            "waited_s": returned - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a superuser DSN")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--max-delay", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    name, dsn = fresh_database(args.dsn)
    producer = QueueClient(lambda: connect(dsn))
    worker = QueueClient(lambda: connect(dsn))
    try:
        tenant = uuid.uuid4()
        rounds = [one_round(producer, worker, tenant, n, rng.uniform(0, args.max_delay))
                  for n in range(args.rounds)]
    finally:
        producer.close()
        worker.close()
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'drop database "{name}" with (force)')
    late = sorted(r["late_ms"] for r in rounds)
    reads = [r["reads"] for r in rounds]
    waited = sum(r["waited_s"] for r in rounds)
    server: Any
    with psycopg.connect(args.dsn) as conn:
        server = conn.execute("show server_version").fetchone()
    print(json.dumps({
        "server_version": server[0] if server else None,
        "rounds": args.rounds, "max_delay_s": args.max_delay,
        "late_ms": {"median": round(statistics.median(late), 1),
                    "p95": round(late[int(0.95 * (len(late) - 1))], 1),
                    "max": round(late[-1], 1)},
        "reads_per_wait": {"mean": round(statistics.mean(reads), 1), "max": max(reads)},
        "reads_per_second_waiting": round(sum(reads) / waited, 2),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
