"""Small helpers the library tests share: build requests, read jobs and audit trails back."""

from __future__ import annotations

import uuid
from typing import Any

from leaseq import EnqueueRequest, QueueClient

from tests.support.postgres import Conn


def requests(tenant: uuid.UUID, count: int, *, kind: str = "echo", prefix: str = "op",
             **fields: Any) -> list[EnqueueRequest]:
    return [EnqueueRequest(tenant_id=tenant, operation_key=f"{prefix}-{i}", kind=kind,
                           payload={"i": i}, **fields)
            for i in range(count)]


def enqueue(client: QueueClient, tenant: uuid.UUID, count: int = 1, *, kind: str = "echo",
            prefix: str = "op", **fields: Any) -> list[uuid.UUID]:
    results = client.enqueue_jobs(requests(tenant, count, kind=kind, prefix=prefix, **fields))
    assert all(r.created for r in results)
    return [r.job_id for r in results]


def job(conn: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        "select j.*, l.lease_token, l.expires_at as lease_expires_at from app.jobs j"
        " left join app.leases l on l.job_id = j.id where j.id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def jobs(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        "select j.*, l.lease_token, l.expires_at as lease_expires_at from app.jobs j"
        " left join app.leases l on l.job_id = j.id order by j.created_at, j.id").fetchall()


def event_types(conn: Conn, job_id: uuid.UUID) -> list[str]:
    rows = conn.execute(
        "select event_type from app.job_events where job_id = %s order by sequence", (job_id,)
    ).fetchall()
    return [r["event_type"] for r in rows]


def states(conn: Conn) -> dict[str, int]:
    rows = conn.execute("select state::text, count(*) as n from app.jobs group by state").fetchall()
    return {r["state"]: int(r["n"]) for r in rows}


def expire_lease(conn: Conn, job_id: uuid.UUID) -> None:
    """As an administrator: move a live lease into the past, as a crashed worker leaves it."""
    conn.execute(
        "update app.leases set expires_at = clock_timestamp() - interval '1 second'"
        " where job_id = %s", (job_id,))


def make_ready(conn: Conn) -> None:
    """As an administrator: make every waiting retry claimable now instead of sleeping."""
    conn.execute("update app.jobs set available_at = clock_timestamp() - interval '1 second'"
                 " where state = 'retry_wait'")
    # Jobs edited by hand keep their tenants' later turns until the turns are repaired.
    conn.execute("select * from app.repair_tenant_turns(10000)")
