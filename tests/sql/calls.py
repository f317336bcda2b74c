"""The SQL calls and checks the contract tests share.

They only call the SQL functions with bound parameters and read rows back; the
statements live here so each test reads as the behaviour it checks.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.support.postgres import Conn

WORKER_NAME = "worker-1"


def new_tenant() -> uuid.UUID:
    return uuid.uuid4()


def enqueue(
    conn: Conn,
    tenant: uuid.UUID,
    key: str,
    *,
    kind: str = "email.send",
    payload: Any = None,
    available_at: Any = None,
    max_attempts: int | None = 6,
) -> dict[str, Any]:
    """Call app.enqueue_job and return the job row it answers with."""
    row = conn.execute(
        "select * from app.enqueue_job(%s, %s, %s, %s, %s, %s)",
        (
            tenant,
            key,
            kind,
            Jsonb({"n": key} if payload is None else payload),
            available_at,
            max_attempts,
        ),
    ).fetchone()
    assert row is not None
    return row


def enqueue_many(
    conn: Conn, tenant: uuid.UUID, count: int, *, prefix: str = "op"
) -> list[uuid.UUID]:
    """Enqueue ``count`` jobs of one tenant in one batch call.

    They share available_at and created_at, so claims take them in id order.
    """
    rows = conn.execute(
        "select job_id from app.enqueue_jobs(%s, %s, %s, %s) order by ord",
        (
            [tenant] * count,
            [f"{prefix}-{i}" for i in range(count)],
            ["email.send"] * count,
            [Jsonb({"i": i}) for i in range(count)],
        ),
    ).fetchall()
    return [row["job_id"] for row in rows]


def claim(
    conn: Conn,
    tenant: uuid.UUID,
    *,
    owner: str = WORKER_NAME,
    limit: int | None = 10,
    lease: timedelta | None = timedelta(seconds=30),
) -> list[dict[str, Any]]:
    return conn.execute(
        "select * from app.claim_jobs(%s, %s, %s, %s)", (tenant, owner, limit, lease)
    ).fetchall()


def claim_one(conn: Conn, tenant: uuid.UUID, *, owner: str = WORKER_NAME) -> dict[str, Any]:
    rows = claim(conn, tenant, owner=owner, limit=1)
    assert len(rows) == 1, rows
    return rows[0]


def job(conn: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    """Read a job as the owner or an administrator (no RLS applies to them), with its
    lease (app.leases) while it is running."""
    row = conn.execute(
        "select j.*, l.lease_token, l.expires_at as lease_expires_at from app.jobs j"
        " left join app.leases l on l.job_id = j.id where j.id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def events(conn: Conn, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """A job's audit trail in the order it was written."""
    return conn.execute(
        "select * from app.job_events where job_id = %s order by sequence", (job_id,)
    ).fetchall()


def event_types(conn: Conn, job_id: uuid.UUID) -> list[str]:
    return [e["event_type"] for e in events(conn, job_id)]


def expire_lease(conn: Conn, job_id: uuid.UUID) -> None:
    """Move a live lease into the past, as a crashed worker would leave it."""
    conn.execute(
        "update app.leases set expires_at = clock_timestamp() - interval '1 second'"
        " where job_id = %s",
        (job_id,),
    )


def make_ready(conn: Conn, job_id: uuid.UUID) -> None:
    """Let a job scheduled for later be claimable now (instead of sleeping)."""
    conn.execute(
        "update app.jobs set available_at = clock_timestamp() - interval '1 second'"
        " where id = %s",
        (job_id,),
    )


def snapshot(conn: Conn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every job and event, to prove a refused call changed nothing."""
    jobs = conn.execute(
        "select j.*, l.lease_token, l.expires_at as lease_expires_at,"
        " (select count(*) from app.claimable c where c.job_id = j.id) as claimable"
        " from app.jobs j left join app.leases l on l.job_id = j.id order by j.id").fetchall()
    audit = conn.execute("select * from app.job_events order by sequence").fetchall()
    return jobs, audit


@contextmanager
def raises_sqlstate(sqlstate: str, match: str | None = None) -> Iterator[None]:
    """Expect a PostgreSQL error with this SQLSTATE (and message fragment)."""
    with pytest.raises(psycopg.Error) as caught:
        yield
    assert caught.value.sqlstate == sqlstate, (caught.value.sqlstate, str(caught.value))
    if match is not None:
        assert match in str(caught.value), str(caught.value)


@contextmanager
def event_insert_statements(admin: Conn, caller: Conn) -> Iterator[list[int]]:
    """Record, per INSERT statement into app.job_events, how many rows it wrote.

    A statement-level trigger with a transition table reports each statement as a
    notice on the calling connection, so a set-based writer shows one entry holding
    all its rows and a row-by-row loop shows one entry per row.
    """
    admin.execute(
        """
        create function public.leaseq_test_event_statements() returns trigger
        language plpgsql as $$
        begin
          raise notice 'leaseq-test job_events insert: %', (select count(*) from new_rows);
          return null;
        end
        $$
        """
    )
    admin.execute(
        "create trigger leaseq_test_event_statements after insert on app.job_events"
        " referencing new table as new_rows for each statement"
        " execute function public.leaseq_test_event_statements()"
    )
    seen: list[int] = []
    prefix = "leaseq-test job_events insert: "

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith(prefix):
            seen.append(int(message.removeprefix(prefix)))

    caller.add_notice_handler(on_notice)
    try:
        yield seen
    finally:
        caller.remove_notice_handler(on_notice)
        admin.execute("drop trigger leaseq_test_event_statements on app.job_events")
        admin.execute("drop function public.leaseq_test_event_statements()")
