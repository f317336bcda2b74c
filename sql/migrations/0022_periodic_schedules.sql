-- leaseq 0022: periodic jobs. A schedule is an owner-set row that the reaper's tick turns
-- into ordinary jobs, exactly one per slot (functions/schedules.sql).
--
--   * app.schedules holds one row per schedule: the tenant its jobs go into (shared work
--     goes into the shared tenant, the nil UUID), a name unique within that tenant, the
--     kind, payload and max_attempts of its jobs, a five-field cron expression or an
--     interval (@every 5m) and the time zone it is read in, the number of missed slots to
--     fill after an outage or a pause (0 = skip them), whether it is paused, and who
--     declared it (an operator, or code synced from a handlers module).
--   * next_slot is the tick's cursor: the first slot not yet enqueued or skipped. A tick
--     takes the schedules whose next_slot has come, enqueues their due slots through the
--     idempotent enqueue with the key schedule:<id>:<slot>, and moves the cursor past
--     now(), in one transaction. last_slot and last_job_id are the latest slot enqueued
--     and the job it made.
--   * Nobody but the owner reads or writes the table directly: operators and the owner go
--     through the functions, the reaper only ticks. Workers and producers have no right on
--     schedules at all (a worker login that could write one could enqueue any kind with any
--     payload into any tenant, for ever).
--   * app.settings gains schedule_grace (how late a slot may be enqueued and still count
--     as on time; the bound of the missed-slot metric) and schedule_window (how far back a
--     fill reaches; the tick never reaches further back than half of min_retention, so the
--     key of a slot it could enqueue is never one the reaper has pruned).

create table app.schedules (
  id uuid primary key default gen_random_uuid(),
  tenant_id uuid not null,
  name text not null
    constraint schedules_name_check check (length(name) between 1 and 128),
  kind text not null
    constraint schedules_kind_check check (length(kind) between 1 and 128),
  payload jsonb not null default '{}'::jsonb
    constraint schedules_payload_check check (jsonb_typeof(payload) = 'object'),
  expression text not null
    constraint schedules_expression_check check (length(expression) between 1 and 200),
  time_zone text not null default 'UTC'
    constraint schedules_time_zone_check check (length(time_zone) between 1 and 64),
  fill_limit integer not null default 0
    constraint schedules_fill_limit_check check (fill_limit between 0 and 1000),
  max_attempts integer not null default 6
    constraint schedules_max_attempts_check check (max_attempts between 1 and 20),
  paused boolean not null default false,
  source text not null default 'operator'
    constraint schedules_source_check check (source in ('operator', 'code')),
  next_slot timestamptz not null,
  last_slot timestamptz,
  last_job_id uuid,
  last_enqueued_at timestamptz,
  slots_enqueued bigint not null default 0,
  slots_missed bigint not null default 0,
  created_at timestamptz not null default clock_timestamp(),
  updated_at timestamptz not null default clock_timestamp(),
  constraint schedules_tenant_name_key unique (tenant_id, name)
);
revoke all on app.schedules from public;
alter table app.schedules enable row level security;

-- The tick's scan: active schedules by their cursor.
create index schedules_due_idx on app.schedules (next_slot) where not paused;

alter table app.settings
  add column schedule_grace interval not null default interval '5 minutes'
    constraint settings_schedule_grace_range
    check (schedule_grace between interval '1 minute' and interval '1 hour'),
  add column schedule_window interval not null default interval '12 hours'
    constraint settings_schedule_window_range
    check (schedule_window between interval '1 minute' and interval '30 days');
