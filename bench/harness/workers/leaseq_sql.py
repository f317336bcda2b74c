"""leaseq SQL floor: the two queue functions called directly, no library code.

One ``app.claim_ready_jobs`` and one ``app.finish_jobs`` per batch, each its own
autocommit statement, both writing their audit rows. This is the least any leaseq
client can send per batch, so the library's drain is compared against it.

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


def main(dsn: str, owner: str, batch: int) -> None:
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, row_factory=dict_row)
    lease = timedelta(seconds=30)
    protocol.ready_then_wait_for_go()
    jobs = 0
    while True:
        claimed = conn.execute(CLAIM, (owner, batch, lease)).fetchall()
        if not claimed:
            break
        for job in claimed:
            handle(job["payload"])
        n = len(claimed)
        conn.execute(FINISH, (
            owner,
            [j["tenant_id"] for j in claimed],
            [j["id"] for j in claimed],
            [j["lease_token"] for j in claimed],
            ["succeeded"] * n,
            [None] * n,
            [None] * n,
        )).fetchall()
        jobs += n
    protocol.done(jobs)
    protocol.wait_for_quit()
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
