"""Upgrading a database built before 0030 and 0031 (the claim key's trigger, the events'
index): its jobs in every state and their events are kept as they were, a hand edit still
moves a pending job's key and its claimable entry, and a job's timeline reads the same
events through the new index, in sequence order."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate

from tests.conftest import Database
from tests.support import postgres

CLAIM_KEY_AFTER_UPDATE = next(m.version for m in load_migrations()
                              if m.name == "claim_key_after_update")
STATES = ("pending", "retry_wait", "succeeded", "dead", "cancelled")
JOB_COLUMNS = ("id, tenant_id, operation_key, state, attempts, available_at, claim_key,"
               " priority, completed_at")
EVENT_COLUMNS = "sequence, tenant_id, job_id, event_type, actor, details, created_at"


def test_an_upgraded_database_keeps_its_jobs_and_events_and_reads_them_through_the_new_index(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < CLAIM_KEY_AFTER_UPDATE], [])
    tenants = [uuid.uuid4(), uuid.uuid4()]
    with database.connect(postgres.OWNER) as owner:
        for tenant in tenants:
            owner.execute(
                "insert into app.jobs (tenant_id, operation_key, kind, payload, state,"
                "  attempts, completed_at)"
                " select %s, s || '-' || n, 'email.send', '{}'::jsonb, s::app.job_state,"
                "  case when s = 'pending' then 0 else 1 end,"
                "  case when s in ('succeeded', 'dead', 'cancelled') then clock_timestamp() end"
                " from unnest(%s::text[]) as s cross join generate_series(1, 3) as g(n)",
                (tenant, list(STATES)))
        owner.execute(
            "insert into app.job_events (tenant_id, job_id, event_type, actor, details)"
            " select j.tenant_id, j.id, t.type, 'enqueue', jsonb_build_object('n', t.n)"
            " from app.jobs j cross join (values (0, 'created'), (1, 'claimed'),"
            "  (2, 'released')) as t(n, type) order by j.id, t.n")
        jobs_before = owner.execute(
            f"select {JOB_COLUMNS} from app.jobs order by id").fetchall()
        events_before = owner.execute(
            f"select {EVENT_COLUMNS} from app.job_events order by sequence").fetchall()
    assert len(jobs_before) == 2 * len(STATES) * 3
    assert len(events_before) == 3 * len(jobs_before)

    with connect(database.owner_dsn) as conn:
        migrate(conn)

    with database.connect(postgres.OWNER) as owner:
        assert owner.execute(
            f"select {JOB_COLUMNS} from app.jobs order by id").fetchall() == jobs_before
        assert owner.execute(
            f"select {EVENT_COLUMNS} from app.job_events order by sequence"
        ).fetchall() == events_before
        indexes = {r["name"] for r in owner.execute(
            "select indexrelid::regclass::text as name from pg_index"
            " where indrelid = 'app.job_events'::regclass").fetchall()}
        assert "app.job_events_job_id_idx" in indexes
        assert "app.job_events_job_idx" not in indexes

        pending = next(j for j in jobs_before if j["state"] == "pending")
        owner.execute("update app.jobs set available_at = available_at + interval '1 hour'"
                      " where id = %s", (pending["id"],))
        moved = owner.execute("select j.available_at, j.claim_key, c.claim_key as entry_key"
                              " from app.jobs j join app.claimable c on c.job_id = j.id"
                              " where j.id = %s", (pending["id"],)).fetchone()
        assert moved is not None
        assert moved["claim_key"] == moved["entry_key"]
        assert moved["available_at"] - moved["claim_key"] == (
            pending["available_at"] - pending["claim_key"])
        assert moved["available_at"] == pending["available_at"] + timedelta(hours=1)

        job = jobs_before[0]
        timeline = owner.execute("select sequence, event_type from app.job_timeline(%s, 100)",
                                 (job["id"],)).fetchall()
        assert timeline == [
            {"sequence": e["sequence"], "event_type": e["event_type"]}
            for e in events_before if e["job_id"] == job["id"]]
