"""Shared fixtures: one real PostgreSQL per test session, roles as in production.

The suite migrates one database as the non-superuser owner, then every test that uses
``db`` starts from empty queue tables. Tests connect as the role whose behaviour they
check: ``worker`` (a member of every runtime duty group; the duty logins of
``tests.support.postgres`` hold one group each), ``reader`` (member
of authenticated) or ``owner``; ``admin`` (superuser) is only for arranging what no
production role may do, such as moving a lease into the past.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import migrate

from tests.support import postgres
from tests.support.postgres import Cluster, Conn


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long soak tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        # Marked automatically, so a run against a second server version can select
        # exactly the tests whose outcome depends on the server: -m needs_database.
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_database)
        if "soak" in item.keywords and not config.getoption("--soak"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leaseq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from arguments in tests, never from the developer's shell."""
    for key in list(os.environ):
        if key.startswith("LEASEQ_") and not key.startswith("LEASEQ_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("DATABASE_URL", raising=False)


@pytest.fixture(autouse=True)
def _library_logger_restored() -> Iterator[None]:
    """A function's logger setup (leaseq_lambda.telemetry.make_logger) routes the library's
    ``leaseq`` logger through Powertools, stops it propagating and sets its level from the
    test's environment (ERROR, say), for the rest of the process: each test gets it back
    propagating at the level it found, so a later test's caplog still sees the library's
    records whatever ran before."""
    library = logging.getLogger("leaseq")
    propagate, level = library.propagate, library.level
    yield
    # (its handlers stay: Powertools configures a logger's handler once per process)
    library.propagate, library.level = propagate, level


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with postgres.start_cluster() as found:
        postgres.create_login_roles(found)
        yield found


@dataclass(frozen=True)
class Database:
    """A migrated database and the DSNs of the roles that use it."""

    cluster: Cluster
    name: str

    def dsn(self, role: str | None) -> str:
        return self.cluster.dsn(user=role, dbname=self.name)

    @property
    def owner_dsn(self) -> str:
        return self.dsn(postgres.OWNER)

    @property
    def worker_dsn(self) -> str:
        return self.dsn(postgres.WORKER)

    @property
    def reader_dsn(self) -> str:
        return self.dsn(postgres.READER)

    @property
    def admin_dsn(self) -> str:
        return self.dsn(None)

    def connect(self, role: str | None) -> Conn:
        return self.cluster.connect(user=role, dbname=self.name)


@pytest.fixture(scope="session")
def migrated_database(cluster: Cluster) -> Iterator[Database]:
    name = f"leaseq_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    postgres.create_database(cluster, name)
    database = Database(cluster, name)
    with connect(database.owner_dsn) as conn:
        migrate(conn)
    postgres.grant_group_roles(cluster)
    yield database
    postgres.drop_database(cluster, name)


@pytest.fixture
def db(migrated_database: Database) -> Database:
    """The migrated database with empty queue tables, an empty worker pool, only the
    queue 'default' (running), and the pool's limits and the priority step at their
    defaults."""
    with migrated_database.connect(postgres.OWNER) as conn:
        conn.execute("truncate app.jobs, app.job_events, app.claimable, app.leases,"
                     " app.tenant_readers, app.tenant_producers, app.tenant_turns,"
                     " app.worker_pool, app.kind_turns, app.worker_wakes, app.schedules,"
                     " app.queue_events, app.queue_kinds, app.queues,"
                     " app.limits, app.limit_slots, app.limit_starts, app.held_jobs,"
                     " app.limit_turns, app.event_holds")
        conn.execute("insert into app.queues (name) values ('default')")
        conn.execute("update app.tenant_turn_sweep"
                     " set next_queue = null, next_tenant_id = null, swept_at = null")
        conn.execute("update app.worker_pool_state set changed_at = null")
        conn.execute("update app.settings set max_workers = default, start_hold = default,"
                     " wake_debounce = default, priority_step = default, schedule_grace = default,"
                     " schedule_window = default, min_retention = default")
    return migrated_database


@pytest.fixture
def fresh_database(cluster: Cluster) -> Iterator[Callable[[], Database]]:
    """Factory for empty databases owned by the owner role (for migration tests)."""
    made: list[str] = []

    def make() -> Database:
        name = f"leaseq_fresh_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        postgres.create_database(cluster, name)
        made.append(name)
        return Database(cluster, name)

    yield make
    for name in made:
        postgres.drop_database(cluster, name)


@pytest.fixture
def owner(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.OWNER) as conn:
        yield conn


@pytest.fixture
def worker(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.WORKER) as conn:
        yield conn


@pytest.fixture
def reader(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.READER) as conn:
        yield conn


@pytest.fixture
def admin(db: Database) -> Iterator[Conn]:
    with db.connect(None) as conn:
        yield conn
