"""The elastic drain on the local Lambda service with the real functions: a backlog fans out
to several worker invocations, never more than MaxWorkers, and a job enqueued on an idle
queue starts without waiting for the schedule."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.conftest import Database
from tests.lambda_local.conftest import Start
from tests.lambda_local.elastic.stack import (
    WORKER_FUNCTION,
    assert_exactly_once,
    audit,
    drainers_at_once,
    enqueue,
    jobs,
    messages,
    side_effects,
    start_elastic,
    wait_until_drained,
    wait_until_idle,
    watch_pool,
)
from tests.support.postgres import OWNER

MAX_WORKERS = 3

pytestmark = pytest.mark.usefixtures(side_effects.__name__)


def test_a_backlog_fans_out_to_several_workers_never_more_than_max_workers_and_drains_once(
    start_service: Start, db: Database,
) -> None:
    service = start_elastic(start_service, db,
                            parameters={"MaxWorkers": str(MAX_WORKERS),
                                        "WorkerReservedConcurrency": str(MAX_WORKERS + 1)})
    with watch_pool(db) as seen:
        enqueue(service, jobs(240, sleep=0.05))  # 12 s of work for one worker
        wait_until_drained(db, service)
        wait_until_idle(service)

    assert_exactly_once(audit(db))
    assert 1 < drainers_at_once(db) <= MAX_WORKERS  # from the audit log: fan-out happened
    assert 1 < seen.live <= seen.places <= MAX_WORKERS
    # One connection per execution environment, each kept while it stays warm.
    assert seen.connections <= MAX_WORKERS + 1
    finished = messages(service, "drain finished")
    assert {line["trigger"] for line in finished} <= {"wake", "fanout"}
    assert sum(line["workers_started"] for line in finished) >= 1
    stats = service.service.stats()["functions"][WORKER_FUNCTION]
    assert stats["scheduled"] == 0  # no tick: the enqueue woke the first worker
    assert stats["function_errors"] == 0
    assert seen.samples > 10


def test_a_job_enqueued_on_an_idle_queue_starts_before_the_next_tick_could_fire(
    start_service: Start, db: Database,
) -> None:
    service = start_elastic(start_service, db, schedules=True)  # the tick: rate(1 minute)
    (timer,) = [t for t in service.scheduler.timers if t.function == WORKER_FUNCTION]
    next_tick = time.time() + (timer.next_at - time.monotonic())

    enqueued_at = datetime.now(UTC)
    enqueue(service, jobs(1))
    wait_until_drained(db, service)
    wait_until_idle(service)

    with db.connect(OWNER) as conn:
        (claimed,) = conn.execute("select created_at, actor from app.job_events"
                                  " where event_type = 'claimed'").fetchall()
    assert enqueued_at < claimed["created_at"]
    assert claimed["created_at"].timestamp() < next_tick  # no tick had fired yet
    assert service.service.stats()["functions"][WORKER_FUNCTION]["scheduled"] == 0
    (woken,) = [line for line in messages(service, "drain finished")
                if line["owner"] == claimed["actor"]]
    assert woken["trigger"] == "wake"
    (wake,) = messages(service, "worker woken", "EnqueueFunction")
    assert wake["level"] == "INFO"
