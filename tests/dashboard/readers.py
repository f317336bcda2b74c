"""Tenant reader logins as the migrations make them: one login per tenant, named by
:func:`leaseq_dashboard.sources.reader_login`, a member of authenticated, bound to its
one tenant in app.tenant_readers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from uuid import UUID

from leaseq_dashboard.sources import reader_login
from psycopg import sql

from tests.conftest import Database
from tests.support import postgres


@contextmanager
def tenant_reader_logins(db: Database, tenants: Sequence[UUID]) -> Iterator[dict[UUID, str]]:
    """A reader login per tenant, bound to that tenant only; dropped afterwards."""
    logins = {tenant: reader_login(tenant) for tenant in tenants}
    with db.connect(None) as admin, db.connect(postgres.OWNER) as owner:
        for login in logins.values():
            admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(login)))
            admin.execute(sql.SQL("create role {} login inherit in role authenticated").format(
                sql.Identifier(login)))
        for tenant, login in logins.items():
            owner.execute("insert into app.tenant_readers (role_name, tenant_id)"
                          " values (%s, %s)", (login, tenant))
        try:
            yield logins
        finally:
            for login in logins.values():
                owner.execute("delete from app.tenant_readers where role_name = %s::regrole",
                              (login,))
                admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(login)))
