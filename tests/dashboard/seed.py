"""Jobs in every state, some with hostile kinds, payloads and errors, made through the
same SQL functions producers and workers call (the owner only moves times back)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from tests.support.postgres import Conn

HOSTILE_KIND = "<script>alert('kind')</script>\"é✓"
HOSTILE_PAYLOAD = {"html": "</pre><script>alert(\"payload\")</script>", "quote": "'\"",
                   "unicode": "日本語 ✓ \u202e reversed"}
HOSTILE_ERROR = "</td><script>alert('error')</script> \"quoted\" ünïcødé 💥"


@dataclass
class Seeded:
    """Which job is which, by state."""

    tenants: list[uuid.UUID]
    jobs: dict[str, list[uuid.UUID]] = field(default_factory=dict)

    def add(self, state: str, job_id: Any) -> None:
        self.jobs.setdefault(state, []).append(uuid.UUID(str(job_id)))


def _enqueue(conn: Conn, tenant: uuid.UUID, key: str, kind: str,
             payload: dict[str, Any]) -> uuid.UUID:
    row = conn.execute("select id from app.enqueue_job(%s, %s, %s, %s)",
                       (tenant, key, kind, Jsonb(payload))).fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


def _claim(conn: Conn, tenant: uuid.UUID) -> dict[str, Any]:
    row = conn.execute("select id, lease_token from app.claim_jobs(%s, 'seed-worker', 1,"
                       " '10 minutes')", (tenant,)).fetchone()
    assert row is not None
    return row


def seed(worker: Conn, owner: Conn, *, extra_pending: int = 0) -> Seeded:
    """Three tenants; jobs pending, running (one lease expired), retrying, succeeded,
    dead and cancelled; the hostile ones in the first tenant."""
    tenants = [uuid.UUID(int=0xA11CE << 96 | i) for i in (1, 2, 3)]
    seeded = Seeded(tenants)
    hostile, second, third = tenants

    # Finished work first, so the claims below only find what they are meant to.
    for i in range(6):
        _enqueue(worker, second, f"ok-{i}", "email.send", {"to": f"user{i}@example.com"})
        job = _claim(worker, second)
        worker.execute("select app.complete_job(%s, %s, 'seed-worker', %s, %s)",
                       (second, job["id"], job["lease_token"], Jsonb({"sent": True})))
        seeded.add("succeeded", job["id"])
    _enqueue(worker, hostile, "dead-1", HOSTILE_KIND, HOSTILE_PAYLOAD)
    job = _claim(worker, hostile)
    worker.execute("select app.discard_job(%s, %s, 'seed-worker', %s, %s)",
                   (hostile, job["id"], job["lease_token"],
                    Jsonb({"message": HOSTILE_ERROR, "type": "ValueError"})))
    seeded.add("dead", job["id"])
    _enqueue(worker, third, "dead-2", "report.build", {"report": 7})
    job = _claim(worker, third)
    worker.execute("select app.discard_job(%s, %s, 'seed-worker', %s, %s)",
                   (third, job["id"], job["lease_token"],
                    Jsonb({"message": "report source missing"})))
    seeded.add("dead", job["id"])
    _enqueue(worker, hostile, "retry-1", HOSTILE_KIND, {"n": 1})
    job = _claim(worker, hostile)
    worker.execute("select app.fail_job(%s, %s, 'seed-worker', %s, %s, '1 hour')",
                   (hostile, job["id"], job["lease_token"],
                    Jsonb({"message": "timeout talking to <smtp>"})))
    seeded.add("retry_wait", job["id"])
    _enqueue(worker, third, "run-1", "report.build", {"report": 8})
    seeded.add("running", _claim(worker, third)["id"])
    _enqueue(worker, third, "run-2", "report.build", {"report": 9})
    stuck = _claim(worker, third)["id"]
    owner.execute("update app.jobs set lease_expires_at = clock_timestamp() - interval"
                  " '3 minutes' where id = %s", (stuck,))
    seeded.add("running", stuck)
    cancelled = _enqueue(worker, second, "cancel-1", "email.send", {"to": "x"})
    worker.execute("select * from app.cancel_jobs('seed-operator', null, %s, null, 1, null)",
                   ([cancelled],))
    seeded.add("cancelled", cancelled)

    # Still waiting: ready ones in two tenants, one of them hostile.
    seeded.add("pending", _enqueue(worker, hostile, "wait-1", HOSTILE_KIND, HOSTILE_PAYLOAD))
    for i in range(3 + extra_pending):
        seeded.add("pending", _enqueue(worker, second, f"wait-{i}", "email.send", {"i": i}))
    owner.execute("update app.jobs set available_at = available_at - interval '20 minutes',"
                  " created_at = created_at - interval '20 minutes'"
                  " where state = 'pending' and tenant_id = %s", (hostile,))
    # Spread the finished jobs over the last hours, so the charts have a shape.
    owner.execute("update app.jobs set completed_at = completed_at - (interval '37 minutes'"
                  " * (abs(hashtext(id::text)) % 20)) where completed_at is not null")
    return seeded
