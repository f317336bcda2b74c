"""End to end: 1,000 jobs of 5 tenants drained by concurrent worker invocations with
short budgets, in separate processes running functions/worker/app.py, while the reaper
function runs on its schedule. One environment dies mid-batch, a handler overruns its
budget, some jobs can never succeed, and one tenant's backlog dwarfs the others'.

Every job must end succeeded exactly once, or dead with a stated reason.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from leaseq import EnqueueRequest, QueueClient, connect
from leaseq_lambda import runtime

from tests.conftest import Database
from tests.e2e import environment
from tests.functions.conftest import load_app, load_event
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn

ENVIRONMENTS = 4
BUDGET_MS = 4_000  # a job may need 1 s, plus the 1 s margin: each invocation is short
DEADLINE_SECONDS = 60
NOISY_JOBS, QUIET_JOBS = 800, 50
SPECIAL = {"crash": 2, "overrun": 4, "poison": 5, "no.such.kind": 5}


@pytest.fixture
def e2e_env(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "DATABASE_URL": db.worker_dsn,
        "LEASEQ_HANDLERS": "tests.e2e.handlers",
        "LEASEQ_BATCH_SIZE": "10",
        "LEASEQ_JOB_TIMEOUT_SECONDS": "1",
        "LEASEQ_LEASE_MARGIN_SECONDS": "1",
        "LEASEQ_RETRY_BASE_SECONDS": "0.2",
        "LEASEQ_RETRY_MAX_SECONDS": "1",
        "POWERTOOLS_SERVICE_NAME": "leaseq",
        "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
        "POWERTOOLS_METRICS_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    runtime.reset()
    yield
    runtime.reset()


def enqueue_jobs(db: Database) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """800 jobs of one tenant, then 50 of each of four others.

    The noisy tenant's jobs are enqueued 20 per call, so that calls keep their order in
    the queue; the special kinds sit in chunks far apart, so that no crash can take an
    overrunning job's recorded timeout down with its batch.
    """
    noisy, quiet = uuid.uuid4(), [uuid.uuid4() for _ in range(4)]
    special_chunks = {0: "crash", 4: "crash"}
    special_chunks.update(dict.fromkeys(range(20, 24), "overrun"))
    special_chunks.update(dict.fromkeys(range(24, 29), "poison"))
    special_chunks.update(dict.fromkeys(range(29, 34), "no.such.kind"))
    assert Counter(special_chunks.values()) == SPECIAL
    chunks = [[EnqueueRequest(tenant_id=noisy, operation_key=f"n{chunk}-{i}",
                              kind=special_chunks.get(chunk, "work") if i == 7 else "work",
                              payload={"chunk": chunk, "i": i})
               for i in range(20)] for chunk in range(NOISY_JOBS // 20)]
    chunks += [[EnqueueRequest(tenant_id=tenant, operation_key=f"q{i}", kind="work",
                               payload={"i": i}) for i in range(QUIET_JOBS)]
               for tenant in quiet]
    client = QueueClient(lambda: connect(db.worker_dsn))
    try:
        results = [r for chunk in chunks for r in client.enqueue_jobs(chunk)]
    finally:
        client.close()
    assert len(results) == 1000
    assert all(r.created for r in results)
    return noisy, quiet


def one(conn: Conn, query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return next(iter(row.values()))


def test_a_thousand_jobs_end_succeeded_exactly_once_or_dead_for_a_reason(
        e2e_env: None, db: Database, owner: Conn, tmp_path: Path) -> None:
    noisy, quiet = enqueue_jobs(db)
    total = 1000 + 1
    reaper = load_app("reaper")
    spawn = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[Any] = spawn.Queue()
    stop = tmp_path / "stop"
    started = 0

    def start_environment() -> Any:
        nonlocal started
        started += 1
        process = spawn.Process(target=environment.run, daemon=True,
                                args=(f"leaseq-worker-{started}", str(stop), results, BUDGET_MS))
        process.start()
        return process

    environments = [start_environment() for _ in range(ENVIRONMENTS)]
    crashes, summaries, reaper_released = 0, [], 0
    late_job: uuid.UUID | None = None
    began = time.monotonic()
    try:
        while time.monotonic() - began < DEADLINE_SECONDS:
            for i, process in enumerate(environments):
                if not process.is_alive():  # died mid-batch: Lambda starts a new one
                    assert process.exitcode == 17, process.exitcode
                    crashes += 1
                    environments[i] = start_environment()
            reaper_released += reaper.lambda_handler(
                load_event("reaper_schedule"), FakeLambdaContext(function_name="leaseq-reaper")
            )["released"]
            done = one(owner, "select count(*) from app.jobs where state in ('succeeded', 'dead')")
            if late_job is None and done >= 50:
                # A new tenant's single job arrives behind the noisy tenant's backlog.
                late_job = QueueClient(lambda: connect(db.worker_dsn)).enqueue_job(
                    EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="late", kind="work",
                                   payload={})).job_id
                noisy_waiting = one(owner, "select count(*) from app.jobs where tenant_id = %s"
                                    " and state = 'pending'", noisy)
            if late_job is not None and done == total:
                break
            time.sleep(0.3)
    finally:
        stop.touch()
        for process in environments:
            process.join(10)
            if process.is_alive():
                process.kill()
        while True:
            try:
                summaries.append(results.get(timeout=0.5))
            except queue.Empty:
                break
    elapsed = time.monotonic() - began

    final = {r["state"]: r["count"] for r in owner.execute(
        "select state::text as state, count(*) as count from app.jobs group by state")}
    dead_expected = SPECIAL["poison"] + SPECIAL["no.such.kind"]
    assert final == {"succeeded": total - dead_expected, "dead": dead_expected}, (
        final, elapsed, crashes)

    # Dead only for a stated reason, decided the first time the job ran: never retried
    # by a worker (an attempt may have been spent in a batch that died, though).
    dead = owner.execute(
        "select j.kind, j.last_error, (select count(*) from app.job_events e where"
        " e.job_id = j.id and e.event_type = 'retry_scheduled') as retries"
        " from app.jobs j where j.state = 'dead'").fetchall()
    assert Counter((d["kind"], d["last_error"]["code"], d["retries"]) for d in dead) == {
        ("poison", "DISCARDED", 0): 5, ("no.such.kind", "UNKNOWN_KIND", 0): 5}

    # Succeeded exactly once, under the lease of the attempt that ran last.
    per_job = owner.execute(
        "select j.id, count(*) filter (where e.event_type = 'succeeded') as succeeded,"
        " count(*) filter (where e.event_type = 'claimed') as claimed, j.attempts"
        " from app.jobs j join app.job_events e on e.job_id = j.id"
        " where j.state = 'succeeded' group by j.id, j.attempts").fetchall()
    assert {r["succeeded"] for r in per_job} == {1}
    assert all(r["claimed"] >= r["attempts"] for r in per_job)
    mismatched = one(owner, """
        select count(*) from app.job_events s
        where s.event_type = 'succeeded' and s.lease_token is distinct from (
          select c.lease_token from app.job_events c
          where c.job_id = s.job_id and c.event_type = 'claimed'
          order by c.sequence desc limit 1)""")
    assert mismatched == 0

    # The environments that died mid-batch: their leases expired, the reaper released
    # them, and the jobs (the crashing one and its batch neighbours) succeeded later.
    assert crashes == SPECIAL["crash"]
    assert started == ENVIRONMENTS + crashes
    recovered = owner.execute(
        "select j.kind, j.attempts from app.jobs j where j.state = 'succeeded' and exists ("
        " select 1 from app.job_events e where e.job_id = j.id and e.event_type = 'lease_expired'"
        " and e.actor = 'watchdog')").fetchall()
    assert Counter(r["kind"] for r in recovered)["crash"] == SPECIAL["crash"]
    assert any(r["kind"] == "work" for r in recovered)  # neighbours of a crash, too
    assert all(r["attempts"] >= 2 for r in recovered)
    assert reaper_released >= len(recovered)

    # The handlers that overran their budget were interrupted, failed as retryable
    # by the worker itself (not left to the reaper), and succeeded on a later attempt.
    overruns = owner.execute(
        "select j.attempts, (select e.details -> 'error' ->> 'code' from app.job_events e"
        " where e.job_id = j.id and e.event_type = 'retry_scheduled' order by e.sequence"
        " limit 1) as first_error from app.jobs j where j.kind = 'overrun'").fetchall()
    assert [(r["attempts"], r["first_error"]) for r in overruns] == [(2, "JOB_TIMEOUT")] * 4

    # A quiet tenant's job is not starved by the noisy backlog: between its arrival and
    # its claim, each running invocation claimed at most one other batch (the one it may
    # have had in flight when the job arrived). A batch is one claim call: its audit rows
    # share the claimer and the claim time; the late job's own batch is not counted, though
    # its neighbours' rows may come before the job's own.
    assert late_job is not None
    assert noisy_waiting >= 300
    batches_before = one(owner, """
        with arrival as (
          select sequence from app.job_events where job_id = %s and event_type = 'created'),
        own_batch as (
          select actor, created_at, sequence from app.job_events
          where job_id = %s and event_type = 'claimed' order by sequence limit 1)
        select count(distinct (e.actor, e.created_at))
        from app.job_events e, arrival a, own_batch o
        where e.event_type = 'claimed' and e.sequence > a.sequence and e.sequence < o.sequence
          and (e.actor, e.created_at) is distinct from (o.actor, o.created_at)""",
                         late_job, late_job)
    assert batches_before <= ENVIRONMENTS
    # The quiet tenants' work was all taken up while most of the noisy backlog (which
    # is older, so first in line for a plain FIFO queue) was still waiting.
    noisy_claimed_meanwhile = one(owner, """
        with first_claims as (
          select job_id, tenant_id, min(sequence) as seq from app.job_events
          where event_type = 'claimed' group by job_id, tenant_id)
        select count(*) from first_claims
        where tenant_id = %s
          and seq < (select max(seq) from first_claims where tenant_id = any (%s))""",
                                  noisy, quiet)
    assert noisy_claimed_meanwhile <= NOISY_JOBS // 4
    # ... and from the very first batch on, every tenant was served. (Concurrent claims
    # interleave their audit sequence numbers, so "the first ten by sequence" is no batch.)
    first_batch_tenants = one(owner, """
        with first_claim as (
          select actor, created_at from app.job_events where event_type = 'claimed'
          order by sequence limit 1)
        select count(distinct e.tenant_id) from app.job_events e join first_claim f
          on e.actor = f.actor and e.created_at = f.created_at
        where e.event_type = 'claimed'""")
    assert first_batch_tenants == 5

    # What the invocations reported adds up with what the database recorded.
    reported = sum(s["succeeded"] for s in summaries)
    assert 0 < reported <= total - dead_expected
    assert all(s["status"] == "ok" for s in summaries)
    assert elapsed < DEADLINE_SECONDS
    print(f"e2e drain: {total} jobs in {elapsed:.1f} s, {len(summaries)} invocations, "
          f"{crashes} environments died, {reaper_released} leases released by the reaper, "
          f"late job claimed after {batches_before} other batches, quiet tenants' jobs all "
          f"claimed while {noisy_claimed_meanwhile} of the noisy tenant's were")
