"""Fixtures for the deployment tests: a stand-in for CloudFormation's response URL, the
migrations function's modules, the duty groups the logins join, and the template as
aws-sam-translator expands it."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Cluster

ROOT = Path(__file__).resolve().parents[2]

#: The NOLOGIN groups by duty that the schema migrations create (see sql/README.md).
DUTY_GROUPS = (
    "leaseq_producer",
    "leaseq_tenant_producer",
    "leaseq_worker",
    "leaseq_reaper",
    "leaseq_operator",
    "leaseq_dashboard",
)


@dataclass
class CapturedPut:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ResponseEndpoint:
    """A real HTTP server on the loopback address that records every PUT it receives."""

    base_url: str
    puts: list[CapturedPut] = field(default_factory=list)
    received: threading.Event = field(default_factory=threading.Event)

    def url(self, name: str = "response") -> str:
        return f"{self.base_url}/{name}?X-Amz-Signature=abc"

    def only_put(self) -> CapturedPut:
        assert len(self.puts) == 1, f"expected exactly one answer, got {len(self.puts)}"
        return self.puts[0]


@pytest.fixture
def response_endpoint() -> Iterator[ResponseEndpoint]:
    endpoint = ResponseEndpoint(base_url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            endpoint.puts.append(
                CapturedPut(self.path, {k.lower(): v for k, v in self.headers.items()},
                            json.loads(raw))
            )
            self.send_response(200)
            self.end_headers()
            endpoint.received.set()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def migrations_app() -> Any:
    """The migrations custom resource's handler module, :mod:`leaseq_deploy.function`
    (functions/migrations/app.py re-exports its ``lambda_handler``)."""
    import importlib

    return importlib.import_module("leaseq_deploy.function")


#: user property of the resource -> the duty group its login must belong to (and nothing else)
GROUP_OF = {
    "WorkerDbUser": "leaseq_worker",
    "ReaperDbUser": "leaseq_reaper",
    "EnqueueDbUser": "leaseq_producer",
    "OperatorDbUser": "leaseq_operator",
}


def drop_roles(cluster: Cluster, names: list[str]) -> None:
    """Drop these cluster-wide roles where they exist."""
    with cluster.connect() as conn:
        for name in names:
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


@pytest.fixture
def logins(cluster: Cluster) -> Iterator[dict[str, str]]:
    """One login name per function, unique to the test (roles are cluster-wide)."""
    tag = uuid.uuid4().hex[:8]
    names = {prop: f"leaseq_{prop[:-6].lower()}_{tag}" for prop in GROUP_OF}
    yield names
    drop_roles(cluster, list(names.values()))


@pytest.fixture
def database(fresh_database: Callable[[], Database], duty_groups: tuple[str, ...]) -> Database:
    """A database of its own, with the duty groups the migrations' logins join."""
    return fresh_database()


@pytest.fixture(scope="session")
def duty_groups(cluster: Cluster) -> Iterator[tuple[str, ...]]:
    """The duty groups, created here when no migration has made them yet.

    They are made by the schema owner, as the migration does in production: a CREATEROLE
    owner then holds ADMIN on them, which PostgreSQL 16 and later require of whoever grants
    membership. Groups that already exist are left as they are, and only the ones made here
    are dropped afterwards (a role with privileges in some database cannot be, so a failed
    drop is ignored: it is the same NOLOGIN group the migration would make).
    """
    made: list[str] = []
    with cluster.connect(user=postgres.OWNER) as owner:
        for group in DUTY_GROUPS:
            row = owner.execute("select rolcanlogin from pg_roles where rolname = %s",
                                (group,)).fetchone()
            if row is None:
                owner.execute(sql.SQL("create role {} nologin").format(sql.Identifier(group)))
                made.append(group)
            elif row["rolcanlogin"]:
                pytest.fail(f"role {group} can log in on the test server; a duty group must not")
    try:
        yield DUTY_GROUPS
    finally:
        with cluster.connect() as admin:
            for group in made:
                try:
                    admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(group)))
                except Exception:  # noqa: S112 - privileges from a migration keep it; harmless
                    continue
