-- leaseq 0001: the reference queue structure (schema, state enum, tables, indexes).
--
-- This migration is deliberately re-runnable: every statement is guarded, so it is
-- a no-op on a database where the reference schema was already applied by hand, and
-- the migrations after it upgrade such a database in place without touching rows.
-- It creates no functions, roles, grants or policies; 0002 onwards does that.

create schema if not exists app;

do $$
begin
  if to_regtype('app.job_state') is null then
    create type app.job_state as enum (
      'pending',
      'running',
      'retry_wait',
      'succeeded',
      'dead'
    );
  end if;
end
$$;

create table if not exists app.jobs (
  id uuid primary key default gen_random_uuid(),
  tenant_id uuid not null,
  operation_key text not null,
  kind text not null,
  payload jsonb not null check (jsonb_typeof(payload) = 'object'),
  state app.job_state not null default 'pending',
  attempts integer not null default 0 check (attempts >= 0),
  max_attempts integer not null default 6 check (max_attempts between 1 and 20),
  available_at timestamptz not null default clock_timestamp(),
  lease_owner text,
  lease_token uuid,
  lease_expires_at timestamptz,
  last_error jsonb,
  result jsonb,
  created_at timestamptz not null default clock_timestamp(),
  updated_at timestamptz not null default clock_timestamp(),
  completed_at timestamptz,
  constraint jobs_operation_key_unique unique (tenant_id, operation_key),
  constraint jobs_lease_shape check (
    (state = 'running' and lease_owner is not null and lease_token is not null and lease_expires_at is not null)
    or
    (state <> 'running' and lease_owner is null and lease_token is null and lease_expires_at is null)
  )
);

create index if not exists jobs_claimable_idx
on app.jobs (tenant_id, available_at, created_at, id)
where state in ('pending', 'retry_wait');

create index if not exists jobs_expired_lease_idx
on app.jobs (tenant_id, lease_expires_at, id)
where state = 'running';

create table if not exists app.job_events (
  sequence bigint generated always as identity primary key,
  id uuid not null default gen_random_uuid(),
  tenant_id uuid not null,
  job_id uuid not null references app.jobs(id) on delete cascade,
  event_type text not null check (event_type in (
    'created', 'claimed', 'retry_scheduled',
    'succeeded', 'dead', 'lease_expired'
  )),
  actor text not null,
  details jsonb not null default '{}'::jsonb check (jsonb_typeof(details) = 'object'),
  created_at timestamptz not null default clock_timestamp(),
  constraint job_events_id_unique unique (tenant_id, id)
);

create index if not exists job_events_job_timeline_idx
on app.job_events (tenant_id, job_id, sequence);
