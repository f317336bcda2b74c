"""leaseq SQL floor: the queue functions called directly, no library code.

Where the schema has ``app.finish_and_claim_jobs``, one call per batch records the
previous batch's outcomes and claims the next one; otherwise one
``app.claim_ready_jobs`` and one ``app.finish_jobs`` per batch. Each call is its own
autocommit statement and writes its audit rows. This is the least any leaseq client
can send per batch, so the library's drain is compared against it.

Usage: python -m harness.workers.leaseq_sql DSN OWNER BATCH
"""

from __future__ import annotations

import sys
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

from harness.workers import protocol

CLAIM = "select id, tenant_id, kind, payload, lease_token from app.claim_ready_jobs(%s, %s, %s)"
FINISH = (
    "select job_id, state from app.finish_jobs("
    "%s, %s::uuid[], %s::uuid[], %s::uuid[], %s::text[], %s::jsonb[], %s::interval[])"
)


def handle(_payload: object) -> None:
    """The no-op job."""


FINISH_AND_CLAIM = (
    "select claimed, id, tenant_id, kind, payload, lease_token from app.finish_and_claim_jobs("
    "%s, %s::uuid[], %s::uuid[], %s::uuid[], %s::text[], %s::jsonb[], %s::interval[], %s, %s)"
)
# Any signature that FINISH_AND_CLAIM's nine arguments can call: later ones (0015's kind
# filter) add arguments with defaults.
HAS_FINISH_AND_CLAIM = (
    "select exists (select 1 from pg_proc where proname = 'finish_and_claim_jobs'"
    " and pronamespace = 'app'::regnamespace) as ok"
)


def _outcomes(owner: str, done: list[dict[str, object]]) -> tuple[object, ...]:
    n = len(done)
    return (owner, [j["tenant_id"] for j in done], [j["id"] for j in done],
            [j["lease_token"] for j in done], ["succeeded"] * n, [None] * n, [None] * n)


def drain_bundled(conn: psycopg.Connection[dict[str, object]], owner: str, batch: int,
                  lease: timedelta) -> int:
    jobs = 0
    done: list[dict[str, object]] = []
    while True:
        rows = conn.execute(FINISH_AND_CLAIM, (*_outcomes(owner, done), batch, lease)).fetchall()
        jobs += len(done)
        claimed = [r for r in rows if r["claimed"]]
        if not claimed:
            return jobs
        for job in claimed:
            handle(job["payload"])
        done = claimed


def main(dsn: str, owner: str, batch: int) -> None:
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, row_factory=dict_row)
    lease = timedelta(seconds=30)
    row = conn.execute(HAS_FINISH_AND_CLAIM).fetchone()
    bundled = bool(row and row["ok"])
    protocol.ready_then_wait_for_go()
    if bundled:
        protocol.done(drain_bundled(conn, owner, batch, lease))
        protocol.wait_for_quit()
        conn.close()
        return
    jobs = 0
    while True:
        claimed = conn.execute(CLAIM, (owner, batch, lease)).fetchall()
        if not claimed:
            break
        for job in claimed:
            handle(job["payload"])
        conn.execute(FINISH, _outcomes(owner, claimed)).fetchall()
        jobs += len(claimed)
    protocol.done(jobs)
    protocol.wait_for_quit()
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
