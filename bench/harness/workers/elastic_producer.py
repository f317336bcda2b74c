"""The elastic benchmark's producer: Poisson arrivals, one job per arrival.

The arrival times are drawn from ``random.Random(SEED)`` (exponential gaps at RATE per
second) up to DURATION seconds, so every system gets the same arrivals. After ``go``
the producer sleeps until each arrival's moment and enqueues one job whose payload is
``{"n": <number>, "t": <time.time() when the enqueue began>}``; if it falls behind it
enqueues at once (the lag is reported). How it enqueues:

* ``leaseq``: the library in the producer's own transaction (``enqueue_job(conn, ...)``
  inside ``conn.transaction()``), then, with ``--wake FUNCTION``, the ``wake_worker``
  helper after the commit, as a producer that holds its own connection would;
* ``leaseq`` with ``--via-function FUNCTION``: a synchronous invoke of the enqueue
  function through the Lambda Invoke API (``AWS_ENDPOINT_URL_LAMBDA``), which wakes a
  worker itself after its commit;
* ``pgqueuer``: ``Queries.enqueue`` on one asyncpg connection (PgQueuer's trigger sends
  the NOTIFY its workers listen for).

Prints ``done <jobs> <wakes started> <wake errors> <max lag s>``.

Usage: python -m harness.workers.elastic_producer SYSTEM DSN RATE DURATION SEED
       [--wake FUNCTION | --via-function FUNCTION]
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid
from typing import Any

from harness.workers import protocol

TENANT = uuid.uuid5(uuid.NAMESPACE_URL, "leaseq-bench-elastic")


def arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Seconds after the start at which jobs arrive (a Poisson process)."""
    rng = random.Random(seed)
    times: list[float] = []
    at = rng.expovariate(rate)
    while at < duration:
        times.append(at)
        at += rng.expovariate(rate)
    return times


def _leaseq(dsn: str, schedule: list[float], wake: str | None,
            via_function: str | None) -> tuple[int, int, int, float]:
    from leaseq import EnqueueRequest, connect, enqueue_job

    conn = connect(dsn, application_name="leaseq-bench-producer")
    waker: Any = None
    if wake:
        from leaseq_lambda import scaling

        waker = scaling.wake_worker
    function: Any = None
    if via_function:
        from leaseq_lambda.producer import EnqueueFunction

        function = EnqueueFunction(via_function)
    # Both are built before the clock starts (pydantic's schema, boto3's client).
    EnqueueRequest(tenant_id=TENANT, operation_key="warm", kind="sleep", payload={})
    protocol.ready_then_wait_for_go()
    start = time.time()
    wakes = errors = 0
    lag = 0.0
    for n, at in enumerate(schedule):
        delay = start + at - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            lag = max(lag, -delay)
        t = time.time()
        request = EnqueueRequest(tenant_id=TENANT, operation_key=f"job-{n}", kind="sleep",
                                 payload={"n": n, "t": t})
        if function is not None:
            function.enqueue([request])
            continue
        with conn.transaction():
            enqueue_job(conn, request)
        if waker is not None:
            try:
                wakes += int(waker(conn, wake))
            except Exception as exc:  # best effort, as the helper's callers treat it
                errors += 1
                print(f"wake failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    conn.close()
    return len(schedule), wakes, errors, lag


async def _pgqueuer(dsn: str, schedule: list[float]) -> tuple[int, int, int, float]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(
        dsn, server_settings={"application_name": "leaseq-bench-producer"})
    queries = Queries(AsyncpgDriver(conn))
    protocol.ready_then_wait_for_go()
    start = time.time()
    lag = 0.0
    for n, at in enumerate(schedule):
        delay = start + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            lag = max(lag, -delay)
        payload = json.dumps({"n": n, "t": time.time()}).encode()
        await queries.enqueue("noop", payload, 0)
    await conn.close()
    return len(schedule), 0, 0, lag


def main(argv: list[str]) -> None:
    flags = dict(zip(argv[5::2], argv[6::2], strict=True))
    system, dsn, rate, duration, seed = argv[0], argv[1], float(argv[2]), float(argv[3]), \
        int(argv[4])
    schedule = arrivals(rate, duration, seed)
    if system == "pgqueuer":
        result = asyncio.run(_pgqueuer(dsn, schedule))
    else:
        result = _leaseq(dsn, schedule, flags.get("--wake"), flags.get("--via-function"))
    jobs, wakes, errors, lag = result
    print(f"done {jobs} {wakes} {errors} {lag:.6f}", flush=True)
    protocol.wait_for_quit()


if __name__ == "__main__":
    main(sys.argv[1:])
