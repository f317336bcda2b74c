"""Where the deployed dashboard's pages get their views: its own login for operators and
viewers, and one reader login per tenant for tenant viewers.

Why a login per tenant: a reader login bound to several tenants in
``app.tenant_readers`` sees whichever of them ``app.tenant_id`` names, and the page sets
that; a page bug (or a viewer's request for another tenant) would show another
tenant's jobs. A login bound to exactly one tenant cannot: row-level security compares
``app.tenant_id`` with that login's one binding, so whatever the page sets, the database
returns that tenant's rows or none (sql/README.md, "Row-level security and tenant
readers"). The migrations make those logins, ``leaseq_tenant_reader_<tenant hex>``
(:func:`reader_login`), one per tenant of ``DashboardTenantViewers``.

Each execution environment answers one request at a time, so it holds the dashboard
login's connection plus at most ``max_readers`` reader connections (the deploy-time
connection budget counts exactly that, ``layer/leaseq_deploy/connection_budget.py``).
A request for another tenant closes the reader connection used least recently first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final
from uuid import UUID

from leaseq.read.views import OperatorViews, TenantViews
from leaseq.store.client import DEFAULT_MAX_IDLE_SECONDS, QueueClient
from leaseq.store.db import Connection
from leaseq.store.duties import OperatorClient, ReaderClient

#: The name every tenant reader login starts with; the rest is the tenant's 32 hex digits.
READER_LOGIN_PREFIX: Final = "leaseq_tenant_reader_"


def reader_login(tenant_id: UUID) -> str:
    """The name of ``tenant_id``'s reader login (53 characters, a valid role name)."""
    return f"{READER_LOGIN_PREFIX}{tenant_id.hex}"


class DashboardViewSource:
    """Views over the dashboard's login and one reader login per tenant.

    ``operator_connect`` opens a connection as the dashboard's login (a member of
    leaseq_dashboard); ``reader_connect(tenant)`` one as that tenant's reader login, or
    is None when no tenant viewer is configured (asking for tenant views then fails:
    a tenant viewer is never served over the dashboard login's rights). Each client
    opens its connection lazily and pings it after ``max_idle_seconds`` idle.
    """

    def __init__(self, operator_connect: Callable[[], Connection],
                 reader_connect: Callable[[UUID], Connection] | None = None, *,
                 max_readers: int = 1,
                 max_idle_seconds: float = DEFAULT_MAX_IDLE_SECONDS) -> None:
        if max_readers < 1:
            raise ValueError(f"max_readers must be at least 1 (got {max_readers})")
        self._operator = QueueClient(operator_connect, max_idle_seconds=max_idle_seconds)
        self._reader_connect = reader_connect
        self._readers: OrderedDict[UUID, QueueClient] = OrderedDict()
        self.max_readers = max_readers
        self.max_idle_seconds = max_idle_seconds

    def operator(self) -> OperatorViews:
        """Views over the dashboard login's connection: every tenant, actions by id."""
        self._operator.check()
        return OperatorViews(OperatorClient(self._operator))

    def tenant(self, tenant_id: UUID) -> TenantViews:
        """Views over ``tenant_id``'s own reader login."""
        if self._reader_connect is None:
            raise RuntimeError("no tenant reader logins are configured "
                               "(LEASEQ_DASHBOARD_TENANT_VIEWERS is empty)")
        client = self._readers.get(tenant_id)
        if client is None:
            while len(self._readers) >= self.max_readers:
                _, oldest = self._readers.popitem(last=False)
                oldest.close()
            connect = self._reader_connect
            client = QueueClient(lambda: connect(tenant_id),
                                 max_idle_seconds=self.max_idle_seconds)
            self._readers[tenant_id] = client
        self._readers.move_to_end(tenant_id)
        client.check()
        return TenantViews(ReaderClient(client), tenant_id)

    @property
    def reader_tenants(self) -> tuple[UUID, ...]:
        """The tenants whose reader connection is kept, least recently used first."""
        return tuple(self._readers)

    def close(self) -> None:
        """Close every connection."""
        self._operator.close()
        while self._readers:
            _, client = self._readers.popitem()
            client.close()
