"""A database restart in the middle of a drain: the server of a private embedded
cluster is stopped (fast shutdown: every connection is cut) and started again on the
same data directory and socket while worker processes and the reaper keep going.

The server the rest of the suite uses is never touched: it may be a PostgreSQL that other
tests, or CI's second run, depend on.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from leaseq import EnqueueRequest, connect, enqueue_jobs, migrate
from leaseq_cli import embedded

from tests.failure.audit import audit_queue, create_side_effects_table
from tests.failure.fleet import ReaperLoop, WorkerFleet
from tests.support import postgres

DATABASE = "leaseq_restart"


@dataclass
class RestartableServer:
    """A private embedded server (reachable only by this OS user) that a test restarts."""

    home: Path
    cluster: postgres.Cluster

    def stop(self) -> None:
        embedded.stop(self.home)

    def start(self) -> None:
        embedded.serve(self.home, embedded.peer_authentication())

    def dsn(self, role: str | None) -> str:
        return self.cluster.dsn(user=role, dbname=DATABASE)


@pytest.fixture
def private_server() -> Iterator[RestartableServer]:
    home = Path(tempfile.mkdtemp(prefix="leaseq-restart-"))
    running = embedded.serve(home, embedded.peer_authentication())
    restartable = RestartableServer(home, postgres.Cluster(running.dsn()))
    try:
        postgres.create_login_roles(restartable.cluster)
        postgres.create_database(restartable.cluster, DATABASE)
        with connect(restartable.dsn(postgres.OWNER)) as conn:
            migrate(conn)
        postgres.grant_group_roles(restartable.cluster)
        yield restartable
    finally:
        try:
            restartable.stop()
        finally:
            shutil.rmtree(home, ignore_errors=True)


def _succeeded(dsn: str) -> int | None:
    """Jobs succeeded so far, or None while the server is down."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("select count(*) from app.jobs where state = 'succeeded'"
                               ).fetchone()
    except psycopg.OperationalError:
        return None
    assert row is not None
    return int(row[0])


def test_a_database_restart_mid_drain_loses_no_job_and_records_no_false_outcome(
    private_server: RestartableServer, tmp_path: Path
) -> None:
    jobs = 1500
    admin_dsn = private_server.dsn(None)
    worker_dsn = private_server.dsn(postgres.WORKER)
    tenants = [uuid.uuid4() for _ in range(3)]
    with psycopg.connect(admin_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as admin:
        create_side_effects_table(admin, postgres.WORKER)
    requests = [EnqueueRequest(tenant_id=random.choice(tenants), operation_key=f"op-{n}",
                               kind="chaos.ok", payload={"n": n}) for n in range(jobs)]
    with connect(worker_dsn) as producer:
        for start in range(0, jobs, 1000):
            assert all(r.created for r in enqueue_jobs(producer, requests[start:start + 1000]))

    address_before = embedded.read_postmaster(private_server.home / "pgdata")
    fleet = WorkerFleet(worker_dsn, tmp_path / "fleet", size=2)
    reaper = ReaperLoop(worker_dsn)
    reaper.start()
    fleet.start()
    try:
        deadline = time.monotonic() + 60
        while (_succeeded(admin_dsn) or 0) < jobs // 4:
            assert time.monotonic() < deadline, "the drain never got going"
            time.sleep(0.05)
        private_server.stop()
        assert _succeeded(admin_dsn) is None
        time.sleep(1.5)
        private_server.start()
        restarted = time.monotonic()
        while _succeeded(admin_dsn) != jobs:
            assert time.monotonic() - restarted < 90, "jobs were left unfinished"
            fleet.respawn_dead()
            time.sleep(0.2)
    finally:
        fleet.stop()
        reaper.stop()

    address_after = embedded.read_postmaster(private_server.home / "pgdata")
    assert address_before is not None
    assert address_after is not None
    assert (address_after.socket_dir, address_after.port) == (
        address_before.socket_dir, address_before.port)
    with psycopg.connect(admin_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as admin:
        audit = audit_queue(admin)
        split = admin.execute(
            "select count(*) filter (where created_at < pg_postmaster_start_time()) as before,"
            "       count(*) filter (where created_at > pg_postmaster_start_time()) as after"
            " from app.job_events where event_type = 'succeeded'").fetchone()
        assert split is not None
    reports = fleet.reports()
    failed = [r for r in reports if "failed" in r]
    print("\n" + "\n".join([
        f"succeeded before / after restart  {split['before']} / {split['after']}",
        f"invocations                       {len(reports)} ({len(failed)} failed"
        " while the server was down)",
        *audit.lines()]))

    assert fleet.crashes == []
    assert fleet.spawned == fleet.size, "a worker process died"
    assert failed, "no invocation noticed the restart"
    assert split["before"] > 0
    assert split["after"] > 0
    assert audit.violations == [], "\n".join(audit.violations[:20])
    assert audit.states == {"succeeded": jobs}
    assert audit.double_completions == 0
    assert audit.unbacked_successes == 0

