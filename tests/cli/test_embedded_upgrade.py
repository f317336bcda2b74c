"""A local server made by the previous release keeps working after the upgrade.

That release's command line logged in as ``leaseq_worker``, a member of service_role.
The name is now the worker group, so the bootstrap turns the old login into a NOLOGIN
role before the roles-by-duty migration makes it the group, and the commands log in
as ``leaseq_cli`` (a member of the four duty groups) instead.
"""

from __future__ import annotations

import json
import secrets
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from leaseq.store.migrate import load_migrations
from leaseq_cli import embedded
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from tests.migrations.test_equivalence import (
    _PREVIOUS_BOOKKEEPING,
    LAST_MIGRATION_BEFORE_FUNCTION_FILES,
)


@pytest.fixture
def previous_release_home(tmp_path: Path) -> Iterator[Path]:
    """A home whose server, roles and schema are as the previous release left them."""
    home = tmp_path / "home"
    first = embedded.start(home, apply_migrations=False)
    credentials = home / "credentials.json"
    known = json.loads(credentials.read_text(encoding="utf-8"))
    legacy_password = secrets.token_urlsafe(16)
    credentials.write_text(json.dumps({embedded.SUPERUSER: known[embedded.SUPERUSER],
                                       embedded.OWNER_ROLE: known[embedded.OWNER_ROLE],
                                       embedded.LEGACY_WORKER_ROLE: legacy_password}),
                           encoding="utf-8")
    with psycopg.connect(first.admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("drop role {}").format(sql.Identifier(embedded.WORKER_ROLE)))
        admin.execute(sql.SQL("create role {} login password {}").format(
            sql.Identifier(embedded.LEGACY_WORKER_ROLE), sql.Literal(legacy_password)))
    previous = [m for m in load_migrations() if m.version <= LAST_MIGRATION_BEFORE_FUNCTION_FILES]
    with psycopg.connect(first.owner_dsn, autocommit=True) as owner:
        owner.execute(_PREVIOUS_BOOKKEEPING)
        for migration in previous:
            with owner.transaction():
                owner.execute(migration.sql.encode("utf-8"))
                owner.execute("insert into app.schema_migrations (version, name, checksum)"
                              " values (%s, %s, %s)",
                              (migration.version, migration.name, migration.checksum))
    with psycopg.connect(make_conninfo(first.admin_dsn, dbname=embedded.DATABASE),
                         autocommit=True) as admin:
        admin.execute(sql.SQL("grant service_role to {}").format(
            sql.Identifier(embedded.LEGACY_WORKER_ROLE)))
    try:
        yield home
    finally:
        embedded.stop(home)


def test_an_old_local_server_is_upgraded_and_its_commands_get_every_duty(
    previous_release_home: Path,
) -> None:
    db = embedded.start(previous_release_home)

    tenant = uuid.uuid4()
    with psycopg.connect(db.worker_dsn, autocommit=True) as cli:
        cli.execute("select * from app.enqueue_job(%s, 'k', 'email.send', %s)",
                    (tenant, Jsonb({})))
        assert len(cli.execute("select id from app.claim_ready_jobs('w1', 10)").fetchall()) == 1
        assert cli.execute("select app.release_all_expired_jobs(10)").fetchone() == (0,)
        status = cli.execute("select count(*) from app.queue_status(%s)", (tenant,)).fetchone()
        assert status == (1,)
    with psycopg.connect(make_conninfo(db.admin_dsn, dbname=embedded.DATABASE)) as admin:
        legacy = admin.execute(
            "select rolcanlogin from pg_roles where rolname = %s",
            (embedded.LEGACY_WORKER_ROLE,)).fetchone()
        service_role = admin.execute(
            "select 1 from pg_roles where rolname = 'service_role'").fetchone()
    # No longer a login; and with no login left in service_role, the migrations dropped it.
    assert legacy == (False,)
    assert service_role is None
    credentials = previous_release_home / "credentials.json"
    assert embedded.WORKER_ROLE in json.loads(credentials.read_text(encoding="utf-8"))
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
