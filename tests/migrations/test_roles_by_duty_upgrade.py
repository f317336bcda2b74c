"""Upgrading a database of the previous release to the roles-by-duty migration.

The database is built at 0009 as that release left it (its migrations applied by its
runner, service_role holding every grant, reader bindings by role name), with a login
of that release in service_role and readers bound to tenants, one of them dropped since.
After ``migrate``: the old login still does its work, service_role holds nothing of its
own (and stays, deprecated, for that login: migration 0017), the live binding is kept
(now by OID) and the dropped role's binding is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.migrations.test_equivalence import (
    _PREVIOUS_BOOKKEEPING,
    LAST_MIGRATION_BEFORE_FUNCTION_FILES,
)
from tests.support import postgres


def _previous_release(database: Database) -> None:
    previous = [m for m in load_migrations() if m.version <= LAST_MIGRATION_BEFORE_FUNCTION_FILES]
    with database.connect(postgres.OWNER) as owner:
        owner.execute(_PREVIOUS_BOOKKEEPING)
        for migration in previous:
            with owner.transaction():
                owner.execute(migration.sql.encode("utf-8"))
                owner.execute(
                    "insert into app.schema_migrations (version, name, checksum)"
                    " values (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )


def test_a_previous_release_database_keeps_its_logins_working_and_its_live_bindings(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    database = fresh_database()
    with postgres.legacy_login(database.cluster) as login:
        _previous_release(database)
        _upgrade_and_check(database, login)


def _upgrade_and_check(database: Database, login: str) -> None:
    tenant, other = uuid.uuid4(), uuid.uuid4()
    gone = f"leaseq_test_tmp_{uuid.uuid4().hex[:10]}"
    with database.connect(None) as admin:
        admin.execute(sql.SQL("create role {} nologin").format(sql.Identifier(gone)))
        admin.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s),"
                      " (%s, %s)", (postgres.READER, tenant, gone, other))
        admin.execute(sql.SQL("drop role {}").format(sql.Identifier(gone)))
    with database.connect(login) as legacy:
        legacy.execute("select * from app.enqueue_job(%s, 'before', 'email.send', %s)",
                       (tenant, Jsonb({})))

    with connect(database.owner_dsn) as conn:
        migrate(conn)

    with database.connect(login) as legacy:
        legacy.execute("select * from app.enqueue_job(%s, 'after', 'email.send', %s)",
                       (tenant, Jsonb({})))
        claimed = legacy.execute("select id from app.claim_jobs(%s, 'w1', 10)",
                                 (tenant,)).fetchall()
        assert len(claimed) == 2
        assert legacy.execute("select * from app.prune_jobs('1 day', 10)").fetchall()
    with database.connect(postgres.OWNER) as owner:
        bindings = owner.execute(
            "select role_name::text as role_name, pg_typeof(role_name)::text as type, tenant_id"
            " from app.tenant_readers").fetchall()
        direct = owner.execute(
            "select count(*) as n from pg_proc p, aclexplode(p.proacl) a"
            " where p.pronamespace = 'app'::regnamespace"
            " and a.grantee = 'service_role'::regrole").fetchone()
    assert bindings == [{"role_name": postgres.READER, "type": "regrole", "tenant_id": tenant}]
    assert direct == {"n": 0}
    with database.connect(postgres.READER) as reader:
        reader.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
        assert reader.execute("select count(*) as n from app.jobs").fetchone() == {"n": 2}
