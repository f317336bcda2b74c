"""The audit trail by day: app.roll_event_days makes the days ahead and closes the past
ones, every event lands in its day's partition, retention drops a whole old day but keeps
the events of jobs still retained and of redriven jobs, readers see their tenant's events
through the parent only, and a detach that cannot have its lock leaves the day for the
next pass without failing the prune."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pytest

from tests.conftest import Database
from tests.sql.calls import claim_one, enqueue, new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn


@pytest.fixture
def reaper(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.REAPER) as conn:
        yield conn


def _today() -> date:
    return datetime.now(UTC).date()


def _partition(day: date) -> str:
    return f"app_events.job_events_{day:%Y%m%d}"


def _exists(owner: Conn, name: str) -> bool:
    row = owner.execute("select to_regclass(%s) is not null as ok", (name,)).fetchone()
    return bool(row and row["ok"])


def _old_day(owner: Conn, days_ago: int) -> date:
    day = _today() - timedelta(days=days_ago)
    owner.execute("select app.add_event_day(%s)", (day,))
    return day


def _move_events(admin: Conn, job_id: uuid.UUID, day: date) -> None:
    """Put a job's events into an old day (the row moves to that day's partition)."""
    admin.execute(
        "update app.job_events set created_at = (%s::date)::timestamp at time zone 'UTC'"
        " + interval '12 hours' + sequence * interval '1 millisecond' where job_id = %s",
        (day, job_id))


def _where(owner: Conn, job_id: uuid.UUID) -> list[str]:
    rows = owner.execute(
        "select tableoid::regclass::text as part from app.job_events where job_id = %s"
        " order by sequence", (job_id,)).fetchall()
    return [r["part"] for r in rows]


def _finished(worker: Conn, admin: Conn, tenant: uuid.UUID, key: str,
              age: timedelta) -> uuid.UUID:
    job_id: uuid.UUID = enqueue(worker, tenant, key)["id"]
    lease = claim_one(worker, tenant)
    worker.execute("select app.complete_job(%s, %s, 'worker-1', %s, null)",
                   (tenant, job_id, lease["lease_token"]))
    admin.execute("update app.jobs set completed_at = clock_timestamp() - %s where id = %s",
                  (age, job_id))
    return job_id


def test_roll_makes_today_and_the_days_ahead_and_closes_past_days(
    owner: Conn, reaper: Conn
) -> None:
    past = _old_day(owner, 30)
    owner.execute("update app.event_days set closed_at = null where day = %s", (past,))

    first = reaper.execute("select * from app.roll_event_days(6)").fetchone()
    again = reaper.execute("select * from app.roll_event_days(6)").fetchone()

    assert first is not None
    assert again is not None
    assert first["days_added"] >= 1
    assert first["days_closed"] >= 1
    assert (again["days_added"], again["days_closed"], again["analyzed"]) == (0, 0, False)
    for n in range(7):
        assert _exists(owner, _partition(_today() + timedelta(days=n)))
    closed = owner.execute("select closed_at from app.event_days where day = %s",
                           (past,)).fetchone()
    assert closed is not None
    assert closed["closed_at"] is not None
    today = owner.execute("select closed_at, analyzed_at from app.event_days where day = %s",
                          (_today(),)).fetchone()
    assert today is not None
    assert today["closed_at"] is None
    assert today["analyzed_at"] is not None


def test_events_land_in_the_partition_of_their_day(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    job_id = enqueue(worker, tenant, "a")["id"]
    claim_one(worker, tenant)
    assert _where(owner, job_id) == [_partition(_today())] * 2
    far = _today() + timedelta(days=200)
    owner.execute(
        "insert into app.job_events (tenant_id, job_id, event_type, actor, created_at)"
        " values (%s, %s, 'released', 'watchdog', (%s::date)::timestamp at time zone 'UTC')",
        (tenant, job_id, far))
    assert _where(owner, job_id)[-1] == "app_events.job_events_default"


def test_prune_drops_an_old_day_and_keeps_the_events_of_a_retained_job(
    worker: Conn, admin: Conn, owner: Conn, reaper: Conn
) -> None:
    day = _old_day(owner, 40)
    tenant = new_tenant()
    gone = _finished(worker, admin, tenant, "gone", timedelta(days=35))
    recent = _finished(worker, admin, tenant, "recent", timedelta(days=3))
    kept = enqueue(worker, tenant, "kept")["id"]
    for job_id in (gone, kept, recent):
        _move_events(admin, job_id, day)
    assert _where(owner, recent) == [_partition(day)] * 3

    row = reaper.execute("select * from app.prune_retained_jobs('14 days', 100)").fetchone()

    # Its 'succeeded' event, which found it, goes with it; the day took the others.
    assert row == {"jobs_deleted": 1, "events_deleted": 1}
    assert not _exists(owner, _partition(day))
    dropped = owner.execute("select dropped_at from app.event_days where day = %s",
                            (day,)).fetchone()
    assert dropped is not None
    assert dropped["dropped_at"] is not None
    assert _where(owner, gone) == []
    assert _where(owner, kept) == ["app_events.job_events_default"]
    assert _where(owner, recent) == ["app_events.job_events_default"] * 3
    types = owner.execute("select event_type from app.job_events where job_id = %s"
                          " order by sequence", (recent,)).fetchall()
    assert [r["event_type"] for r in types] == ["created", "claimed", "succeeded"]

    admin.execute("update app.jobs set completed_at = clock_timestamp() - interval '20 days'"
                  " where id = %s", (recent,))
    again = reaper.execute("select * from app.prune_retained_jobs('14 days', 100)").fetchone()
    assert again == {"jobs_deleted": 1, "events_deleted": 3}
    assert _where(owner, recent) == []


def test_a_redriven_jobs_events_hold_their_day_until_the_job_is_pruned(
    worker: Conn, admin: Conn, owner: Conn, operator: Conn
) -> None:
    day = _old_day(owner, 45)
    tenant = new_tenant()
    job_id = enqueue(worker, tenant, "dead", max_attempts=1)["id"]
    lease = claim_one(worker, tenant)
    worker.execute("select app.discard_job(%s, %s, 'worker-1', %s, '{\"code\": \"E\"}')",
                   (tenant, job_id, lease["lease_token"]))
    _move_events(admin, job_id, day)
    operator.execute("select * from app.redrive_jobs_by_id('ops', %s)", ([job_id],))
    holds = owner.execute("select day, reason from app.event_holds where job_id = %s"
                          " order by day", (job_id,)).fetchall()
    assert holds == [{"day": day, "reason": "redriven"}]

    held = owner.execute("select * from app.drop_event_days(clock_timestamp())").fetchone()

    assert held is not None
    assert held["days_held"] >= 1
    assert _exists(owner, _partition(day))
    assert _where(owner, job_id)[:3] == [_partition(day)] * 3

    admin.execute("delete from app.jobs where id = %s", (job_id,))
    released = owner.execute("select * from app.drop_event_days(clock_timestamp())").fetchone()
    assert released is not None
    assert released["days_dropped"] >= 1
    assert not _exists(owner, _partition(day))
    assert owner.execute("select count(*) as n from app.event_holds where job_id = %s",
                         (job_id,)).fetchone() == {"n": 0}


def test_a_reader_sees_its_tenants_events_through_the_parent_and_no_partition(
    worker: Conn, owner: Conn, reader: Conn, db: Database
) -> None:
    mine, other = new_tenant(), new_tenant()
    job_id = enqueue(worker, mine, "mine")["id"]
    enqueue(worker, other, "other")
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, mine))
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(mine),))
    rows = reader.execute("select job_id, event_type from app.job_events").fetchall()
    assert rows == [{"job_id": job_id, "event_type": "created"}]
    for role in (postgres.READER, postgres.WORKER, postgres.REAPER, postgres.OPERATOR,
                 postgres.DASHBOARD):
        with db.connect(role) as conn:
            for part in (_partition(_today()), "app_events.job_events_default"):
                with raises_sqlstate("42501", match="app_events"):
                    conn.execute(f"select tenant_id from {part}")
            with raises_sqlstate("42501"):
                conn.execute("select day from app.event_days")


def test_a_detach_under_a_held_lock_gives_up_and_the_prune_still_succeeds(
    worker: Conn, admin: Conn, owner: Conn, operator: Conn, db: Database
) -> None:
    day = _old_day(owner, 50)
    tenant = new_tenant()
    gone = _finished(worker, admin, tenant, "gone", timedelta(days=49))
    _move_events(admin, gone, day)
    with db.connect(postgres.WORKER) as drain, drain.transaction():
        enqueue(drain, new_tenant(), "in-flight")  # holds app.job_events until it commits
        started = time.monotonic()
        row = operator.execute("select * from app.prune_jobs('1 day', 100)").fetchone()
        took = time.monotonic() - started
    assert row == {"jobs_deleted": 1, "events_deleted": 1}  # its 'succeeded' event
    assert 0.9 <= took < 5
    assert _exists(owner, _partition(day))

    later = operator.execute("select * from app.prune_jobs('1 day', 100)").fetchone()
    assert later == {"jobs_deleted": 0, "events_deleted": 0}
    assert not _exists(owner, _partition(day))
