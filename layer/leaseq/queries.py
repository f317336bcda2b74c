"""Every statement the library sends. Each constant carries its SQL function's name,
so one search crosses Python and ``sql/``; parameters are always bound, never formatted."""

from __future__ import annotations

from typing import Final, LiteralString

ENQUEUE_JOBS: Final[LiteralString] = (
    "select ord, job_id, status, state from app.enqueue_jobs("
    "%(tenant_ids)s::uuid[], %(operation_keys)s::text[], %(kinds)s::text[], %(payloads)s::jsonb[],"
    " %(available_ats)s::timestamptz[], %(max_attempts)s::integer[], %(correlation_ids)s::text[])"
)

CLAIM_READY_JOBS: Final[LiteralString] = (
    "select * from app.claim_ready_jobs(%(owner)s, %(limit)s, %(lease)s::interval)"
)

CLAIM_JOBS: Final[LiteralString] = (
    "select * from app.claim_jobs(%(tenant_id)s, %(owner)s, %(limit)s, %(lease)s::interval)"
)

READY_TENANTS: Final[LiteralString] = (
    "select tenant_id, oldest_ready_at from app.ready_tenants(%(limit)s)"
)

RENEW_JOB_LEASE: Final[LiteralString] = (
    "select app.renew_job_lease(%(tenant_id)s, %(job_id)s, %(owner)s, %(token)s,"
    " %(lease)s::interval) as renewed"
)

FINISH_JOBS: Final[LiteralString] = (
    "select job_id, state from app.finish_jobs(%(owner)s, %(tenant_ids)s::uuid[],"
    " %(job_ids)s::uuid[], %(tokens)s::uuid[], %(outcomes)s::text[], %(details)s::jsonb[],"
    " %(retry_delays)s::interval[])"
)

FINISH_AND_CLAIM_JOBS: Final[LiteralString] = (
    "select * from app.finish_and_claim_jobs(%(owner)s, %(tenant_ids)s::uuid[],"
    " %(job_ids)s::uuid[], %(tokens)s::uuid[], %(outcomes)s::text[], %(details)s::jsonb[],"
    " %(retry_delays)s::interval[], %(limit)s, %(lease)s::interval)"
)

RELEASE_JOBS: Final[LiteralString] = (
    "select job_id from app.release_jobs(%(owner)s, %(tenant_ids)s::uuid[],"
    " %(job_ids)s::uuid[], %(tokens)s::uuid[])"
)

RELEASE_EXPIRED_JOBS: Final[LiteralString] = (
    "select app.release_expired_jobs(%(tenant_id)s, %(limit)s) as released"
)

RELEASE_ALL_EXPIRED_JOBS: Final[LiteralString] = (
    "select app.release_all_expired_jobs(%(limit)s) as released"
)

PING: Final[LiteralString] = "select 1"
