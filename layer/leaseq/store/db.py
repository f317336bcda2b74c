"""Connections, reading rows, and the one place where psycopg errors become leaseq errors.

Connections are made for poolers such as RDS Proxy: no prepared statements
(``prepare_threshold=None``), no session state, autocommit with explicit short
transactions, TCP keepalives so a dead peer is noticed. Every connection decodes
json and jsonb totally (:mod:`leaseq.base.decoding`): a stored value Python cannot decode
is returned as an ``UndecodableJson``, never raised.

Only a connection that failed is worth retrying: an error raised in the client
without a SQLSTATE is classified by what failed (``errors.CLIENT_ERRORS``), so that a
value that cannot be sent, or a misuse, is not retried on a fresh connection as if the
network had dropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, LiteralString

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Transformer
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader

from leaseq.base.decoding import register_total_json_loaders
from leaseq.base.errors import (
    ClientFailure,
    ConfigurationError,
    DatabaseUnavailableError,
    LeaseqError,
    PermissionDeniedError,
    client_error_type,
    error_type_for,
)
from leaseq.store.tls import refusal

Connection = psycopg.Connection[dict[str, Any]]

#: Keyword arguments every leaseq connection uses.
CONNECT_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": None,
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def prepare_connection(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn`` decode json and jsonb without ever raising (idempotent).

    :func:`connect` does this; a :class:`~leaseq.QueueClient` does it again for
    connections from any other factory, so a worker never depends on how its
    connection was made.
    """
    register_total_json_loaders(conn)


def connect(dsn: str, *, application_name: str = "leaseq", **overrides: Any) -> Connection:
    """Open a pooler-safe connection that returns rows as dicts.

    A connection string or option that libpq does not understand is a
    :class:`ConfigurationError`; a server that cannot be reached or refuses the login
    is a :class:`DatabaseUnavailableError`.
    """
    options = {**CONNECT_OPTIONS, "application_name": application_name, **overrides}
    try:
        conn = psycopg.connect(dsn, row_factory=dict_row, **options)
    except (psycopg.ProgrammingError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid connection settings: {exc}. Fix the connection string "
            "(postgresql://USER:PASSWORD@HOST:5432/DBNAME) or the option it names") from exc
    except psycopg.OperationalError as exc:
        # A failed certificate check has no SQLSTATE either: keep it from being
        # taken (and retried) as an unreachable server.
        refused = refusal(str(exc), options.get("sslrootcert"))
        if refused is not None:
            raise refused from exc
        raise _translated(exc, None, reading=False) from exc
    except psycopg.Error as exc:
        raise _translated(exc, None, reading=False) from exc
    prepare_connection(conn)
    return conn


def describe_dsn(dsn: str) -> str:
    """Which server and login a connection string names, without its password: what
    the commands print as the database they used."""
    params = conninfo_to_dict(dsn)
    host = params.get("host") or "localhost"
    return f"DATABASE_URL ({params.get('user') or 'default user'}@{host}/" \
           f"{params.get('dbname') or ''})"


class _ClampedTimestamptzLoader(TimestamptzLoader):
    """timestamptz for a second read: a time outside Python's years 1..9999
    (``-infinity``, BC, ``infinity``, year 10000 on) becomes datetime.min or max."""

    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            early = text.startswith(b"-") or text.endswith(b" BC")
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)


def fetch_rows(conn: psycopg.Connection[Any], query: LiteralString,
               params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Run one statement and return its rows as dicts, every failure translated.

    Reading never raises for the values leaseq stores: json and jsonb are decoded
    totally, and when a row holds a timestamp Python cannot represent (only SQL
    written by hand can store one), the same result is read a second time with such
    times clamped to ``datetime.min``/``max``. For a claim that matters: it has
    committed by the time its rows are read, and a read that raised would leave the
    whole batch running. The second read costs nothing unless the first one failed.
    """
    with translate_errors(conn):
        cur = conn.cursor(row_factory=dict_row)
    with cur:
        with translate_errors(conn):
            cur.execute(query, params)
        with translate_errors(conn, reading=True):
            try:
                return cur.fetchall()
            except psycopg.DataError:
                return _read_again_clamped(cur)


def _read_again_clamped(cur: psycopg.Cursor[dict[str, Any]]) -> list[dict[str, Any]]:
    result = cur.pgresult
    if result is None:  # pragma: no cover - fetchall raised, so there was a result
        return []
    with cur.connection.cursor() as spare:
        spare.adapters.register_loader("timestamptz", _ClampedTimestamptzLoader)
        transformer = Transformer(spare)
        transformer.set_pgresult(result)
        return transformer.load_rows(0, result.ntuples, dict_row(cur))


def _describe(exc: psycopg.Error) -> str:
    diag = exc.diag
    text = diag.message_primary or str(exc).strip() or type(exc).__name__
    if diag.message_hint:
        text = f"{text} (hint: {diag.message_hint})"
    return text


def _client_failure(exc: BaseException, conn: psycopg.Connection[Any] | None,
                    reading: bool) -> ClientFailure:
    """What failed in the client, for an error that carries no SQLSTATE."""
    if isinstance(exc, psycopg.OperationalError):
        if conn is not None and conn.closed and not conn.broken:
            return "closed_connection"  # close() was called: a misuse, not an outage
        return "connection_failed"
    if isinstance(exc, psycopg.DataError | ValueError | TypeError):
        return "undecodable_value" if reading else "unsendable_value"
    return "client_misuse"


_CLIENT_MESSAGES: dict[ClientFailure, str] = {
    "connection_failed": (
        "database unavailable: {}. Check the host, port, credentials and network path "
        "(security groups, RDS Proxy), then retry."),
    "closed_connection": (
        "{}: the connection was closed by the application before this call. Open a new "
        "one (leaseq.connect), or use a QueueClient, which reconnects by itself."),
    "unsendable_value": (
        "a value could not be sent to PostgreSQL: {}. Nothing was sent; correct the value "
        "(strict JSON, no NUL characters, valid Unicode) and send it again."),
    "undecodable_value": (
        "a value PostgreSQL returned could not be decoded by Python: {}. The stored row is "
        "unchanged; inspect it with psql, then correct or cancel the job."),
    "client_misuse": (
        "{} (raised by the client before PostgreSQL answered, without a SQLSTATE; "
        "retrying will not help: check how the call is made)"),
}


def _translated(exc: BaseException, conn: psycopg.Connection[Any] | None,
                reading: bool) -> LeaseqError:
    sqlstate = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    message = _describe(exc) if isinstance(exc, psycopg.Error) else (
        str(exc) or type(exc).__name__)
    if sqlstate is None:
        failure = _client_failure(exc, conn, reading)
        return client_error_type(failure)(_CLIENT_MESSAGES[failure].format(message))
    error_type = error_type_for(sqlstate)
    if error_type is DatabaseUnavailableError:
        message = _CLIENT_MESSAGES["connection_failed"].format(message)
    elif error_type is PermissionDeniedError:
        message = (
            f"{message}. Connect as a member of the group of this duty "
            "(leaseq_producer or leaseq_tenant_producer to enqueue, leaseq_worker to "
            "claim and finish, leaseq_reaper to release expired leases and prune, "
            "leaseq_operator to redrive, cancel, prune and read), "
            "and apply the migrations (leaseq migrate) as the schema owner."
        )
    return error_type(message, sqlstate=sqlstate)


@contextmanager
def translate_errors(conn: psycopg.Connection[Any] | None = None, *,
                     reading: bool = False) -> Iterator[None]:
    """Re-raise any psycopg error as the matching :class:`LeaseqError` subclass.

    A psycopg error with a SQLSTATE maps by ``errors.SQLSTATE_ERRORS``. One without
    (raised in the client) maps by what failed: the connection (retryable), a closed
    ``conn``, a value that could not be sent (or, when ``reading``, decoded), or a
    misuse. The ValueError and TypeError that adapting a parameter raises (json.dumps
    of a set, text that is not valid Unicode) are values that could not be sent too.
    """
    try:
        yield
    except LeaseqError:
        raise
    except (psycopg.Error, ValueError, TypeError) as exc:
        raise _translated(exc, conn, reading) from exc
