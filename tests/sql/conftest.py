"""The duty logins the SQL contract tests connect as, each as production uses it: a
producer enqueues, a worker login claims, an operator operates."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Conn


@pytest.fixture
def producer(db: Database) -> Iterator[Conn]:
    """A member of leaseq_producer only."""
    with db.connect(postgres.PRODUCER) as conn:
        yield conn


@pytest.fixture
def duty_worker(db: Database) -> Iterator[Conn]:
    """A member of leaseq_worker only."""
    with db.connect(postgres.DUTY_WORKER) as conn:
        yield conn


@pytest.fixture
def operator(db: Database) -> Iterator[Conn]:
    """A member of leaseq_operator only."""
    with db.connect(postgres.OPERATOR) as conn:
        yield conn
