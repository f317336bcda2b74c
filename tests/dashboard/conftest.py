"""A dashboard served on 127.0.0.1 against the test database, as the command serves it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from uuid import UUID

import pytest
from leaseq import connect
from leaseq_dashboard import AccessPolicy, build
from leaseq_dashboard.local import ConnectionViewSource, LocalServer

from tests.conftest import Database
from tests.dashboard.client import Client
from tests.dashboard.seed import Seeded, seed
from tests.support import postgres
from tests.support.postgres import Conn

OPERATOR = "arn:aws:sts::123456789012:assumed-role/OnCall/ada"
VIEWER = "arn:aws:iam::123456789012:user/auditor"
TENANT_VIEWER = "arn:aws:iam::123456789012:user/acme"


@dataclass
class Served:
    """A running dashboard, who it thinks the caller is, and the data behind it.

    ``url`` is its address; ``login_url`` the one with the run's key, the only way in.
    """

    url: str
    login_url: str
    principal: str
    seeded: Seeded
    server: LocalServer

    def client(self, *, follow: bool = True) -> Client:
        """A client that entered through the key URL, as a browser would."""
        return Client(self.url, follow=follow).enter(self.login_url)


def policy_for(tenant: UUID) -> AccessPolicy:
    return AccessPolicy(operators=("arn:aws:sts::123456789012:assumed-role/OnCall/*",),
                        viewers=(VIEWER,), tenant_viewers={TENANT_VIEWER: tenant})


@pytest.fixture
def seeded(db: Database, worker: Conn, owner: Conn) -> Seeded:
    found = seed(worker, owner)
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, found.tenants[0]))
    return found


@pytest.fixture
def serve(db: Database, seeded: Seeded) -> Iterator[Callable[[str], Served]]:
    servers: list[tuple[LocalServer, ConnectionViewSource]] = []

    def start(principal: str) -> Served:
        source = ConnectionViewSource(lambda: connect(db.worker_dsn),
                                      lambda: connect(db.reader_dsn))
        app = build(source, policy_for(seeded.tenants[0]), secure_cookies=False)
        server = LocalServer(app, principal=principal).start()
        servers.append((server, source))
        return Served(server.url, server.login_url, principal, seeded, server)

    yield start
    for server, source in servers:
        server.stop()
        source.close()


@pytest.fixture
def reaper_tick(worker: Conn) -> Callable[[], None]:
    """One tick of the schedules, as the reaper makes it (the suite's all-duty login)."""

    def tick() -> None:
        worker.execute("select * from app.tick_schedules(100)")

    return tick
