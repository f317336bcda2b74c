"""Which failures are retryable: only a connection that failed.

Each error is produced for real, against the session's server (a refused port, a
terminated backend, a value psycopg cannot send, a connection the caller closed, a
result Python cannot represent), and must come out as its documented leaseq type.
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest
from leaseq import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailableError,
    EnqueueRequest,
    InvalidRequestError,
    QueueClient,
    connect,
    enqueue_jobs,
)
from leaseq.base.errors import CLIENT_ERRORS, error_type_for
from leaseq.store.db import fetch_rows
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.support.postgres import Conn


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def unchecked(**fields: Any) -> EnqueueRequest:
    """A request that skipped validation, as a caller of model_construct sends it."""
    base: dict[str, Any] = {"tenant_id": uuid.uuid4(), "operation_key": "k", "kind": "echo",
                            "payload": {}, "available_at": None, "max_attempts": None,
                            "correlation_id": None}
    return EnqueueRequest.model_construct(**{**base, **fields})


def test_a_refused_connection_is_unavailable_and_so_retryable() -> None:
    with pytest.raises(DatabaseUnavailableError, match="database unavailable") as raised:
        connect(f"postgresql://nobody@127.0.0.1:{closed_port()}/none", connect_timeout=2)
    assert raised.value.sqlstate is None


def test_a_connection_lost_under_a_call_is_unavailable(db: Database, admin: Conn) -> None:
    with connect(db.worker_dsn) as conn:
        admin.execute("select pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(DatabaseUnavailableError):  # 57P01, or the lost socket
            fetch_rows(conn, "select 1 as one", {})
        with pytest.raises(DatabaseUnavailableError, match="database unavailable"):
            fetch_rows(conn, "select 1 as one", {})  # psycopg: "the connection is closed"


def test_a_connection_the_caller_closed_is_a_database_error_not_an_outage(
        db: Database) -> None:
    conn = connect(db.worker_dsn)
    conn.close()
    with pytest.raises(DatabaseError, match="closed by the application") as raised:
        enqueue_jobs(conn, [EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="k",
                                           kind="echo")])
    assert type(raised.value) is DatabaseError


@pytest.mark.parametrize(("fields", "cause"), [
    ({"kind": "a\x00b"}, "NUL"),                               # psycopg.DataError
    ({"operation_key": "\ud800"}, "surrogates not allowed"),    # UnicodeEncodeError
    ({"payload": {"ids": {1, 2}}}, "not JSON serializable"),     # TypeError from json.dumps
    ({"payload": {"n": 10**5000}}, "4300 digits"),               # ValueError from json.dumps
])
def test_a_value_that_cannot_be_sent_is_an_invalid_request_and_is_not_retried(
        db: Database, owner: Conn, fields: dict[str, Any], cause: str) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn))
    try:
        client.check()
        with pytest.raises(InvalidRequestError, match=cause) as raised:
            client.enqueue_jobs([unchecked(**fields)])
        assert client.reconnects == 1  # no second connection for a value that cannot go
    finally:
        client.close()
    assert raised.value.sqlstate is None
    assert "could not be sent" in raised.value.message
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}


def test_a_data_exception_from_the_server_is_an_invalid_request(db: Database) -> None:
    with connect(db.worker_dsn) as conn, pytest.raises(InvalidRequestError) as raised:
        fetch_rows(conn, "select %(t)s::text::timestamptz as t",
                   {"t": "2026-01-01 00:00:00+16:00"})
    assert raised.value.sqlstate == "22009"


@pytest.mark.parametrize(("query", "params", "cause"), [
    ("select %(a)s as a", {}, "query parameter missing"),
    ("select %(a)s as a", {"a": object()}, "cannot adapt type"),
])
def test_a_call_made_wrong_is_a_database_error_without_a_retry(
        db: Database, query: Any, params: dict[str, Any], cause: str) -> None:
    with connect(db.worker_dsn) as conn:
        with pytest.raises(DatabaseError, match=cause) as raised:
            fetch_rows(conn, query, params)
        assert type(raised.value) is DatabaseError
        assert fetch_rows(conn, "select 1 as one", {}) == [{"one": 1}]  # still usable


def test_a_result_python_cannot_represent_is_a_database_error_not_a_value_error(
        db: Database) -> None:
    with connect(db.worker_dsn) as conn, pytest.raises(DatabaseError,
                                                       match="could not be decoded") as raised:
        fetch_rows(conn, "select interval '1000000000 days' as i", {})
    assert type(raised.value) is DatabaseError


def test_an_unknown_connection_option_is_a_configuration_error(db: Database) -> None:
    with pytest.raises(ConfigurationError, match="invalid connection settings"):
        connect(db.worker_dsn, no_such_option="1")


def test_a_jsonb_the_server_refuses_is_an_invalid_request(db: Database) -> None:
    with connect(db.worker_dsn) as conn, pytest.raises(InvalidRequestError) as raised:
        fetch_rows(conn, "select %(p)s::jsonb as p", {"p": Jsonb({"x": float("nan")})})
    assert raised.value.sqlstate == "22P02"


def test_without_a_sqlstate_only_a_failed_connection_is_retryable() -> None:
    assert error_type_for(None) is DatabaseError
    retryable = {failure for failure, kind in CLIENT_ERRORS.items()
                 if issubclass(kind, DatabaseUnavailableError)}
    assert retryable == {"connection_failed"}
