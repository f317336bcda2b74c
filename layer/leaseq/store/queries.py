"""Every statement the library sends, but for the migrator's own bookkeeping
(:mod:`leaseq.store.migrate`).

:class:`leaseq.store.client.QueueClient` sends them, for every caller: the worker and the
reaper, the Lambda functions, the dashboard and the command line. Each constant carries
its SQL function's name, so one search crosses Python and ``sql/``; parameters are always
bound, never formatted. tests/library/test_queries.py fails on an ``app.`` function call
written anywhere else, or on another module importing this one."""

from __future__ import annotations

from typing import Final, LiteralString

ENQUEUE_JOBS: Final[LiteralString] = (
    "select ord, job_id, status, state, error, queue from app.enqueue_jobs("
    "%(tenant_ids)s::uuid[], %(operation_keys)s::text[], %(kinds)s::text[], %(payloads)s::jsonb[],"
    " %(available_ats)s::timestamptz[], %(max_attempts)s::integer[], %(correlation_ids)s::text[],"
    " %(priorities)s::integer[], %(queues)s::text[], %(limit_keys)s::text[])"
)

# The claims' kind filter (kinds, exclude_kinds) is NULL, NULL for every kind; their
# queue NULL for every queue that is not paused.
CLAIM_READY_JOBS: Final[LiteralString] = (
    "select * from app.claim_ready_jobs(%(owner)s, %(limit)s, %(lease)s::interval,"
    " %(kinds)s::text[], %(exclude_kinds)s::text[], %(queue)s::text)"
)

CLAIM_JOBS: Final[LiteralString] = (
    "select * from app.claim_jobs(%(tenant_id)s, %(owner)s, %(limit)s, %(lease)s::interval,"
    " %(kinds)s::text[], %(exclude_kinds)s::text[], %(queue)s::text)"
)

READY_TENANTS: Final[LiteralString] = (
    "select tenant_id, oldest_ready_at from app.ready_tenants(%(limit)s)"
)

OLDEST_READY_AT: Final[LiteralString] = "select app.oldest_ready_at() as oldest_ready_at"

RENEW_JOB_LEASE: Final[LiteralString] = (
    "select app.renew_job_lease(%(tenant_id)s, %(job_id)s, %(owner)s, %(token)s,"
    " %(lease)s::interval) as renewed"
)
# The worker's renewal: the lease and, in the same row, whether a cancel was requested.
RENEW_JOB_LEASE_STATUS: Final[LiteralString] = (
    "select renewed, cancel_requested from app.renew_job_lease_status(%(tenant_id)s,"
    " %(job_id)s, %(owner)s, %(token)s, %(lease)s::interval)"
)

# The per-job arrays of a batch's outcomes travel in binary (%b): a worker sends them for
# every batch, and the text form costs the client a quoting scan of every element.
FINISH_JOBS: Final[LiteralString] = (
    "select job_id, state from app.finish_jobs(%(owner)s, %(tenant_ids)b::uuid[],"
    " %(job_ids)b::uuid[], %(tokens)b::uuid[], %(outcomes)b::text[], %(details)b::jsonb[],"
    " %(retry_delays)b::interval[])"
)

FINISH_AND_CLAIM_JOBS: Final[LiteralString] = (
    "select * from app.finish_and_claim_jobs(%(owner)s, %(tenant_ids)b::uuid[],"
    " %(job_ids)b::uuid[], %(tokens)b::uuid[], %(outcomes)b::text[], %(details)b::jsonb[],"
    " %(retry_delays)b::interval[], %(limit)s, %(lease)s::interval, %(kinds)s::text[],"
    " %(exclude_kinds)s::text[], %(queue)s::text)"
)

RELEASE_JOBS: Final[LiteralString] = (
    "select job_id from app.release_jobs(%(owner)s, %(tenant_ids)s::uuid[],"
    " %(job_ids)s::uuid[], %(tokens)s::uuid[])"
)

# A producer's reads of its own jobs (sql/functions/results.sql): never a lease token.
GET_JOB_RESULT: Final[LiteralString] = (
    "select * from app.get_job_result(%(tenant_id)s, %(job_id)s)"
)
GET_JOB_RESULT_BY_KEY: Final[LiteralString] = (
    "select * from app.get_job_result_by_key(%(tenant_id)s, %(operation_key)s)"
)

RELEASE_EXPIRED_JOBS: Final[LiteralString] = (
    "select app.release_expired_jobs(%(tenant_id)s, %(limit)s) as released"
)

RELEASE_ALL_EXPIRED_JOBS: Final[LiteralString] = (
    "select app.release_all_expired_jobs(%(limit)s) as released"
)

REPAIR_TENANT_TURNS: Final[LiteralString] = (
    "select tenants_checked, turns_repaired from app.repair_tenant_turns(%(limit)s)"
)

# The worker pool (sql/functions/pool.sql): places of running and starting invocations,
# bounded by the schema owner's maximum, for fan-out and wake-on-enqueue.
JOIN_WORKER_POOL: Final[LiteralString] = (
    "select app.join_worker_pool(%(owner)s, %(reason)s, %(reservation)s::uuid,"
    " %(max_workers)s, %(expires_in)s::interval, %(queue)s::text) as joined"
)
LEAVE_WORKER_POOL: Final[LiteralString] = "select app.leave_worker_pool(%(owner)s)"
RESERVE_WORKER_PLACES: Final[LiteralString] = (
    "select r.place from app.reserve_worker_places(%(wanted)s, %(max_workers)s,"
    " %(hold)s::interval, %(queue)s::text) as r(place)"
)
RELEASE_WORKER_PLACE: Final[LiteralString] = "select app.release_worker_place(%(place)s::uuid)"
WAKE_WORKER_PLACE: Final[LiteralString] = (
    "select app.wake_worker_place(%(queue)s::text) as place"
)
# A named queue's worker function, as its deploy registered it (0028_queue_workers).
QUEUE_WORKER_FUNCTION: Final[LiteralString] = (
    "select app.queue_worker_function(%(queue)s::text) as function_name"
)
# The schema owner's: the pool's limits in app.settings.
SET_WORKER_POOL_LIMITS: Final[LiteralString] = (
    "select max_workers, start_hold, wake_debounce from app.set_worker_pool_limits("
    "%(max_workers)s::integer, %(start_hold)s::interval, %(wake_debounce)s::interval)"
)
WORKER_POOL_SIZE: Final[LiteralString] = (
    "select live, reserved from app.worker_pool_size(%(queue)s::text)"
)

# Named queues (sql/functions/queues.sql): pause, resume, and each queue's state.
PAUSE_QUEUE: Final[LiteralString] = (
    "select queue, paused_at, paused_by, pause_reason"
    " from app.pause_queue(%(queue)s, %(actor)s, %(reason)s)"
)
RESUME_QUEUE: Final[LiteralString] = (
    "select queue, paused_at, paused_by, pause_reason"
    " from app.resume_queue(%(queue)s, %(actor)s)"
)
QUEUE_OVERVIEW: Final[LiteralString] = (
    "select queue, ready, scheduled, running, retrying, dead, oldest_ready_at, live_workers,"
    " reserved_workers, max_workers, paused_at, paused_by, pause_reason"
    " from app.queue_overview(%(queue)s::text)"
)
QUEUE_STATE: Final[LiteralString] = (
    "select queue, paused_at, paused_by, pause_reason from app.queue_state(%(queue)s)"
)
QUEUE_HISTORY: Final[LiteralString] = (
    "select queue, event_type, actor, login, reason, created_at"
    " from app.queue_history(%(queue)s, %(limit)s)"
)
# The schema owner's: kinds' routes and a queue's own worker limit.
ROUTE_KINDS: Final[LiteralString] = (
    "select app.route_kinds(%(queue)s, %(kinds)s::text[]) as moved"
)
SET_QUEUE_LIMITS: Final[LiteralString] = (
    "select app.set_queue_limits(%(queue)s, %(max_workers)s::integer) as max_workers"
)
# The schema owner's: queues' workers registered by their deploys (0028_queue_workers).
REGISTER_QUEUE_WORKER: Final[LiteralString] = (
    "select app.register_queue_worker(%(queue)s, %(function_name)s, %(connections)s::integer,"
    " %(stack_id)s, %(limit)s::integer) as total"
)
UNREGISTER_QUEUE_WORKER: Final[LiteralString] = (
    "select app.unregister_queue_worker(%(queue)s, %(stack_id)s) as removed"
)
QUEUE_CONNECTIONS: Final[LiteralString] = (
    "select stack_connections, proxy_percent, queue_connections, queues"
    " from app.queue_connections(%(except_queue)s::text)"
)
SET_STACK_CONNECTIONS: Final[LiteralString] = (
    "select app.set_stack_connections(%(connections)s::integer, %(proxy_percent)s::integer)"
)
# Whether the schema has the registry yet (the deploy's budget check runs before migrating).
QUEUE_REGISTRY_PRESENT: Final[LiteralString] = (
    "select to_regprocedure('app.queue_connections(text)') is not null as present"
)

# Operator functions (sql/functions/operate.sql): the command line's and the dashboard's.

QUEUE_STATUS: Final[LiteralString] = (
    "select tenant_id, state::text as state, jobs, ready_jobs, oldest_ready_age,"
    " next_ready_in, cancel_requested from app.queue_status(%(tenant_id)s)"
)
GET_JOB: Final[LiteralString] = "select * from app.get_job(%(job_id)s)"
JOB_WAIT_REASONS: Final[LiteralString] = (
    "select * from app.job_wait_reasons(%(job_ids)s::uuid[])"
)
READER_JOB_WAIT_REASONS: Final[LiteralString] = (
    "select * from app.reader_job_wait_reasons(%(job_ids)s::uuid[])"
)
WAITING_JOBS: Final[LiteralString] = (
    "select tenant_id, reason, jobs, next_at from app.waiting_jobs(%(tenant_id)s)"
)
JOB_TIMELINE: Final[LiteralString] = (
    "select sequence, event_type, actor, details, created_at"
    " from app.job_timeline(%(job_id)s, %(limit)s)"
)
DEAD_JOBS: Final[LiteralString] = (
    "select * from app.dead_jobs(%(tenant_id)s, %(kind)s, %(limit)s)"
)
REDRIVE_JOBS: Final[LiteralString] = (
    "select job_id, tenant_id, kind from app.redrive_jobs(%(actor)s, %(tenant_id)s,"
    " %(job_ids)s::uuid[], %(kind)s, %(limit)s, %(reason)s)"
)
CANCEL_JOBS: Final[LiteralString] = (
    "select job_id, tenant_id, kind from app.cancel_jobs(%(actor)s, %(tenant_id)s,"
    " %(job_ids)s::uuid[], %(kind)s, %(limit)s, %(reason)s)"
)
# The dashboard's actions: exactly the jobs named (1 .. 1000 ids), never a filter.
REDRIVE_JOBS_BY_ID: Final[LiteralString] = (
    "select job_id, tenant_id, kind from app.redrive_jobs_by_id(%(actor)s,"
    " %(job_ids)s::uuid[], %(reason)s)"
)
CANCEL_JOBS_BY_ID: Final[LiteralString] = (
    "select job_id, tenant_id, kind from app.cancel_jobs_by_id(%(actor)s,"
    " %(job_ids)s::uuid[], %(reason)s)"
)
# Cancel named jobs whatever their state: pending ones at once, running ones by request.
REQUEST_JOB_CANCEL: Final[LiteralString] = (
    "select job_id, tenant_id, kind, state::text as state, cancel_requested_at,"
    " cancel_requested_by from app.request_job_cancel(%(actor)s, %(job_ids)s::uuid[],"
    " %(reason)s)"
)
PRUNE_JOBS: Final[LiteralString] = (
    "select jobs_deleted, events_deleted from app.prune_jobs(%(older_than)s::interval,"
    " %(limit)s)"
)
# The reaper's prune: refused (22023) below the owner's floor, app.settings.min_retention.
PRUNE_RETAINED_JOBS: Final[LiteralString] = (
    "select jobs_deleted, events_deleted from app.prune_retained_jobs("
    "%(older_than)s::interval, %(limit)s)"
)
# The reaper's upkeep of the audit trail's days (sql/functions/events.sql).
ROLL_EVENT_DAYS: Final[LiteralString] = (
    "select days_added, days_closed, analyzed from app.roll_event_days()"
)
# The reaper's sweep of sessions past their caps (sql/functions/tenancy.sql).
END_STALLED_SESSIONS: Final[LiteralString] = (
    "select pid, login, state, stalled_for, outcome from app.end_stalled_sessions()"
)

PING: Final[LiteralString] = "select 1"

# Dashboard reads (sql/functions/read.sql). The operator forms (app.*) see every tenant;
# the reader forms (app.reader_*) run with a tenant reader's rights, so row-level
# security picks the rows, after SET_READER_TENANT in the same transaction.

QUEUE_DEPTH: Final[LiteralString] = (
    "select dimension, tenant_id, kind, pending, ready, running, expired, retry_wait, dead,"
    " oldest_ready_at from app.queue_depth(%(tenant_id)s, %(kind)s, %(limit)s)"
)
READER_QUEUE_DEPTH: Final[LiteralString] = (
    "select dimension, tenant_id, kind, pending, ready, running, expired, retry_wait, dead,"
    " oldest_ready_at from app.reader_queue_depth(%(tenant_id)s, %(kind)s, %(limit)s)"
)
JOB_ACTIVITY: Final[LiteralString] = (
    "select * from app.job_activity(%(tenant_id)s, %(kind)s, %(window)s::interval,"
    " %(buckets)s, %(samples)s)"
)
READER_JOB_ACTIVITY: Final[LiteralString] = (
    "select * from app.reader_job_activity(%(tenant_id)s, %(kind)s, %(window)s::interval,"
    " %(buckets)s, %(samples)s)"
)
LIST_JOBS: Final[LiteralString] = (
    "select * from app.list_jobs(%(state)s::app.job_state,"
    " %(tenant_id)s, %(kind)s, %(since)s, %(until)s, %(after_at)s, %(after_id)s, %(limit)s)"
)
READER_LIST_JOBS: Final[LiteralString] = (
    "select * from app.reader_list_jobs(%(state)s::app.job_state,"
    " %(tenant_id)s, %(kind)s, %(since)s, %(until)s, %(after_at)s, %(after_id)s, %(limit)s)"
)
READER_GET_JOB: Final[LiteralString] = (
    "select * from app.reader_get_job(%(job_id)s)"
)
READER_JOB_TIMELINE: Final[LiteralString] = (
    "select sequence, event_type, actor, details, created_at"
    " from app.reader_job_timeline(%(job_id)s, %(limit)s)"
)
#: Selects the tenant a reader session sees, for the current transaction only.
SET_READER_TENANT: Final[LiteralString] = (
    "select set_config('app.tenant_id', %(tenant_id)s, true)"
)

# Schedules (sql/functions/schedules.sql): the reaper's tick, and the operators' (and the
# owner's) definitions.
TICK_SCHEDULES: Final[LiteralString] = (
    "select schedule_id, tenant_id, name, enqueued, existing, late, skipped, last_slot,"
    " last_job_id, next_slot from app.tick_schedules(%(limit)s)"
)
PUT_SCHEDULE: Final[LiteralString] = (
    "select schedule_id, status, next_slot from app.put_schedule(%(tenant_id)s, %(name)s,"
    " %(kind)s, %(expression)s, %(time_zone)s, %(payload)s, %(fill_limit)s, %(max_attempts)s,"
    " %(source)s)"
)
PAUSE_SCHEDULE: Final[LiteralString] = (
    "select schedule_id, paused, next_slot from app.pause_schedule(%(tenant_id)s, %(name)s,"
    " %(paused)s)"
)
REMOVE_SCHEDULE: Final[LiteralString] = (
    "select app.remove_schedule(%(tenant_id)s, %(name)s) as removed"
)
LIST_SCHEDULES: Final[LiteralString] = (
    "select * from app.list_schedules(%(tenant_id)s, %(next)s)"
)
SYNC_SCHEDULES: Final[LiteralString] = (
    "select schedule_id, tenant_id, name, status from app.sync_schedules("
    "%(tenant_ids)s::uuid[], %(names)s::text[], %(kinds)s::text[], %(expressions)s::text[],"
    " %(time_zones)s::text[], %(payloads)s::jsonb[], %(fill_limits)s::integer[],"
    " %(max_attempts)s::integer[])"
)

# Limits (functions/admission.sql).
SET_LIMIT: Final[LiteralString] = (
    "select app.set_limit(%(actor)s, %(scope)s, %(kind)s, %(tenant_id)s, %(limit_key)s,"
    " %(concurrency)s, %(rate_count)s, %(rate_period)s, %(burst)s) as name"
)
REMOVE_LIMIT: Final[LiteralString] = (
    "select app.remove_limit(%(scope)s, %(kind)s, %(tenant_id)s, %(limit_key)s) as removed"
)
LIST_LIMITS: Final[LiteralString] = "select * from app.list_limits()"
SYNC_LIMITS: Final[LiteralString] = (
    "select name, status from app.sync_limits(%(kinds)s::text[], %(per_tenant)s::boolean[],"
    " %(concurrency)s::integer[], %(rate_counts)s::integer[], %(rate_periods)s::interval[],"
    " %(bursts)s::integer[])"
)
LIMIT_STATUS: Final[LiteralString] = "select * from app.limit_status()"
ADMIT_HELD_JOBS: Final[LiteralString] = "select app.admit_held_jobs(%(limit)s) as admitted"
