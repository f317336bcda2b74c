"""Upgrading a database built before 0032 (the outcome written in place): its jobs in
every state and their events are kept as they were, the new columns name its dead and
cancelled jobs, and the finished lists and retention find every finished job through the
new indexes."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate

from tests.conftest import Database
from tests.support import postgres

OUTCOME_IN_PLACE = next(m.version for m in load_migrations() if m.name == "outcome_in_place")
STATES = ("pending", "retry_wait", "succeeded", "dead", "cancelled")
FINAL = ("succeeded", "dead", "cancelled")
JOB_COLUMNS = ("id, tenant_id, operation_key, kind, state, attempts, available_at, claim_key,"
               " priority, result, last_error, created_at, completed_at, outcome")
EVENT_COLUMNS = "sequence, tenant_id, job_id, event_type, actor, details, created_at"


def test_an_upgraded_database_keeps_its_jobs_and_finds_its_finished_ones_by_the_new_indexes(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < OUTCOME_IN_PLACE], [])
    tenants = [uuid.uuid4(), uuid.uuid4()]
    with database.connect(postgres.OWNER) as owner:
        for tenant in tenants:
            owner.execute(
                "insert into app.jobs (tenant_id, operation_key, kind, payload, state,"
                "  attempts, result, completed_at)"
                " select %s, s || '-' || n, 'email.send', '{}'::jsonb, s::app.job_state,"
                "  case when s = 'pending' then 0 else 1 end,"
                "  case when s = 'succeeded' then '{\"ok\": true}'::jsonb end,"
                "  case when s in ('succeeded', 'dead', 'cancelled')"
                "       then clock_timestamp() - n * interval '1 minute' end"
                " from unnest(%s::text[]) as s cross join generate_series(1, 3) as g(n)",
                (tenant, list(STATES)))
        # The events the release wrote: created and claimed, and the outcome's own at the
        # job's completed_at.
        owner.execute(
            "insert into app.job_events (tenant_id, job_id, event_type, actor, details,"
            "  created_at)"
            " select j.tenant_id, j.id, t.type, 'worker-1', '{}'::jsonb,"
            "  coalesce(t.at, j.created_at)"
            " from app.jobs j cross join lateral (values (0, 'created', null::timestamptz),"
            "  (1, 'claimed', null), (2, case when j.state in ('succeeded', 'dead', 'cancelled')"
            "  then j.state::text end, j.completed_at)) as t(n, type, at)"
            " where t.type is not null order by j.id, t.n")
        jobs_before = owner.execute(
            f"select {JOB_COLUMNS} from app.jobs order by id").fetchall()
        events_before = owner.execute(
            f"select {EVENT_COLUMNS} from app.job_events order by sequence").fetchall()
    assert len(jobs_before) == 2 * len(STATES) * 3
    assert len(events_before) == 2 * len(jobs_before) + 2 * len(FINAL) * 3

    with connect(database.owner_dsn) as conn:
        migrate(conn)

    with database.connect(postgres.OWNER) as owner:
        assert owner.execute(
            f"select {JOB_COLUMNS} from app.jobs order by id").fetchall() == jobs_before
        assert owner.execute(
            f"select {EVENT_COLUMNS} from app.job_events order by sequence"
        ).fetchall() == events_before
        for row in owner.execute("select state, completed_at, unsuccessful, unsuccessful_at"
                                 " from app.jobs").fetchall():
            failed = row["state"] in ("dead", "cancelled")
            assert row["unsuccessful"] == (row["state"] if failed else None)
            assert row["unsuccessful_at"] == (row["completed_at"] if failed else None)
        indexes = {r["name"] for r in owner.execute(
            "select indexrelid::regclass::text as name from pg_index"
            " where indrelid = 'app.jobs'::regclass").fetchall()}
        assert indexes == {"app.jobs_pkey", "app.jobs_operation_key_unique",
                           "app.jobs_dead_tenant_idx", "app.jobs_unsuccessful_idx"}

        for state in FINAL:
            listed = owner.execute(
                "select id, sort_at from app.list_jobs(%s::app.job_state, null, null,"
                " null, null, null, null, 500)", (state,)).fetchall()
            expected = sorted(((j["completed_at"], j["id"]) for j in jobs_before
                               if j["state"] == state), reverse=True)
            assert [(r["sort_at"], r["id"]) for r in listed] == expected, state
        dead = owner.execute("select id from app.dead_jobs(null, null, 500)").fetchall()
        assert {r["id"] for r in dead} == {j["id"] for j in jobs_before if j["state"] == "dead"}

        pruned = owner.execute("select * from app.prune_jobs('0 seconds', 1000)").fetchone()
        assert pruned is not None
        assert pruned["jobs_deleted"] == 2 * len(FINAL) * 3
        # Their events went with them (deleted, or with a day dropped whole); the
        # unfinished jobs keep theirs.
        kept = owner.execute("select e.event_type, j.id is null as orphaned, count(*) as n"
                             " from app.job_events e left join app.jobs j on j.id = e.job_id"
                             " group by 1, 2 order by 1, 2").fetchall()
        assert kept == [{"event_type": "claimed", "orphaned": False, "n": 12},
                        {"event_type": "created", "orphaned": False, "n": 12}]
        left = owner.execute("select state, count(*) as n from app.jobs group by state"
                             " order by state").fetchall()
        assert left == [{"state": "pending", "n": 6}, {"state": "retry_wait", "n": 6}]
