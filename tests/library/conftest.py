"""Fixtures of the library tests: a QueueClient as the worker role, and a read-back
connection as the schema owner (which RLS does not filter)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from leaseq import QueueClient, connect

from tests.conftest import Database


@pytest.fixture
def client(db: Database) -> Iterator[QueueClient]:
    queue = QueueClient(lambda: connect(db.worker_dsn, application_name="leaseq-test-client"))
    yield queue
    queue.close()
