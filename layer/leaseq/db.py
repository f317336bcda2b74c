"""Connections and the one place where psycopg errors become leaseq errors.

Connections are made for poolers such as RDS Proxy: no prepared statements
(``prepare_threshold=None``), no session state, autocommit with explicit short
transactions, TCP keepalives so a dead peer is noticed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from leaseq.errors import (
    DatabaseUnavailableError,
    LeaseqError,
    PermissionDeniedError,
    error_type_for,
)

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


def connect(dsn: str, *, application_name: str = "leaseq", **overrides: Any) -> Connection:
    """Open a pooler-safe connection that returns rows as dicts."""
    options = {**CONNECT_OPTIONS, "application_name": application_name, **overrides}
    with translate_errors():
        return psycopg.connect(dsn, row_factory=dict_row, **options)


def _describe(exc: psycopg.Error) -> str:
    diag = exc.diag
    text = diag.message_primary or str(exc).strip() or type(exc).__name__
    if diag.message_hint:
        text = f"{text} (hint: {diag.message_hint})"
    return text


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise any psycopg error as the matching :class:`LeaseqError` subclass."""
    try:
        yield
    except LeaseqError:
        raise
    except psycopg.Error as exc:
        sqlstate = exc.sqlstate
        error_type = error_type_for(sqlstate)
        message = _describe(exc)
        if error_type is DatabaseUnavailableError:
            message = (
                f"database unavailable: {message}. Check the host, port, credentials "
                "and network path (security groups, RDS Proxy), then retry."
            )
        elif error_type is PermissionDeniedError:
            message = (
                f"{message}. Connect as a member of the group of this duty "
                "(leaseq_producer or leaseq_tenant_producer to enqueue, leaseq_worker to "
                "claim and finish, leaseq_reaper to release expired leases and prune, "
                "leaseq_operator to redrive, cancel, prune and read), and apply the "
                "migrations (leaseq migrate) as the schema owner."
            )
        raise error_type(message, sqlstate=sqlstate) from exc
