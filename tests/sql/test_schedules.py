"""Periodic jobs in SQL: schedules as owner-set rows, one job per slot however many ticks
race, slots from the database's clock, the missed-slot policy, time zones and daylight
saving time, and refusals at the SQL door (sql/functions/schedules.sql)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import claim, new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

SHARED_TENANT = uuid.UUID(int=0)


@pytest.fixture
def reaper(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.REAPER) as conn:
        yield conn


def put(conn: Conn, tenant: uuid.UUID, name: str, expression: str, *, kind: str = "report.build",
        time_zone: str = "UTC", payload: dict[str, Any] | None = None, fill: int = 0,
        max_attempts: int = 6, source: str = "operator") -> dict[str, Any]:
    row = conn.execute(
        "select * from app.put_schedule(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (tenant, name, kind, expression, time_zone, Jsonb(payload or {}), fill, max_attempts,
         source)).fetchone()
    assert row is not None
    return row


def tick(conn: Conn, limit: int = 100) -> list[dict[str, Any]]:
    return conn.execute("select * from app.tick_schedules(%s)", (limit,)).fetchall()


def slots(conn: Conn, expression: str, time_zone: str, after: datetime, until: datetime,
          limit: int = 1000) -> list[datetime]:
    rows = conn.execute("select s from app.schedule_slots(%s, %s, %s, %s, %s) s",
                        (expression, time_zone, after, until, limit)).fetchall()
    return [r["s"] for r in rows]


def db_now(conn: Conn) -> datetime:
    row = conn.execute("select now() as now").fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def scheduled_jobs(owner: Conn) -> list[dict[str, Any]]:
    return owner.execute(
        "select id, tenant_id, operation_key, kind, payload, max_attempts, state from app.jobs"
        " where operation_key like 'schedule:%' order by operation_key").fetchall()


def move_cursor(owner: Conn, schedule: uuid.UUID, to: datetime) -> None:
    owner.execute("update app.schedules set next_slot = %s where id = %s", (to, schedule))


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# One job per slot -----------------------------------------------------------------------


def test_five_ticks_racing_over_1000_slots_make_exactly_1000_jobs(
        db: Database, owner: Conn, operator: Conn, reaper: Conn) -> None:
    """Twenty schedules of 50 past slots each (minutes 0-49 of an hour three hours ago,
    filled), five reaper logins ticking one schedule per call at once; then the same tick
    delivered three times more; then every cursor rewound, so only the key stands between
    a slot and a second job."""
    hour = (db_now(owner) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    tenant = new_tenant()
    ids = [put(operator, tenant, f"hourly-{i}", f"0-49 {hour.hour} * * *", fill=50,
               payload={"n": i})["schedule_id"] for i in range(20)]
    for schedule in ids:
        move_cursor(owner, schedule, hour)

    start = threading.Barrier(5)
    results: list[list[dict[str, Any]]] = [[] for _ in range(5)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with db.connect(postgres.REAPER) as conn:
                start.wait()
                while rows := tick(conn, 1):
                    results[i].extend(rows)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    ticked = [row for rows in results for row in rows]
    assert sum(row["enqueued"] for row in ticked) == 1000
    assert sorted(row["schedule_id"] for row in ticked) == sorted(ids)
    jobs = scheduled_jobs(owner)
    assert len(jobs) == 1000
    assert len({job["operation_key"] for job in jobs}) == 1000
    created = owner.execute(
        "select count(*) as n from app.job_events where event_type = 'created'").fetchone()
    assert created == {"n": 1000}

    for _ in range(3):
        assert tick(reaper) == []
    assert len(scheduled_jobs(owner)) == 1000

    for schedule in ids:
        move_cursor(owner, schedule, hour)
    again = tick(reaper)
    assert len(again) == 20
    assert sum(row["enqueued"] for row in again) == 0
    assert sum(row["existing"] for row in again) == 1000
    assert len(scheduled_jobs(owner)) == 1000


def test_the_key_of_a_slot_names_its_schedule_and_its_instant_in_utc(
        owner: Conn, operator: Conn, reaper: Conn) -> None:
    now = db_now(owner)
    tenant = new_tenant()
    schedule = put(operator, tenant, "every-minute", "* * * * *")["schedule_id"]
    move_cursor(owner, schedule, now - timedelta(seconds=150))
    [row] = tick(reaper)
    keys = [job["operation_key"] for job in scheduled_jobs(owner)]
    expected = [f"schedule:{schedule}:{s.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
                for s in slots(owner, "* * * * *", "UTC", now - timedelta(seconds=151), now)]
    assert keys == expected
    assert row["enqueued"] == len(expected) >= 2
    assert row["late"] == row["skipped"] == 0
    assert row["next_slot"] > now
    assert row["last_slot"] == max(
        s for s in slots(owner, "* * * * *", "UTC", now - timedelta(minutes=5), now))


def test_slots_come_from_the_database_clock_not_from_the_caller(
        owner: Conn, operator: Conn, reaper: Conn) -> None:
    """The tick takes no instant at all: a session that sets its own time zone or sits in
    an old transaction still gets the slots of the server's now()."""
    tenant = new_tenant()
    schedule = put(operator, tenant, "every-minute", "* * * * *")["schedule_id"]
    reaper.execute("set timezone = 'Pacific/Kiritimati'")
    future = db_now(owner) + timedelta(minutes=30)
    move_cursor(owner, schedule, future)
    assert tick(reaper) == []
    assert scheduled_jobs(owner) == []


def test_a_periodic_job_is_an_ordinary_job_of_its_tenant(
        owner: Conn, operator: Conn, reaper: Conn, worker: Conn) -> None:
    tenant = new_tenant()
    schedule = put(operator, tenant, "nightly", "* * * * *", kind="report.build",
                   payload={"report": "sales"}, max_attempts=3)["schedule_id"]
    move_cursor(owner, schedule, db_now(owner).replace(second=0, microsecond=0))
    [row] = tick(reaper)
    # One slot (two if the minute turned between the two reads).
    *_, job = scheduled_jobs(owner)
    assert job["id"] == row["last_job_id"]
    assert (job["tenant_id"], job["kind"], job["payload"], job["max_attempts"], job["state"]) == (
        tenant, "report.build", {"report": "sales"}, 3, "pending")
    events = owner.execute("select event_type, actor from app.job_events where job_id = %s",
                           (job["id"],)).fetchall()
    assert events == [{"event_type": "created", "actor": "enqueue"}]
    claimed = claim(worker, tenant, limit=2)
    assert job["id"] in {c["id"] for c in claimed}
    listed = operator.execute("select * from app.list_schedules(%s)", (tenant,)).fetchall()
    assert [(r["last_job_id"], r["last_job_state"]) for r in listed] == [(job["id"], "running")]


# Missed slots -----------------------------------------------------------------------------


def _daily_three_days_behind(owner: Conn, operator: Conn, fill: int) -> tuple[uuid.UUID, datetime]:
    """A daily schedule at an hour three hours ago, its cursor three days back: four due
    slots, all missed (older than the grace), the last within the fill window."""
    today = (db_now(owner) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    schedule = put(operator, new_tenant(), "daily", f"0 {today.hour} * * *",
                   fill=fill)["schedule_id"]
    move_cursor(owner, schedule, today - timedelta(days=3))
    return schedule, today


def test_a_skipping_schedule_enqueues_no_missed_slot(
        owner: Conn, operator: Conn, reaper: Conn) -> None:
    _daily_three_days_behind(owner, operator, fill=0)
    [row] = tick(reaper)
    assert (row["enqueued"], row["late"], row["skipped"]) == (0, 0, 4)
    assert scheduled_jobs(owner) == []
    [listed] = operator.execute("select * from app.list_schedules()").fetchall()
    assert listed["slots_missed"] == 4
    assert listed["next_slots"][0] > db_now(owner)


def test_a_filling_schedule_enqueues_missed_slots_only_within_the_fill_window(
        owner: Conn, operator: Conn, reaper: Conn) -> None:
    """The window is 12 hours by default: of four daily slots only today's is enqueued
    (late). A wider window is still held to half the retention floor (1 day)."""
    schedule, today = _daily_three_days_behind(owner, operator, fill=10)
    owner.execute("update app.settings set schedule_window = '10 days'")
    [row] = tick(reaper)
    assert (row["enqueued"], row["late"], row["skipped"]) == (1, 1, 3)
    assert row["last_slot"] == today

    owner.execute("truncate app.jobs, app.job_events, app.claimable, app.leases")
    move_cursor(owner, schedule, today - timedelta(days=3))
    owner.execute("update app.settings set min_retention = '30 days'")
    [row] = tick(reaper)
    assert (row["enqueued"], row["late"], row["skipped"]) == (4, 4, 0)


def test_a_fill_limit_enqueues_the_latest_missed_slots(
        owner: Conn, operator: Conn, reaper: Conn) -> None:
    owner.execute("update app.settings set min_retention = '30 days', schedule_window = '10 days'")
    schedule, today = _daily_three_days_behind(owner, operator, fill=2)
    [row] = tick(reaper)
    assert (row["enqueued"], row["late"], row["skipped"]) == (2, 2, 2)
    keys = [job["operation_key"] for job in scheduled_jobs(owner)]
    assert keys == [f"schedule:{schedule}:{d:%Y-%m-%dT%H:%M:%SZ}"
                    for d in (today - timedelta(days=1), today)]


def test_a_paused_schedule_is_not_ticked_and_on_resume_its_policy_applies(
        owner: Conn, operator: Conn, reaper: Conn) -> None:
    tenant = new_tenant()
    schedule = put(operator, tenant, "minutely", "* * * * *", fill=0)["schedule_id"]
    paused = operator.execute("select * from app.pause_schedule(%s, 'minutely', true)",
                              (tenant,)).fetchone()
    assert paused == {"schedule_id": schedule, "paused": True, "next_slot": None}
    move_cursor(owner, schedule, db_now(owner) - timedelta(hours=1))
    assert tick(reaper) == []
    resumed = operator.execute("select * from app.pause_schedule(%s, 'minutely', false)",
                               (tenant,)).fetchone()
    assert resumed is not None
    assert resumed["paused"] is False
    [row] = tick(reaper)
    # Only the slots within the grace (5 minutes) are enqueued; the hour before is skipped.
    assert 5 <= row["enqueued"] <= 6
    assert row["enqueued"] + row["skipped"] in (60, 61)
    with raises_sqlstate("22023", match="no schedule named 'nothing'"):
        operator.execute("select * from app.pause_schedule(%s, 'nothing')", (tenant,))


# Time zones and daylight saving time --------------------------------------------------------


def test_a_daily_slot_in_the_skipped_spring_hour_fires_once_after_the_jump(owner: Conn) -> None:
    """Europe/Berlin skips 02:00-03:00 on 2026-03-29: the 02:30 slot is 03:30 CEST."""
    got = slots(owner, "30 2 * * *", "Europe/Berlin", utc(2026, 3, 27, 12), utc(2026, 3, 31))
    assert got == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)]
    # 02:00 (skipped) and 03:00 are the same instant that day: one slot.
    got = slots(owner, "0 2,3 * * *", "Europe/Berlin", utc(2026, 3, 28, 12), utc(2026, 3, 29, 12))
    assert got == [utc(2026, 3, 29, 1, 0)]


def test_a_daily_slot_in_the_repeated_autumn_hour_fires_once_at_its_first_occurrence(
        owner: Conn) -> None:
    """Europe/Berlin repeats 02:00-03:00 on 2026-10-25: 02:30 CEST (00:30 UTC) only."""
    got = slots(owner, "30 2 * * *", "Europe/Berlin", utc(2026, 10, 23, 12), utc(2026, 10, 27))
    assert got == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


@pytest.mark.parametrize(("after", "until"), [
    (utc(2026, 10, 24, 23), utc(2026, 10, 25, 3)),  # the repeated hour
    (utc(2026, 3, 28, 23), utc(2026, 3, 29, 3)),    # the skipped hour
])
def test_an_every_hour_schedule_keeps_its_pace_through_daylight_saving_changes(
        owner: Conn, after: datetime, until: datetime) -> None:
    got = slots(owner, "*/15 * * * *", "Europe/Berlin", after, until)
    assert got == [after + timedelta(minutes=15 * i) for i in range(1, 17)]


def test_a_time_zone_moves_the_slots_of_a_cron_expression(owner: Conn) -> None:
    after = utc(2026, 7, 1)
    assert slots(owner, "0 9 * * *", "America/New_York", after, after + timedelta(days=1)) == [
        utc(2026, 7, 1, 13)]
    assert slots(owner, "0 9 * * *", "Asia/Kolkata", after, after + timedelta(days=1)) == [
        utc(2026, 7, 1, 3, 30)]


def test_interval_slots_are_multiples_of_the_interval_since_the_epoch(owner: Conn) -> None:
    after = utc(2026, 7, 1, 0, 0, 10)
    assert slots(owner, "@every 90s", "UTC", after, after + timedelta(minutes=5)) == [
        utc(2026, 7, 1, 0, 1, 30), utc(2026, 7, 1, 0, 3), utc(2026, 7, 1, 0, 4, 30)]
    assert slots(owner, "@every 1h30m", "Europe/Berlin", after, after + timedelta(hours=4)) == [
        utc(2026, 7, 1, 1, 30), utc(2026, 7, 1, 3)]


@pytest.mark.parametrize(("expression", "first"), [
    ("@hourly", utc(2026, 7, 1, 1)),
    ("@daily", utc(2026, 7, 2)),
    ("0 12 * * mon-fri", utc(2026, 7, 1, 12)),    # a Wednesday
    ("0 0 1 jan *", utc(2027, 1, 1)),
    ("0 0 13 * 5", utc(2026, 7, 3)),              # the 13th or a Friday
    ("0 0 29 2 *", utc(2028, 2, 29)),
    ("0 0 * * 7", utc(2026, 7, 5)),               # 7 is Sunday
])
def test_cron_expressions_are_read_as_cron_reads_them(
        owner: Conn, expression: str, first: datetime) -> None:
    after = utc(2026, 7, 1, 0, 30)
    assert slots(owner, expression, "UTC", after, after + timedelta(days=4000), 1) == [first]


# Refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("expression", "time_zone", "message"), [
    ("* * * *", "UTC", "has 4 fields"),
    ("0 * * * * *", "UTC", "has 6 fields"),
    ("61 * * * *", "UTC", "minute field '61' is out of range: use 0 to 59"),
    ("x * * * *", "UTC", "minute field 'x' is not a number"),
    ("5-1 * * * *", "UTC", "runs backwards"),
    ("*/0 * * * *", "UTC", "step must be at least 1"),
    ("0 0 * foo *", "UTC", "'foo' is not a value of the month field"),
    ("0 0 30 2 *", "UTC", "can never fire"),
    ("0 0 31 4,6 *", "UTC", "can never fire"),
    ("@every 30s", "UTC", "finer than a minute are not supported"),
    ("@every 5 minutes", "UTC", "@every followed by numbers with units"),
    ("@reboot", "UTC", "unknown macro"),
    ("", "UTC", "schedule expression is required"),
    ("* * * * *", "Europe/Berln", "time zone 'Europe/Berln' is not an IANA time zone name"),
    ("* * * * *", "CEST", "time zone 'CEST' is not an IANA time zone name"),
])
def test_a_bad_schedule_is_refused_with_what_was_wrong(
        owner: Conn, operator: Conn, expression: str, time_zone: str, message: str) -> None:
    with raises_sqlstate("22023", match=message):
        put(operator, new_tenant(), "bad", expression, time_zone=time_zone)
    assert owner.execute("select count(*) as n from app.schedules").fetchone() == {"n": 0}


@pytest.mark.parametrize(("change", "message"), [
    ({"name": " "}, "schedule name must be a non-blank text"),
    ({"kind": ""}, "kind must be a non-blank text"),
    ({"fill": 1001}, "fill_limit"),
    ({"max_attempts": 0}, "max_attempts"),
])
def test_a_bad_schedule_definition_is_refused(
        operator: Conn, change: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"name": "nightly", **change}
    name = arguments.pop("name")
    with raises_sqlstate("22023", match=message):
        put(operator, new_tenant(), name, "0 3 * * *", **arguments)


# Definitions ---------------------------------------------------------------------------------


def test_putting_a_schedule_again_changes_it_and_keeps_its_cursor_unless_its_slots_change(
        owner: Conn, operator: Conn) -> None:
    tenant = new_tenant()
    first = put(operator, tenant, "nightly", "0 3 * * *", payload={"v": 1})
    assert first["status"] == "created"
    assert put(operator, tenant, "nightly", "0 3 * * *", payload={"v": 1})["status"] == (
        "unchanged")
    move_cursor(owner, first["schedule_id"], utc(2030, 1, 1, 3))
    changed = put(operator, tenant, "nightly", "0 3 * * *", payload={"v": 2})
    assert (changed["status"], changed["next_slot"]) == ("updated", utc(2030, 1, 1, 3))
    moved = put(operator, tenant, "nightly", "0 4 * * *", payload={"v": 2})
    assert moved["status"] == "updated"
    assert moved["next_slot"] < utc(2030, 1, 1)
    assert moved["next_slot"].astimezone(UTC).hour == 4


def test_code_declared_schedules_are_synced_and_an_operators_are_left_alone(
        owner: Conn, operator: Conn) -> None:
    put(operator, SHARED_TENANT, "by-hand", "0 1 * * *")

    def sync(names: list[str]) -> list[tuple[str, str]]:
        n = len(names)
        rows = operator.execute(
            "select * from app.sync_schedules(%s, %s, %s, %s, %s, %s, %s, %s)",
            ([SHARED_TENANT] * n, names, ["cleanup"] * n, ["*/5 * * * *"] * n,
             ["Europe/Berlin"] * n, [Jsonb({})] * n, [0] * n, [6] * n)).fetchall()
        return sorted((r["name"], r["status"]) for r in rows)

    assert sync(["a", "b"]) == [("a", "created"), ("b", "created")]
    assert sync(["b", "c"]) == [("a", "removed"), ("b", "unchanged"), ("c", "created")]
    names = [r["name"] for r in owner.execute("select name from app.schedules order by name")]
    assert names == ["b", "by-hand", "c"]
    with raises_sqlstate("22023", match="declared by an operator"):
        sync(["by-hand"])
    with raises_sqlstate("22023", match="declared in code"):
        put(operator, SHARED_TENANT, "b", "0 1 * * *")


def test_list_shows_each_schedules_next_slots(owner: Conn, operator: Conn) -> None:
    put(operator, SHARED_TENANT, "every-10", "@every 10m")
    [row] = operator.execute("select * from app.list_schedules(null, 3)").fetchall()
    now = db_now(owner)
    assert len(row["next_slots"]) == 3
    assert now < row["next_slots"][0] <= now + timedelta(minutes=10)
    assert [b - a for a, b in zip(row["next_slots"], row["next_slots"][1:], strict=False)] == [
        timedelta(minutes=10)] * 2
    assert operator.execute("select remove_schedule from app.remove_schedule(%s, 'every-10')",
                            (SHARED_TENANT,)).fetchone() == {"remove_schedule": True}
    assert operator.execute("select * from app.list_schedules()").fetchall() == []


# Privileges ----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [postgres.PRODUCER, postgres.TENANT_PRODUCER,
                                  postgres.DUTY_WORKER, postgres.REAPER, postgres.READER])
def test_only_operators_and_the_owner_define_schedules(db: Database, role: str) -> None:
    with db.connect(role) as conn:
        with raises_sqlstate("42501"):
            put(conn, new_tenant(), "sneaky", "* * * * *")
        with raises_sqlstate("42501"):
            conn.execute("select * from app.schedules")
        with raises_sqlstate("42501"):
            conn.execute("select * from app.pause_schedule(%s, 'x', false)", (new_tenant(),))


@pytest.mark.parametrize("role", [postgres.PRODUCER, postgres.DUTY_WORKER, postgres.OPERATOR,
                                  postgres.READER])
def test_only_the_reaper_ticks(db: Database, role: str) -> None:
    with db.connect(role) as conn, raises_sqlstate("42501"):
        tick(conn)
