"""Schedules from Python: the model refuses what the database refuses, with the same
message; the registry declares schedules beside their handlers; the client defines,
lists and syncs them; and a reaper pass enqueues their due slots once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from leaseq import SHARED_TENANT, QueueClient, Registry, Schedule, reap_once
from leaseq.base.errors import ConfigurationError, InvalidRequestError
from leaseq.base.schedules import expression_problem, time_zone_problem
from pydantic import ValidationError

from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn

EXPRESSIONS = [
    "*/5 * * * *", "0 3 * * *", "30 2 * * 1-5", "0 0 1 jan,jul *", "0 12 * * MON-FRI",
    "0-59/15 8-18 * * *", "5 4 * * sun", "0 0 29 2 *", "0 0 31 * *", "0 0 13 * 5",
    "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight",
    "@every 1m", "@every 90s", "@every 1h30m", "@every 2d", "0 0 * * 7",
    "* * * *", "0 * * * * *", "61 * * * *", "x * * * *", "5-1 * * * *", "*/0 * * * *",
    "0 0 * foo *", "0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 24 * * *", "0 0 0 * *",
    "0 0 * 13 *", "0 0 * * 8", "@every 30s", "@every 59s", "@every 5 minutes", "@every",
    "@reboot", "", "   ", "1,,2 * * * *", "*/5/2 * * * *", "@every 367d",
]


def _database_problem(owner: Conn, expression: str) -> str | None:
    try:
        owner.execute("select * from app.schedule_spec(%s)", (expression,))
    except psycopg.Error as exc:
        return f"{exc.sqlstate}: {exc.diag.message_primary}"
    return None


def test_python_refuses_exactly_the_expressions_the_database_refuses(owner: Conn) -> None:
    for expression in EXPRESSIONS:
        problem = expression_problem(expression)
        expected = None if problem is None else f"22023: {problem}"
        assert expected == _database_problem(owner, expression), expression


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata",
                                  "Europe/Berln", "CEST", "Mars/Olympus", "", " UTC"])
def test_python_and_the_database_know_the_same_time_zones(owner: Conn, zone: str) -> None:
    known = owner.execute("select exists (select 1 from pg_timezone_names where name = %s) as k",
                          (zone,)).fetchone()
    assert known is not None
    assert (time_zone_problem(zone) is None) == known["k"]


def test_a_schedule_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValidationError, match="finer than a minute are not supported"):
        Schedule(name="fast", kind="tick", expression="@every 30s")
    with pytest.raises(ValidationError, match="is not an IANA time zone name"):
        Schedule(name="n", kind="k", expression="0 3 * * *", time_zone="Europe/Berln")
    with pytest.raises(ValidationError, match="can never fire"):
        Schedule(name="n", kind="k", expression="0 0 30 2 *")
    with pytest.raises(ValidationError, match="fill_limit"):
        Schedule(name="n", kind="k", expression="0 3 * * *", fill_limit=1001)


def test_the_registry_declares_a_schedule_beside_its_handler() -> None:
    registry = Registry()
    tenant = uuid.uuid4()

    @registry.periodic("*/5 * * * *", tz="Europe/Berlin", payload={"scope": "all"})
    @registry.handler("cleanup")
    def cleanup(payload: object, ctx: object) -> None: ...

    @registry.periodic("0 3 * * *", name="tenant-report", tenant=tenant, fill=2)
    @registry.handler("report")
    def report(payload: object, ctx: object) -> None: ...

    assert registry.schedules == [
        Schedule(name="cleanup", kind="cleanup", expression="*/5 * * * *",
                 time_zone="Europe/Berlin", payload={"scope": "all"}),
        Schedule(tenant_id=tenant, name="tenant-report", kind="report",
                 expression="0 3 * * *", fill_limit=2),
    ]
    assert registry.kinds == ["cleanup", "report"]


def test_the_registry_refuses_a_bad_or_misplaced_schedule_at_import() -> None:
    registry = Registry()
    with pytest.raises(ConfigurationError, match="finer than a minute"):
        registry.add_schedule("@every 10s", kind="poll")
    with pytest.raises(ConfigurationError, match=r"put it above @registry\.handler"):
        @registry.periodic("0 3 * * *")
        def orphan(payload: object, ctx: object) -> None: ...
    registry.add_schedule("0 3 * * *", kind="report")
    with pytest.raises(ConfigurationError, match="declared twice"):
        registry.add_schedule("0 4 * * *", kind="report")


def test_the_client_defines_lists_pauses_and_removes_a_schedule(client: QueueClient) -> None:
    schedule = Schedule(name="nightly", kind="report", expression="30 2 * * *",
                        time_zone="Europe/Berlin", payload={"report": "sales"})
    created = client.put_schedule(schedule)
    assert created["status"] == "created"
    assert client.put_schedule(schedule)["status"] == "unchanged"
    [listed] = client.list_schedules(SHARED_TENANT)
    assert (listed["name"], listed["paused"], len(listed["next_slots"])) == ("nightly", False, 3)
    assert listed["next_slots"][0] == created["next_slot"]
    assert client.pause_schedule(SHARED_TENANT, "nightly")["paused"] is True
    assert client.list_schedules()[0]["next_slots"] == []
    assert client.pause_schedule(SHARED_TENANT, "nightly", paused=False)["paused"] is False
    with pytest.raises(InvalidRequestError, match="no schedule named 'other'"):
        client.pause_schedule(SHARED_TENANT, "other")
    assert client.remove_schedule(SHARED_TENANT, "nightly") is True
    assert client.remove_schedule(SHARED_TENANT, "nightly") is False


def test_syncing_a_registry_writes_its_schedules_and_retires_the_ones_gone(
        client: QueueClient) -> None:
    registry = Registry()
    registry.add_schedule("*/5 * * * *", kind="cleanup")
    registry.add_schedule("@daily", kind="report")
    statuses = {r["name"]: r["status"] for r in client.sync_schedules(registry.schedules)}
    assert statuses == {"cleanup": "created", "report": "created"}
    smaller = Registry()
    smaller.add_schedule("*/5 * * * *", kind="cleanup")
    statuses = {r["name"]: r["status"] for r in client.sync_schedules(smaller.schedules)}
    assert statuses == {"cleanup": "unchanged", "report": "removed"}
    assert [r["source"] for r in client.list_schedules()] == ["code"]


def test_a_reaper_pass_enqueues_due_slots_once(client: QueueClient, owner: Conn) -> None:
    tenant = uuid.uuid4()
    client.put_schedule(Schedule(tenant_id=tenant, name="minutely", kind="report",
                                 expression="* * * * *", fill_limit=10))
    owner.execute("update app.schedules set next_slot ="
                  " date_trunc('minute', now()) - interval '9 minutes'")

    report = reap_once(client, FakeDeadline(60))
    assert report.schedules_ticked == 1
    assert report.slots_enqueued >= 10
    assert report.slots_late == 10 - 5  # older than the 5 minutes' grace
    assert report.slots_skipped == 0
    assert report.slots_missed == report.slots_late
    jobs = owner.execute("select count(*) as n from app.jobs where tenant_id = %s",
                         (tenant,)).fetchone()
    assert jobs == {"n": report.slots_enqueued}

    again = reap_once(client, FakeDeadline(60))
    assert (again.schedules_ticked, again.slots_enqueued) in ((0, 0), (1, 1))
    assert again.slots_missed == 0


def test_a_pass_short_of_time_ticks_no_schedule(client: QueueClient, owner: Conn) -> None:
    client.put_schedule(Schedule(name="minutely", kind="report", expression="* * * * *"))
    owner.execute("update app.schedules set next_slot = now() - interval '2 minutes'")
    report = reap_once(client, FakeDeadline(1), margin=2.0)
    assert report.schedules_ticked == 0
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}
    assert timedelta(0) <= timedelta(seconds=report.time_left)
