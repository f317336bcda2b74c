"""Eight workers drain one shared backlog: every job runs exactly once, audited once."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import new_tenant
from tests.support import postgres
from tests.support.postgres import Conn

WORKERS = 8
JOBS = 2_000
TENANTS = 10
BATCH = 20


def _enqueue_backlog(worker: Conn) -> set[uuid.UUID]:
    tenants = [new_tenant() for _ in range(TENANTS)]
    ids: set[uuid.UUID] = set()
    for start in range(0, JOBS, 1000):
        numbers = range(start, min(start + 1000, JOBS))
        rows = worker.execute(
            "select job_id, status from app.enqueue_jobs(%s, %s, %s, %s)",
            (
                [tenants[n % TENANTS] for n in numbers],
                [f"job-{n}" for n in numbers],
                ["drain.test"] * len(numbers),
                [Jsonb({"n": n}) for n in numbers],
            ),
        ).fetchall()
        assert {r["status"] for r in rows} == {"created"}
        ids.update(r["job_id"] for r in rows)
    return ids


def _drain(db: Database, name: str, batch_finish: bool, start: threading.Barrier,
           claimed: list[uuid.UUID], finished: list[uuid.UUID]) -> None:
    """Claim fairly across tenants until nothing is ready; finish every job claimed."""
    with db.connect(postgres.WORKER) as conn:
        start.wait(timeout=30)
        while True:
            batch = conn.execute(
                "select id, tenant_id, lease_token from app.claim_ready_jobs(%s, %s, %s)",
                (name, BATCH, timedelta(minutes=5)),
            ).fetchall()
            if not batch:
                return
            claimed.extend(r["id"] for r in batch)
            if batch_finish:
                finished.extend(_finish_batch(conn, name, batch))
            else:
                for job in batch:
                    ok = conn.execute(
                        "select app.complete_job(%s, %s, %s, %s, %s) as ok",
                        (job["tenant_id"], job["id"], name, job["lease_token"],
                         Jsonb({"by": name})),
                    ).fetchone()
                    if ok is not None and ok["ok"]:
                        finished.append(job["id"])


def _finish_batch(conn: Conn, name: str, batch: list[dict[str, Any]]) -> list[uuid.UUID]:
    rows = conn.execute(
        "select job_id, state from app.finish_jobs(%s, %s, %s, %s, %s, %s, %s)",
        (
            name,
            [j["tenant_id"] for j in batch],
            [j["id"] for j in batch],
            [j["lease_token"] for j in batch],
            ["succeeded"] * len(batch),
            [Jsonb({"by": name})] * len(batch),
            [None] * len(batch),
        ),
    ).fetchall()
    return [r["job_id"] for r in rows if r["state"] == "succeeded"]


def test_eight_workers_drain_2000_jobs_each_succeeding_exactly_once(
    db: Database, worker: Conn, owner: Conn
) -> None:
    ids = _enqueue_backlog(worker)
    assert len(ids) == JOBS
    start = threading.Barrier(WORKERS)
    claimed: list[list[uuid.UUID]] = [[] for _ in range(WORKERS)]
    finished: list[list[uuid.UUID]] = [[] for _ in range(WORKERS)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            _drain(db, f"worker-{i}", i % 2 == 0, start, claimed[i], finished[i])
        except BaseException as exc:  # re-raised below, in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    all_claimed = [j for part in claimed for j in part]
    all_finished = [j for part in finished for j in part]
    assert len(all_claimed) == JOBS, "a job was claimed twice or never"
    assert set(all_claimed) == ids
    assert sorted(all_finished) == sorted(ids)
    assert sum(1 for part in claimed if part) >= 2, "the drain did not run concurrently"

    states = owner.execute(
        "select state, attempts, count(*) as n from app.jobs group by state, attempts"
    ).fetchall()
    assert states == [{"state": "succeeded", "attempts": 1, "n": JOBS}]
    per_job = owner.execute(
        """
        select job_id, event_type, count(*) as n
        from app.job_events group by job_id, event_type
        """
    ).fetchall()
    counts = Counter((r["event_type"], r["n"]) for r in per_job)
    assert counts == {("created", 1): JOBS, ("claimed", 1): JOBS, ("succeeded", 1): JOBS}
    assert {r["job_id"] for r in per_job} == ids
    owners = owner.execute(
        """
        select count(*) as mismatched
        from app.job_events c
        join app.job_events s on s.job_id = c.job_id and s.event_type = 'succeeded'
        where c.event_type = 'claimed'
          and (c.actor <> s.actor or c.lease_token <> s.lease_token)
        """
    ).fetchone()
    assert owners == {"mismatched": 0}
