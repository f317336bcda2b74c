"""Registry.check (what a door refuses before storing) and DeclaredKind, the typed way to
enqueue a registered kind: in the producer's transaction, or through a QueueClient; mypy
checks the payload's type against the handler's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from leaseq import (
    IdempotencyConflictError,
    InvalidRequestError,
    JobContext,
    QueueClient,
    Registry,
    connect,
)
from leaseq.base.errors import PayloadRejectedError, UnknownKindError
from leaseq.kinds.registry import DeclaredKind
from pydantic import BaseModel, ConfigDict

from tests.conftest import Database
from tests.library.support import jobs
from tests.support import postgres
from tests.support.postgres import Conn

TENANT = uuid.UUID("0b7e3c2a-61d4-4f0e-8a57-2d9c4b1e6f30")
ROOT = Path(__file__).resolve().parents[2]


class Welcome(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: int
    language: str = "en"


registry = Registry()


@registry.handler("send_welcome_email", payload=Welcome, timeout=5)
def send_welcome_email(welcome: Welcome, ctx: JobContext) -> dict[str, Any]:
    return {"sent": welcome.user}


@registry.handler("ping")
async def ping(payload: dict[str, Any], ctx: JobContext) -> None:
    return None


@pytest.fixture
def producer(db: Database) -> Iterator[psycopg.Connection[Any]]:
    """A connection as a producer login (leaseq_producer), as a producer's own code has."""
    conn = connect(db.dsn(postgres.PRODUCER))
    yield conn
    conn.close()


def test_an_unknown_kind_is_refused_with_the_kinds_there_are() -> None:
    with pytest.raises(UnknownKindError, match="unknown kind 'ship': the handlers register "
                                               "ping, send_welcome_email") as raised:
        registry.check("ship", {})
    assert isinstance(raised.value, InvalidRequestError)


def test_a_payload_its_model_refuses_is_refused_field_by_field_without_the_value() -> None:
    with pytest.raises(PayloadRejectedError, match="model of kind 'send_welcome_email'") as raised:
        registry.check("send_welcome_email", {"user": "secret-value", "cc": 1})

    assert set(raised.value.errors) == {
        ("payload.user", "int_parsing", "Input should be a valid integer, unable to parse "
                                        "string as an integer"),
        ("payload.cc", "extra_forbidden", "Extra inputs are not permitted")}
    assert "secret-value" not in raised.value.message
    registry.check("send_welcome_email", {"user": 7})  # fits: no error
    registry.check("ping", {"anything": [1, 2]})  # no model: any payload


def test_a_declared_handler_is_still_the_handler_the_worker_calls() -> None:
    registration = registry.get("send_welcome_email")
    assert registration is not None
    assert isinstance(send_welcome_email, DeclaredKind)
    assert send_welcome_email(Welcome(user=3), None) == {"sent": 3}  # type: ignore[arg-type]
    assert send_welcome_email.__name__ == "send_welcome_email"
    assert send_welcome_email.kind == "send_welcome_email"
    # The worker still gets the function itself, and sees an async one as async.
    assert registration.handler is send_welcome_email.handler
    ping_registration = registry.get("ping")
    assert ping_registration is not None
    assert ping_registration.is_async
    # Registered again for another kind, the declared handler is still the function.
    again = Registry().register("ping.again", ping)
    assert again.handler is ping.handler
    assert again.is_async


def test_defer_in_the_producers_transaction_stores_the_job_only_if_it_commits(
        producer: psycopg.Connection[Any], owner: Conn) -> None:
    def fails_after_deferring() -> None:
        with producer.transaction():
            send_welcome_email.defer(producer, TENANT, "welcome-1", Welcome(user=1))
            raise RuntimeError("the producer's own work failed")

    with pytest.raises(RuntimeError):
        fails_after_deferring()
    assert jobs(owner) == []

    with producer.transaction():
        result = send_welcome_email.defer(producer, TENANT, "welcome-1", Welcome(user=1),
                                          max_attempts=2, correlation_id="signup-1")

    assert result.status == "created"
    (row,) = jobs(owner)
    assert (row["id"], row["kind"], row["payload"], row["max_attempts"],
            row["correlation_id"]) == (result.job_id, "send_welcome_email",
                                       {"user": 1, "language": "en"}, 2, "signup-1")


def test_defer_through_a_queue_client_finds_the_same_job_again_and_raises_on_a_conflict(
        client: QueueClient) -> None:
    first = send_welcome_email.defer(client, TENANT, "welcome-2", Welcome(user=2))
    again = send_welcome_email.defer(client, TENANT, "welcome-2", Welcome(user=2))

    assert (first.status, again.status, again.job_id) == ("created", "existing", first.job_id)
    with pytest.raises(IdempotencyConflictError):
        send_welcome_email.defer(client, TENANT, "welcome-2", Welcome(user=3))


def test_defer_refuses_a_payload_its_model_refuses_before_anything_is_sent(
        client: QueueClient, owner: Conn) -> None:
    untyped: Any = {"user": "not a number"}

    with pytest.raises(PayloadRejectedError, match=r"payload\.user"):
        send_welcome_email.defer(client, TENANT, "welcome-3", untyped)
    assert jobs(owner) == []


MYPY_PROGRAM = """
    from typing import Any
    from uuid import UUID
    from leaseq import JobContext, Registry
    from pydantic import BaseModel

    class Welcome(BaseModel):
        user: int

    registry = Registry()

    @registry.handler("send_welcome_email", payload=Welcome)
    def send_welcome_email(welcome: Welcome, ctx: JobContext) -> None: ...

    def produce(conn: Any, tenant: UUID) -> None:
        send_welcome_email.defer(conn, tenant, "k", Welcome(user=1))
        send_welcome_email.defer(conn, tenant, "k", {"user": 1})
"""


def test_mypy_checks_the_payload_of_defer_against_the_handlers_model(tmp_path: Path) -> None:
    pytest.importorskip("mypy.api")
    program = tmp_path / "producer.py"
    program.write_text(textwrap.dedent(MYPY_PROGRAM))
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nstrict = True\nmypy_path = {ROOT / 'layer'}\n"
                      "plugins = pydantic.mypy\n")
    # In a process of its own: mypy raises the interpreter's recursion limit for good,
    # which would change what the decoding tests that follow can decode.
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config),
                           "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
                           str(program)], capture_output=True, text=True, timeout=300,
                          check=False)
    stdout, stderr, status = done.stdout, done.stderr, done.returncode

    assert status == 1, stdout + stderr
    (error,) = stdout.splitlines()
    assert 'producer.py:17: error: Argument 4 to "defer" of "DeclaredKind" has incompatible ' \
           'type "dict[str, int]"; expected "Welcome"' in error
