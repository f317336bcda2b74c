"""Chaos drain: real worker processes against real PostgreSQL, while processes are
SIGKILLed and frozen, their backends terminated, handlers overrun, raise, hang and
crash, and the reaper runs throughout. Afterwards every job has exactly one fate,
and the audit log and the handlers' side effects agree with it.

The default run is sized for CI; ``--soak`` adds a much larger, longer run.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from leaseq import EnqueueRequest, enqueue_jobs

from tests.conftest import Database
from tests.failure.audit import (
    Audit,
    audit_queue,
    create_side_effects_table,
    drop_side_effects_table,
)
from tests.failure.chaos_kinds import BY_NAME, KINDS, Fate
from tests.failure.fleet import ChaosRun, ChaosSettings, ReaperLoop, WorkerFleet
from tests.support import postgres
from tests.support.postgres import Conn


def _backlog(rng: random.Random, jobs: int, tenants: int) -> list[EnqueueRequest]:
    """``jobs`` jobs over ``tenants`` tenants of very different sizes."""
    tenant_ids = [uuid.uuid4() for _ in range(tenants)]
    tenant_weights = [2 ** (i % 5) for i in range(tenants)]
    kinds = rng.choices(KINDS, weights=[k.weight for k in KINDS], k=jobs)
    requests = []
    for n, kind in enumerate(kinds):
        payload: dict[str, Any] = {"n": n}
        if kind.name == "chaos.flaky":
            payload["fail_times"] = rng.randint(1, 3)
        if kind.name == "chaos.typed":
            payload["amount"] = "not a number"
        requests.append(EnqueueRequest(
            tenant_id=rng.choices(tenant_ids, weights=tenant_weights)[0],
            operation_key=f"chaos-{n}",
            kind=kind.name,
            payload=payload,
            max_attempts=kind.max_attempts,
        ))
    return requests


def _fates_by_kind(conn: Conn) -> dict[str, Counter[Fate]]:
    rows = conn.execute(
        """
        select j.kind, j.state::text as state, e.details->>'reason' as reason,
               j.last_error->>'code' as code, count(*) as n
        from app.jobs j
        left join app.job_events e on e.job_id = j.id and e.event_type = 'dead'
        group by 1, 2, 3, 4
        """
    ).fetchall()
    fates: dict[str, Counter[Fate]] = {}
    for row in rows:
        code = row["code"] if row["state"] == "dead" else None
        fates.setdefault(row["kind"], Counter())[(row["state"], row["reason"], code)] += row["n"]
    return fates


def _figures(run: ChaosRun, fleet: WorkerFleet, reaper: ReaperLoop, audit: Audit) -> list[str]:
    reports = fleet.reports()
    last_by_owner: dict[str, dict[str, int]] = {}
    for line in reports:
        last_by_owner[line["owner"]] = line["fenced"]
    fenced: Counter[str] = Counter()
    for counts in last_by_owner.values():
        fenced.update(counts)
    return [
        f"chaos run                  {run.elapsed:.1f} s, {fleet.size} worker processes"
        f" ({fleet.handlers} handlers, concurrency {fleet.concurrency})",
        f"invocations                {len(reports)}"
        f" ({sum('failed' in r for r in reports)} ended by a lost connection)",
        f"processes SIGKILLed        {run.kills} by the test,"
        f" {fleet.exits[-9] - run.kills} by crashing handlers",
        f"processes frozen           {run.freezes} (SIGSTOP {run.settings.freeze_for:g} s)",
        f"backends terminated        {run.terminations}",
        f"reaper passes              {reaper.passes} ({reaper.released} leases released,"
        f" {reaper.failures} passes lost their connection)",
        f"outcomes fenced out        {sum(fenced.values())}"
        f" ({fenced['succeeded']} of them successes)",
        *audit.lines(),
    ]


def run_chaos_drain(db: Database, tmp_path: Path, *, jobs: int, tenants: int, processes: int,
                    settings: ChaosSettings, seed: int, concurrency: int = 1,
                    handlers: str = "sync") -> None:
    rng = random.Random(seed)
    requests = _backlog(rng, jobs, tenants)
    with db.connect(None) as admin, db.connect(postgres.WORKER) as producer:
        create_side_effects_table(admin, postgres.WORKER)
        try:
            for start in range(0, len(requests), 1000):
                results = enqueue_jobs(producer, requests[start:start + 1000])
                assert all(r.created for r in results)
            fleet = WorkerFleet(db.worker_dsn, tmp_path / "fleet", processes,
                                concurrency=concurrency, handlers=handlers)
            reaper = ReaperLoop(db.worker_dsn)
            run = ChaosRun(fleet, admin, settings, rng)
            reaper.start()
            fleet.start()
            try:
                run.run()
            finally:
                fleet.stop()
                reaper.stop()
            audit = audit_queue(admin)
            figures = [f"seed                       {seed}", *_figures(run, fleet, reaper, audit)]
            print("\n" + "\n".join(figures))
            (tmp_path / "figures.txt").write_text("\n".join(figures) + "\n")
            fates = _fates_by_kind(admin)
        finally:
            drop_side_effects_table(admin)

    assert not fleet.crashes, "a worker process died of something other than SIGKILL:\n" + (
        "\n".join(fleet.crashes[:3]))
    assert run.finished, f"jobs were still unfinished after {settings.time_limit} s:\n" + (
        "\n".join(figures))
    assert audit.violations == [], "\n".join(audit.violations[:20])
    assert audit.jobs == jobs
    assert audit.double_completions == 0
    assert audit.unbacked_successes == 0
    assert audit.states["succeeded"] + audit.states["dead"] == jobs
    for kind_name, outcomes in fates.items():
        assert set(outcomes) <= BY_NAME[kind_name].fates, f"{kind_name}: {dict(outcomes)}"
    # The chaos really happened: otherwise this test could not fail.
    assert run.kills > 0
    assert run.terminations > 0
    assert fleet.exits[-9] > run.kills, "no handler crashed its process"
    assert audit.events["lease_expired"] > 0
    assert audit.jobs_executed_twice > 0


def test_every_job_finishes_exactly_once_through_kills_timeouts_and_lost_connections(
    db: Database, tmp_path: Path
) -> None:
    run_chaos_drain(db, tmp_path, jobs=5000, tenants=10, processes=4,
                    settings=ChaosSettings(time_limit=120.0), seed=20261129)


def test_async_handlers_running_concurrently_finish_every_job_exactly_once_through_chaos(
    db: Database, tmp_path: Path
) -> None:
    """The same chaos, with ``async def`` handlers, 8 at once in each process: kills and
    freezes land with many jobs in flight, overruns and hangs are cancelled."""
    run_chaos_drain(db, tmp_path, jobs=5000, tenants=10, processes=4,
                    settings=ChaosSettings(time_limit=120.0), seed=20261201,
                    concurrency=8, handlers="async")


@pytest.mark.soak
def test_soak_every_job_finishes_exactly_once_under_sustained_chaos(
    db: Database, tmp_path: Path
) -> None:
    run_chaos_drain(db, tmp_path, jobs=50_000, tenants=40, processes=8,
                    settings=ChaosSettings(time_limit=1200.0, freeze_every=(2.0, 5.0)),
                    seed=random.randrange(2**32))
