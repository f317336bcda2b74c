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
    owner.execute("update app.leases set expires_at = clock_timestamp() - interval"
                  " '3 minutes' where job_id = %s", (stuck,))
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


def seed_history(worker: Conn, owner: Conn, tenants: list[uuid.UUID], *, jobs: int = 400,
                 hours: int = 24) -> None:
    """Finished jobs over the last ``hours`` (a few dead, some after retries, waits of a
    few seconds to minutes), so the overview's charts have something to draw."""
    kinds = ["email.send", "report.build", "invoice.render", "webhook.deliver"]
    for t, tenant in enumerate(tenants):
        count = jobs // len(tenants)
        worker.execute("select * from app.enqueue_jobs(%s, %s, %s, %s)", (
            [tenant] * count, [f"hist-{t}-{i}" for i in range(count)],
            [kinds[(i + t) % len(kinds)] for i in range(count)],
            [Jsonb({"i": i}) for i in range(count)]))
        while True:
            claimed = worker.execute(
                "select id, lease_token from app.claim_jobs(%s, 'seed-worker', 100,"
                " '10 minutes')", (tenant,)).fetchall()
            if not claimed:
                break
            outcomes = ["dead" if i % 23 == 0 else "succeeded" for i in range(len(claimed))]
            worker.execute(
                "select * from app.finish_jobs('seed-worker', %s, %s, %s, %s, %s, %s)", (
                    [tenant] * len(claimed), [c["id"] for c in claimed],
                    [c["lease_token"] for c in claimed], outcomes,
                    [Jsonb({"message": "upstream 503"} if o == "dead" else {"ok": True})
                     for o in outcomes], [None] * len(claimed)))
    # Spread completions over the window, more of them recently, with waits that grow
    # in the busy hours; some needed a second attempt.
    owner.execute("""
        with spread as (
          select id, tenant_id, (abs(hashtext(id::text)) %% 1000) / 1000.0 as f
          from app.jobs where operation_key like 'hist-%%'
        ), moved as (
          update app.jobs j set
            completed_at = now() - make_interval(secs => %s * 3600 * power(s.f, 1.4)),
            created_at = now() - make_interval(secs => %s * 3600 * power(s.f, 1.4))
                         - make_interval(secs => 2 + 240 * (1 - s.f) * (s.f * 7 - floor(s.f * 7))),
            attempts = case when abs(hashtext(j.id::text)) %% 9 = 0 then 2 else j.attempts end
          from spread s where j.id = s.id
          returning j.id, j.tenant_id, j.created_at, j.completed_at
        )
        update app.job_events e set
          created_at = case e.event_type
                         when 'created' then m.created_at
                         when 'claimed' then m.completed_at - interval '1 second'
                         else m.completed_at end,
          details = case when e.event_type = 'created'
                         then jsonb_set(e.details, '{availableAt}', to_jsonb(m.created_at))
                         else e.details end
        from moved m where e.tenant_id = m.tenant_id and e.job_id = m.id
    """, (hours, hours))
