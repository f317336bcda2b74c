"""Upgrading a database whose audit trail is one table: after ``migrate`` every event is
kept with its values, in the partition of its UTC day, each past day is closed, and new
events continue the sequence after the highest kept one."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate

from tests.conftest import Database
from tests.support import postgres

EVENTS_BY_DAY = next(m.version for m in load_migrations() if m.name == "events_by_day")

COLUMNS = "sequence, tenant_id, job_id, event_type, actor, details, created_at, lease_token"


def test_an_upgraded_database_keeps_every_event_in_its_day(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < EVENTS_BY_DAY], [])
    tenant = uuid.uuid4()
    with database.connect(postgres.OWNER) as owner:
        owner.execute(
            "insert into app.jobs (tenant_id, operation_key, kind, payload, created_at)"
            " select %s, 'job-' || n, 'email.send', '{}'::jsonb,"
            "  clock_timestamp() - n * interval '7 hours'"
            " from generate_series(1, 40) as g(n)", (tenant,))
        owner.execute(
            "insert into app.job_events (tenant_id, job_id, event_type, actor, details,"
            "  created_at, lease_token)"
            " select j.tenant_id, j.id, t.type, 'enqueue', jsonb_build_object('n', t.n),"
            "  j.created_at + t.n * interval '1 minute',"
            "  case when t.type = 'claimed' then gen_random_uuid() end"
            " from app.jobs j cross join (values (0, 'created'), (1, 'claimed'),"
            "  (2, 'succeeded')) as t(n, type)")
        before = owner.execute(
            f"select {COLUMNS} from app.job_events order by sequence").fetchall()
    assert len(before) == 120

    with connect(database.owner_dsn) as conn:
        migrate(conn)

    with database.connect(postgres.OWNER) as owner:
        after = owner.execute(
            f"select {COLUMNS} from app.job_events order by sequence").fetchall()
        assert after == before
        misplaced = owner.execute(
            "select count(*) as n from app.job_events e"
            " where e.tableoid::regclass::text <> 'app_events.job_events_'"
            "  || to_char((e.created_at at time zone 'UTC')::date, 'YYYYMMDD')").fetchone()
        assert misplaced == {"n": 0}
        days = owner.execute(
            "select count(*) filter (where closed_at is null) as open,"
            " count(*) filter (where day < (clock_timestamp() at time zone 'UTC')::date"
            "  and closed_at is null) as past_open from app.event_days").fetchone()
        assert days == {"open": 4, "past_open": 0}
        job = owner.execute("select id from app.jobs limit 1").fetchone()
        assert job is not None
        added = owner.execute(
            "insert into app.job_events (tenant_id, job_id, event_type, actor)"
            " values (%s, %s, 'released', 'watchdog') returning sequence",
            (tenant, job["id"])).fetchone()
        assert added == {"sequence": before[-1]["sequence"] + 1}
