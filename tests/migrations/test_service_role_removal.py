"""service_role leaves new databases (migration service_role_retired) and stays, deprecated,
only where a login of an earlier release still needs it.

A member of service_role holds all four runtime duties. Migration 0004 still creates the
role in every new database (migrations are forward-only), so the later migration revokes
what earlier releases granted it and drops it when no login uses it and no database of
the cluster grants to it. Roles are cluster-wide: each test arranges the legacy state
itself and removes it after (``tests.support.postgres.legacy_login``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate
from psycopg import sql

from tests.conftest import Database
from tests.migrations.test_roles_by_duty_upgrade import _previous_release
from tests.sql.calls import claim_one, enqueue, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Cluster

FUNCTIONS_DIR = Path(__file__).resolve().parents[2] / "sql" / "functions"
REMOVAL = next(m.version for m in load_migrations() if m.name == "service_role_retired")


def _service_role(cluster: Cluster) -> dict[str, object] | None:
    with cluster.connect() as conn:
        return conn.execute(
            "select rolname, shobj_description(oid, 'pg_authid') as comment"
            " from pg_roles where rolname = 'service_role'").fetchone()


def _grants_to_service_role(database: Database) -> list[dict[str, object]]:
    """Every privilege in schema app held by service_role (none may be left)."""
    with database.connect(postgres.OWNER) as conn:
        return conn.execute(
            """
            select 'function ' || p.oid::regprocedure::text as object
            from pg_proc p, aclexplode(p.proacl) a
            where p.pronamespace = 'app'::regnamespace and a.grantee = 'service_role'::regrole
            union all
            select 'relation ' || c.oid::regclass::text
            from pg_class c, aclexplode(c.relacl) a
            where c.relnamespace = 'app'::regnamespace and a.grantee = 'service_role'::regrole
            union all
            select 'schema app' from pg_namespace n, aclexplode(n.nspacl) a
            where n.nspname = 'app' and a.grantee = 'service_role'::regrole
            """).fetchall()


def _before_removal(database: Database) -> None:
    """The schema as the migrations before the removal left it, with the functions those
    migrations define: this release's function files need columns of later migrations
    (a job's cancel request), so they are applied only by the upgrade itself."""
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < REMOVAL], functions=[])


def test_a_fresh_database_ends_without_service_role(
    fresh_database: Callable[[], Database],
) -> None:
    database = fresh_database()
    with connect(database.owner_dsn) as conn:
        report = migrate(conn)
        again = migrate(conn)

    assert REMOVAL in report.applied
    assert again.applied == ()
    assert _service_role(database.cluster) is None


def test_no_function_file_names_service_role() -> None:
    """A fresh database has no such role: a grant or revoke naming it would fail there."""
    naming = [path.name for path in sorted(FUNCTIONS_DIR.glob("*.sql"))
              if "service_role" in path.read_text(encoding="utf-8")]
    assert naming == []


def test_an_upgraded_database_whose_login_is_in_service_role_keeps_every_duty_working(
    fresh_database: Callable[[], Database],
) -> None:
    database = fresh_database()
    _before_removal(database)
    tenant = uuid.uuid4()
    with postgres.legacy_login(database.cluster) as login:
        # A job of the release before: written into that release's table directly, since
        # the function files are this release's and need its columns.
        with database.connect(postgres.OWNER) as owner:
            owner.execute("with job as (insert into app.jobs (tenant_id, operation_key, kind,"
                          " payload) values (%s, 'before', 'email.send', '{}') returning *)"
                          " insert into app.job_events (tenant_id, job_id, event_type, actor)"
                          " select tenant_id, id, 'created', 'enqueue' from job", (tenant,))

        with connect(database.owner_dsn) as conn:
            assert migrate(conn).applied == tuple(
                m.version for m in load_migrations() if m.version >= REMOVAL)

        kept = _service_role(database.cluster)
        assert kept is not None
        assert str(kept["comment"]).startswith("deprecated (leaseq 0017)")
        assert _grants_to_service_role(database) == []
        with database.connect(login) as legacy, database.connect(None) as admin:
            enqueue(legacy, tenant, "to-cancel")
            done = claim_one(legacy, tenant)  # "before"
            legacy.execute("select app.complete_job(%s, %s, 'worker-1', %s, null)",
                           (tenant, done["id"], done["lease_token"]))
            admin.execute("update app.jobs set completed_at = clock_timestamp() - %s"
                          " where id = %s", (timedelta(days=30), done["id"]))
            expiring = claim_one(legacy, tenant)  # "to-cancel"
            admin.execute("update app.leases set expires_at = clock_timestamp()"
                          " - interval '1 second' where job_id = %s", (expiring["id"],))

            released = legacy.execute("select app.release_all_expired_jobs(10) as n").fetchone()
            pruned = legacy.execute(
                "select * from app.prune_retained_jobs('14 days', 10)").fetchone()
            cancelled = legacy.execute(
                "select job_id from app.cancel_jobs('ops', %s, null, null, 10, null)",
                (tenant,)).fetchall()
            status = legacy.execute("select * from app.queue_status(%s)", (tenant,)).fetchall()

        assert released == {"n": 1}
        assert pruned == {"jobs_deleted": 1, "events_deleted": 3}
        assert [r["job_id"] for r in cancelled] == [expiring["id"]]
        assert {r["state"] for r in status} == {"cancelled"}


def test_moving_the_last_login_out_of_service_role_leaves_it_its_duty_and_the_role_droppable(
    fresh_database: Callable[[], Database],
) -> None:
    """The upgrade path of sql/README.md: grant the duty group, revoke service_role, then
    drop the unused role as the owner that made it."""
    database = fresh_database()
    _before_removal(database)
    tenant = uuid.uuid4()
    with postgres.legacy_login(database.cluster) as login:
        with connect(database.owner_dsn) as conn:
            migrate(conn)
        with database.connect(postgres.OWNER) as owner:
            enqueue(owner, tenant, "a")
        with database.connect(None) as admin:
            admin.execute(sql.SQL("grant leaseq_worker to {}").format(sql.Identifier(login)))
            admin.execute(sql.SQL("revoke service_role from {}").format(sql.Identifier(login)))

        with database.connect(login) as moved:
            assert claim_one(moved, tenant)["operation_key"] == "a"
            with raises_sqlstate("42501", match="permission denied for function prune_jobs"):
                moved.execute("select * from app.prune_jobs('0 seconds', 1)")
            with raises_sqlstate("42501", match="permission denied for function enqueue_job"):
                enqueue(moved, tenant, "b")
        with database.connect(postgres.OWNER) as owner:
            owner.execute("drop role service_role")
        assert _service_role(database.cluster) is None


def test_an_unused_service_role_holding_grants_of_an_earlier_release_is_dropped(
    fresh_database: Callable[[], Database],
) -> None:
    """A database of the release before function files: service_role holds EXECUTE on the
    functions of 0004-0007 directly, and no login is in it any more."""
    database = fresh_database()
    _previous_release(database)
    assert _grants_to_service_role(database) != []

    with connect(database.owner_dsn) as conn:
        migrate(conn)

    assert _service_role(database.cluster) is None


def test_service_role_stays_while_another_database_of_the_cluster_grants_to_it(
    fresh_database: Callable[[], Database],
) -> None:
    """Roles are cluster-wide: a database not yet upgraded still needs it."""
    older, newer = fresh_database(), fresh_database()
    _previous_release(older)

    with connect(newer.owner_dsn) as conn:
        migrate(conn)
    assert _service_role(newer.cluster) is not None
    assert _grants_to_service_role(newer) == []

    with connect(older.owner_dsn) as conn:
        migrate(conn)
    assert _service_role(older.cluster) is None


@pytest.fixture(autouse=True)
def _no_service_role_left(cluster: Cluster) -> None:
    """Each test starts where a new deployment starts: no service_role in the cluster."""
    postgres.drop_service_role(cluster)
    assert _service_role(cluster) is None
