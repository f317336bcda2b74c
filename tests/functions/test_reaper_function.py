"""The reaper function (leaseq_lambda.handlers.reaper) invoked with the sample schedule event."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType

import pytest
from leaseq import EnqueueRequest, QueueClient, connect

from tests.conftest import Database
from tests.functions.conftest import Output, load_event
from tests.library.support import states
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn


def abandon_jobs(db: Database, admin: Conn, count: int) -> None:
    """Jobs claimed by an invocation that died: their leases ran out unrecorded."""
    client = QueueClient(lambda: connect(db.worker_dsn))
    try:
        for tenant in (uuid.uuid4(), uuid.uuid4()):
            client.enqueue_jobs([EnqueueRequest(tenant_id=tenant, operation_key=f"k{i}",
                                                kind="charge_card", payload={})
                                 for i in range(count // 2)])
        client.claim_ready_jobs("leaseq-worker:dead-invocation", 100, timedelta(seconds=30))
    finally:
        client.close()
    admin.execute("update app.leases set expires_at = clock_timestamp() - interval '1 second'")


def test_the_scheduled_tick_releases_every_tenants_expired_leases(
        reaper_app: ModuleType, db: Database, admin: Conn, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    abandon_jobs(db, admin, 6)
    read_output()

    summary = reaper_app.lambda_handler(load_event("reaper_schedule"),
                                        FakeLambdaContext(function_name="leaseq-reaper"))

    assert (summary["status"], summary["released"], summary["complete"]) == ("ok", 6, True)
    assert states(owner) == {"retry_wait": 6}
    out = read_output()
    assert out.metric("JobsReleased") == [6]
    (line,) = out.messages("reaper pass finished")
    assert (line["level"], line["released"]) == ("WARNING", 6)


def test_a_pass_with_nothing_to_release_reports_zero(
        reaper_app: ModuleType, read_output: Callable[[], Output]) -> None:
    summary = reaper_app.lambda_handler({}, FakeLambdaContext())
    assert (summary["released"], summary["calls"], summary["trigger"]) == (0, 1, "manual")
    assert read_output().metric("JobsReleased") == [0]


def test_the_reaper_limit_bounds_each_call(
        reaper_app: ModuleType, lambda_env: pytest.MonkeyPatch, db: Database, admin: Conn,
        owner: Conn) -> None:
    lambda_env.setenv("LEASEQ_REAPER_LIMIT", "2")
    abandon_jobs(db, admin, 6)

    summary = reaper_app.lambda_handler(load_event("reaper_schedule"), FakeLambdaContext())

    assert (summary["released"], summary["calls"], summary["complete"]) == (6, 4, True)


def test_the_tick_deletes_jobs_finished_longer_ago_than_the_retention(
        reaper_app: ModuleType, lambda_env: pytest.MonkeyPatch, db: Database, admin: Conn,
        owner: Conn, read_output: Callable[[], Output]) -> None:
    lambda_env.setenv("LEASEQ_RETENTION_DAYS", "1")
    abandon_jobs(db, admin, 8)
    reaper_app.lambda_handler(load_event("reaper_schedule"), FakeLambdaContext())
    # Four jobs per tenant wait for a retry; k0 finished two days ago, k1 just now.
    # Ended by hand, so the 'succeeded' event a worker's outcome writes is written too:
    # retention finds succeeded jobs by it.
    admin.execute("with ended as (update app.jobs set state = 'succeeded',"
                  " completed_at = clock_timestamp()"
                  " - case when operation_key = 'k0' then interval '2 days' else '0 s' end,"
                  " available_at = clock_timestamp() where operation_key in ('k0', 'k1')"
                  " returning tenant_id, id, completed_at)"
                  " insert into app.job_events (tenant_id, job_id, event_type, actor, created_at)"
                  " select tenant_id, id, 'succeeded', 'test', completed_at from ended")
    read_output()

    summary = reaper_app.lambda_handler(load_event("reaper_schedule"), FakeLambdaContext())

    assert (summary["status"], summary["pruned_jobs"]) == ("ok", 2)  # k0 of both tenants
    assert summary["pruned_events"] == 8  # created, claimed, lease_expired, succeeded
    assert states(owner) == {"succeeded": 2, "retry_wait": 4}
    assert read_output().metric("JobsPruned") == [2]


def test_a_worker_tick_sent_to_the_reaper_is_rejected(reaper_app: ModuleType) -> None:
    answer = reaper_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())
    assert answer["status"] == "rejected"
    assert "this is the reaper function" in answer["reason"]


def test_the_tick_enqueues_due_schedule_slots_and_counts_the_missed_ones(
        reaper_app: ModuleType, db: Database, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    """A skipping schedule three days behind: its slots are skipped, and counted; a
    second schedule due now is enqueued. Both metrics are published on every pass."""
    tenant = uuid.uuid4()
    row = owner.execute("select extract(hour from now() - interval '3 hours')::int as h"
                        ).fetchone()
    assert row is not None
    for name, expression in ((("daily", f"0 {row['h']} * * *"), ("minutely", "* * * * *"))):
        owner.execute("select * from app.put_schedule(%s, %s, 'report', %s)",
                      (tenant, name, expression))
    owner.execute("update app.schedules set next_slot = now() - interval '3 days'"
                  " where name = 'daily'")
    owner.execute("update app.schedules set next_slot = date_trunc('minute', now())"
                  " where name = 'minutely'")
    read_output()

    summary = reaper_app.lambda_handler(load_event("reaper_schedule"), FakeLambdaContext())

    assert summary["schedules_ticked"] == 2
    assert summary["slots_skipped"] == 3
    assert summary["slots_enqueued"] in (1, 2)  # the minute may have turned
    out = read_output()
    assert out.metric("ScheduleSlotsMissed") == [3]
    assert out.metric("ScheduleSlotsEnqueued") == [summary["slots_enqueued"]]
    (line,) = out.messages("a schedule's due slots were not enqueued within the grace")
    assert (line["schedule"], line["skipped"]) == ("daily", 3)

    reaper_app.lambda_handler(load_event("reaper_schedule"), FakeLambdaContext())
    assert read_output().metric("ScheduleSlotsMissed") == [0]


def test_a_pass_reports_each_limits_running_held_and_oldest_held_age_as_metrics(
        reaper_app: ModuleType, db: Database, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    owner.execute("select app.set_limit('ops', 'kind', 'charge_card', null, null, 1)")
    client = QueueClient(lambda: connect(db.worker_dsn))
    try:
        client.enqueue_jobs([EnqueueRequest(tenant_id=uuid.uuid4(), operation_key=f"k{i}",
                                            kind="charge_card", payload={}) for i in range(4)])
        client.claim_ready_jobs("leaseq-worker:live", 10, timedelta(seconds=30))
    finally:
        client.close()
    read_output()

    summary = reaper_app.lambda_handler(load_event("reaper_schedule"), FakeLambdaContext())

    assert summary["jobs_held"] == 3
    out = read_output()
    assert out.metric("JobsHeld") == [3]
    per_limit = ("service", "limit")
    assert out.metric("LimitRunning", per_limit) == [1]
    assert out.metric("LimitBlocked", per_limit) == [3]
    [age] = out.metric("LimitOldestBlockedAge", per_limit)
    assert age >= 0
    assert {d["limit"] for d in out.documents(per_limit)} == {"kind:charge_card"}
