"""A worker process SIGKILLed mid-batch (a Lambda killed at its deadline, out of memory)
repeats only what it had in flight: the jobs still running, and the jobs that finished
less than ``record_interval`` before the kill. Everything else it finished was recorded
already; nothing is lost, nothing is completed twice."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from leaseq import (
    EnqueueRequest,
    MonotonicDeadline,
    QueueClient,
    Worker,
    WorkerConfig,
    connect,
    enqueue_jobs,
)

from tests.conftest import Database
from tests.failure.audit import audit_queue, create_side_effects_table, drop_side_effects_table
from tests.failure.kill_worker import build_registry
from tests.support import postgres
from tests.support.postgres import Conn

REPO_ROOT = Path(__file__).resolve().parents[2]
#: What recording a batch and waking the recorder may add to the interval on a busy
#: machine: the bound below is the interval plus this.
STATEMENT_SLACK = 0.3


@pytest.fixture
def side_effects(db: Database) -> Iterator[Conn]:
    with db.connect(None) as admin:
        create_side_effects_table(admin, postgres.WORKER)
        try:
            yield admin
        finally:
            drop_side_effects_table(admin)


def _enqueue(db: Database, count: int) -> None:
    with db.connect(postgres.WORKER) as producer:
        tenants = [uuid.uuid4() for _ in range(3)]
        results = enqueue_jobs(producer, [
            EnqueueRequest(tenant_id=tenants[n % 3], operation_key=f"kill-{n}", kind="work",
                           payload={"n": n}) for n in range(count)])
        assert all(r.created for r in results)


def _start(db: Database, style: str, concurrency: int, batch: int, seconds: float,
           interval: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.failure.kill_worker", "--dsn", db.worker_dsn,
         "--name", "doomed", "--handlers", style, "--concurrency", str(concurrency),
         "--batch-size", str(batch), "--job-seconds", str(seconds),
         "--record-interval", str(interval)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr.read() if (
        process.stderr) else ""
    return process


def _wait_for(admin: Conn, query: str, at_least: int, limit: float = 60.0) -> None:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        row = admin.execute(query).fetchone()
        if row is not None and row["n"] >= at_least:
            return
        time.sleep(0.02)
    raise AssertionError(f"waited {limit} s for {query!r} to reach {at_least}")


def _kill(admin: Conn, process: subprocess.Popen[str]) -> datetime:
    row = admin.execute("select clock_timestamp() as at").fetchone()
    assert row is not None
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    killed_at: datetime = row["at"]
    return killed_at


def _reap_and_finish(db: Database, admin: Conn) -> dict[str, int]:
    """The reaper takes the dead worker's leases back; another worker drains the rest."""
    admin.execute("update app.leases set expires_at = clock_timestamp() - interval '1 s'")
    client = QueueClient(lambda: connect(db.worker_dsn))
    try:
        released = client.release_all_expired_jobs()
        worker = Worker(client, build_registry(db.worker_dsn, "survivor", "sync", 0.0),
                        WorkerConfig(owner="survivor", poll_idle=0))
        report = worker.drain(MonotonicDeadline(120))
    finally:
        client.close()
    return {"released": released, "succeeded": report.succeeded}


def _first_effects(admin: Conn) -> dict[Any, list[datetime]]:
    by_job: dict[Any, list[datetime]] = {}
    for row in admin.execute("select job_id, recorded_at from public.side_effects"
                             " order by recorded_at").fetchall():
        by_job.setdefault(row["job_id"], []).append(row["recorded_at"])
    return by_job


@pytest.mark.parametrize(("style", "concurrency", "batch", "seconds", "kill_after"), [
    # One at a time: a batch of 20 jobs of 0.1 s takes 2 s, the record interval 0.3 s.
    ("sync", 1, 20, 0.1, 35),
    # Ten at once, async: 0.2 s jobs, killed mid-stream.
    ("async", 10, 10, 0.2, 120),
])
def test_a_hard_kill_repeats_only_jobs_in_flight_or_finished_within_the_record_interval(
        db: Database, side_effects: Conn, style: str, concurrency: int, batch: int,
        seconds: float, kill_after: int) -> None:
    admin = side_effects
    interval = 0.3
    _enqueue(db, 400)
    process = _start(db, style, concurrency, batch, seconds, interval)

    _wait_for(admin, "select count(*) as n from public.side_effects", kill_after)
    killed_at = _kill(admin, process)
    finished_by_then = _first_effects(admin)
    running = admin.execute("select count(*) as n from app.jobs where state = 'running'"
                            ).fetchone()
    assert running is not None
    finished = _reap_and_finish(db, admin)

    audit = audit_queue(admin)
    assert audit.violations == [], audit.violations[:5]
    assert (audit.double_completions, audit.unbacked_successes) == (0, 0)
    assert audit.states == {"succeeded": 400}
    repeated = [job for job, times in _first_effects(admin).items() if len(times) > 1]
    # Every job whose run had finished more than one record interval (plus a statement)
    # before the kill was recorded: none of those ran again.
    too_old = [job for job in repeated
               if (killed_at - finished_by_then[job][0]).total_seconds()
               > interval + STATEMENT_SLACK]
    assert too_old == [], f"{len(too_old)} jobs finished long before the kill ran again"
    # The exact bound: the jobs still running plus those finished within the interval.
    recent = sum(1 for times in finished_by_then.values()
                 if (killed_at - times[0]).total_seconds() <= interval + STATEMENT_SLACK)
    assert len(repeated) <= recent
    assert finished["released"] == running["n"]
    assert finished["released"] > 0  # the kill really left work in flight


def test_an_invocation_killed_with_50_jobs_in_flight_loses_none(
        db: Database, side_effects: Conn) -> None:
    admin = side_effects
    _enqueue(db, 120)
    process = _start(db, "async", 50, 10, 60.0, 1.0)

    _wait_for(admin, "select count(*) as n from app.jobs where state = 'running'", 50)
    _kill(admin, process)
    in_flight = {row["id"] for row in admin.execute(
        "select id from app.jobs where state = 'running'").fetchall()}
    finished = _reap_and_finish(db, admin)

    # 50 handlers running, and up to a batch of claimed jobs waiting for a slot.
    assert 50 <= len(in_flight) <= 60
    assert finished == {"released": len(in_flight), "succeeded": 120}
    audit = audit_queue(admin)
    assert audit.violations == [], audit.violations[:5]
    assert audit.states == {"succeeded": 120}
    assert audit.double_completions == 0
    expired = {row["job_id"] for row in admin.execute(
        "select job_id from app.job_events where event_type = 'lease_expired'").fetchall()}
    assert expired == in_flight  # they came back through the reaper, and only they
