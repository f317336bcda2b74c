"""A database that ran the reference schema as written is upgraded in place.

The reference script is applied by the non-superuser owner, as it would have been on
RDS; rows are seeded by the administrator because the reference's forced RLS lets the
owner write nothing. Then ``migrate()`` runs as the owner and every row and event must
still be there, with lease tokens moved out of the event details.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Conn

REFERENCE = Path(__file__).parent / "fixtures" / "reference-schema.sql"

TENANT_A = uuid.UUID("0a000000-0000-4000-8000-00000000000a")
TENANT_B = uuid.UUID("0b000000-0000-4000-8000-00000000000b")
LIVE_TOKEN = uuid.UUID("11111111-1111-4111-8111-111111111111")
EXPIRED_TOKEN = uuid.UUID("22222222-2222-4222-8222-222222222222")
DONE_TOKEN = uuid.UUID("33333333-3333-4333-8333-333333333333")


@dataclass(frozen=True)
class Seeded:
    database: Database
    jobs_before: list[dict[str, Any]]
    events_before: list[dict[str, Any]]
    ids: dict[str, uuid.UUID]


def _insert_job(admin: Conn, tenant: uuid.UUID, key: str, **columns: Any) -> uuid.UUID:
    values: dict[str, Any] = {
        "state": "pending", "attempts": 0, "lease_owner": None, "lease_token": None,
        "lease_expires_at": None, "last_error": None, "result": None, "completed_at": None,
        **columns,
    }
    row = admin.execute(
        """
        insert into app.jobs (tenant_id, operation_key, kind, payload, state, attempts,
                              available_at, lease_owner, lease_token, lease_expires_at,
                              last_error, result, completed_at)
        values (%s, %s, 'email.send', %s, %s, %s, clock_timestamp() - interval '5 minutes',
                %s, %s, clock_timestamp() + %s, %s, %s, %s)
        returning id
        """,
        (
            tenant, key, Jsonb({"key": key}), values["state"], values["attempts"],
            values["lease_owner"], values["lease_token"], values["lease_expires_at"],
            values["last_error"], values["result"], values["completed_at"],
        ),
    ).fetchone()
    assert row is not None
    return row["id"]  # type: ignore[no-any-return]


def _insert_event(
    admin: Conn, tenant: uuid.UUID, job_id: uuid.UUID, event_type: str, actor: str,
    details: dict[str, Any],
) -> None:
    admin.execute(
        "insert into app.job_events (tenant_id, job_id, event_type, actor, details)"
        " values (%s, %s, %s, %s, %s)",
        (tenant, job_id, event_type, actor, Jsonb(details)),
    )


def _seed(admin: Conn) -> dict[str, uuid.UUID]:
    """Jobs in every state, with the audit trail the reference functions would write."""
    ids: dict[str, uuid.UUID] = {}
    ids["pending"] = _insert_job(admin, TENANT_A, "pending")
    ids["retry"] = _insert_job(
        admin, TENANT_A, "retry", state="retry_wait", attempts=1,
        last_error=Jsonb({"code": "TIMEOUT"}),
    )
    _insert_event(admin, TENANT_A, ids["retry"], "claimed", "w1",
                  {"attempt": 1, "leaseToken": str(uuid.uuid4()), "leaseExpiresAt": "t1"})
    _insert_event(admin, TENANT_A, ids["retry"], "retry_scheduled", "w1",
                  {"leaseToken": str(uuid.uuid4()), "error": {"code": "TIMEOUT"}})
    ids["live"] = _insert_job(
        admin, TENANT_A, "live", state="running", attempts=1, lease_owner="w2",
        lease_token=LIVE_TOKEN, lease_expires_at=timedelta(minutes=10),
    )
    _insert_event(admin, TENANT_A, ids["live"], "claimed", "w2",
                  {"attempt": 1, "leaseToken": str(LIVE_TOKEN), "leaseExpiresAt": "t2"})
    ids["expired"] = _insert_job(
        admin, TENANT_B, "expired", state="running", attempts=1, lease_owner="w3",
        lease_token=EXPIRED_TOKEN, lease_expires_at=timedelta(minutes=-1),
    )
    _insert_event(admin, TENANT_B, ids["expired"], "claimed", "w3",
                  {"attempt": 1, "leaseToken": str(EXPIRED_TOKEN), "leaseExpiresAt": "t3"})
    ids["succeeded"] = _insert_job(
        admin, TENANT_B, "succeeded", state="succeeded", attempts=1,
        result=Jsonb({"ok": True}), completed_at=None,
    )
    _insert_event(admin, TENANT_B, ids["succeeded"], "claimed", "w4",
                  {"attempt": 1, "leaseToken": str(DONE_TOKEN), "leaseExpiresAt": "t4"})
    _insert_event(admin, TENANT_B, ids["succeeded"], "succeeded", "w4",
                  {"leaseToken": str(DONE_TOKEN)})
    ids["dead"] = _insert_job(
        admin, TENANT_B, "dead", state="dead", attempts=6, last_error=Jsonb({"code": "X"}),
    )
    _insert_event(admin, TENANT_B, ids["dead"], "dead", "watchdog", {"recoveredState": "dead"})
    return ids


@pytest.fixture
def reference_database(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> Seeded:
    """The reference as written. It grants to service_role and authenticated: migrating
    the suite's database made authenticated, and service_role is made as 0004 would make
    it (new databases drop it again, so it may be gone)."""
    database = fresh_database()
    postgres.create_service_role(database.cluster)
    with database.connect(postgres.OWNER) as owner:
        owner.execute(REFERENCE.read_bytes())
    with database.connect(None) as admin:
        ids = _seed(admin)
        jobs = admin.execute("select * from app.jobs order by id").fetchall()
        events = admin.execute("select * from app.job_events order by sequence").fetchall()
    return Seeded(database, jobs, events, ids)


def _upgrade(seeded: Seeded) -> None:
    with connect(seeded.database.owner_dsn) as conn:
        report = migrate(conn)
    assert report.applied == tuple(m.version for m in load_migrations())


def test_reference_schema_applies_as_written_for_a_non_superuser_owner(
    reference_database: Seeded,
) -> None:
    """The fixture is the reference itself: it applies, and shows defect 2 before upgrade.

    Workers cannot even reach the schema (defect 6), so the administrator calls the
    SECURITY DEFINER function; it runs as the owner, whom forced RLS shows no rows.
    """
    with reference_database.database.connect(None) as admin:
        claimed = admin.execute(
            "select * from app.claim_jobs(%s, 'w', 10)", (TENANT_A,)
        ).fetchall()
        pending = admin.execute(
            "select count(*) as n from app.jobs where tenant_id = %s and state = 'pending'",
            (TENANT_A,),
        ).fetchone()
    assert claimed == []
    assert pending == {"n": 1}


def test_upgrade_keeps_every_job_row_unchanged(reference_database: Seeded) -> None:
    _upgrade(reference_database)

    with reference_database.database.connect(None) as admin:
        # The lease's token and end moved to app.leases; the rest of the row stays put.
        after = admin.execute(
            "select j.*, l.lease_token, l.expires_at as lease_expires_at"
            " from app.jobs j left join app.leases l on l.job_id = j.id order by j.id"
        ).fetchall()
    assert len(after) == len(reference_database.jobs_before) == 6
    for before, now in zip(reference_database.jobs_before, after, strict=True):
        assert {k: now[k] for k in before} == before
        assert now["correlation_id"] is None


def test_upgrade_keeps_every_event_and_moves_lease_tokens_to_their_column(
    reference_database: Seeded,
) -> None:
    _upgrade(reference_database)

    with reference_database.database.connect(None) as admin:
        after = admin.execute("select * from app.job_events order by sequence").fetchall()
    assert len(after) == len(reference_database.events_before) == 7
    for before, now in zip(reference_database.events_before, after, strict=True):
        for column in ("sequence", "tenant_id", "job_id", "event_type", "actor",
                       "created_at"):  # the id went with 0029_events_by_day
            assert now[column] == before[column]
        token = before["details"].get("leaseToken")
        assert now["lease_token"] == (None if token is None else uuid.UUID(token))
        assert "leaseToken" not in now["details"]
        assert now["details"] == {k: v for k, v in before["details"].items() if k != "leaseToken"}


def test_upgraded_database_has_the_current_structure(reference_database: Seeded) -> None:
    _upgrade(reference_database)
    with reference_database.database.connect(postgres.OWNER) as owner:
        forced = owner.execute(
            "select bool_or(relforcerowsecurity) as forced from pg_class"
            " where relnamespace = 'app'::regnamespace"
        ).fetchone()
        indexes = owner.execute(
            "select indexname from pg_indexes where schemaname = 'app' and tablename = 'jobs'"
        ).fetchall()
        public = owner.execute(
            "select count(*) as n from pg_proc where pronamespace = 'app'::regnamespace"
            " and has_function_privilege('public', oid, 'EXECUTE')"
        ).fetchone()
        versions = owner.execute(
            "select array_agg(version order by version) as v from app.schema_migrations"
        ).fetchone()
    assert forced == {"forced": False}
    names = {r["indexname"] for r in indexes}
    # Leases live in app.leases now: the job row carries no lease index at all.
    assert not {name for name in names if "lease" in name}
    assert public == {"n": 0}
    assert versions == {"v": [m.version for m in load_migrations()]}


def test_queue_functions_work_on_the_upgraded_rows(reference_database: Seeded) -> None:
    _upgrade(reference_database)
    ids = reference_database.ids
    with reference_database.database.connect(postgres.WORKER) as worker, \
            reference_database.database.connect(postgres.OWNER) as owner:
        claimed = worker.execute(
            "select * from app.claim_jobs(%s, 'w9', 10)", (TENANT_A,)
        ).fetchall()
        assert {r["id"] for r in claimed} == {ids["pending"], ids["retry"]}
        for row in claimed:
            done = worker.execute(
                "select app.complete_job(%s, %s, 'w9', %s, %s) as ok",
                (TENANT_A, row["id"], row["lease_token"], Jsonb({"ok": 1})),
            ).fetchone()
            assert done == {"ok": True}

        # The lease taken before the upgrade is still honoured by its owner and token.
        live = worker.execute(
            "select app.complete_job(%s, %s, 'w2', %s, %s) as ok",
            (TENANT_A, ids["live"], LIVE_TOKEN, Jsonb({"ok": 2})),
        ).fetchone()
        assert live == {"ok": True}

        # The lease that expired before the upgrade is recovered by the all-tenant reaper.
        released = worker.execute("select app.release_all_expired_jobs() as n").fetchone()
        assert released == {"n": 1}
        expired_events = owner.execute(
            "select event_type, lease_token from app.job_events where job_id = %s"
            " order by sequence",
            (ids["expired"],),
        ).fetchall()
        assert expired_events == [
            {"event_type": "claimed", "lease_token": EXPIRED_TOKEN},
            {"event_type": "lease_expired", "lease_token": EXPIRED_TOKEN},
        ]

        # Idempotent enqueue sees the pre-existing operation keys.
        existing = worker.execute(
            "select id, state from app.enqueue_job(%s, 'succeeded', 'email.send', %s)",
            (TENANT_B, Jsonb({"key": "succeeded"})),
        ).fetchone()
        assert existing == {"id": ids["succeeded"], "state": "succeeded"}

        states = owner.execute(
            "select state, count(*) as n from app.jobs group by state order by state"
        ).fetchall()
    assert {r["state"]: r["n"] for r in states} == {
        "retry_wait": 1, "succeeded": 4, "dead": 1
    }


def test_upgrade_is_a_no_op_when_run_again(reference_database: Seeded) -> None:
    _upgrade(reference_database)
    with connect(reference_database.database.owner_dsn) as conn:
        assert migrate(conn).applied == ()
