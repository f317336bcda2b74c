-- leaseq 0006: operator functions (redrive, cancel, prune) and the reads behind `leaseq`.
--
-- service_role has no table privileges, so whatever an operator does or looks at goes
-- through a SECURITY DEFINER function here; the Lambdas and the command line share them.
--
-- A new terminal state, 'cancelled', is added below. PostgreSQL refuses to USE an enum
-- value in the transaction that added it (migrations run one transaction each), so
-- nothing in this file evaluates the literal: plpgsql bodies are only parsed when first
-- called, and the prune index is defined on completed_at, which is non-NULL exactly for
-- finished jobs (succeeded, dead, cancelled), instead of on the state.
--
-- Decisions:
--   * redrive turns a dead job back into a pending one with attempts reset to 0: it gets
--     a whole new set of max_attempts. The previous attempts and the error that killed
--     it stay in the 'redriven' event (and in last_error until the next failure).
--   * cancel applies to pending and retry_wait jobs only; a running job belongs to its
--     worker until it finishes or its lease expires.
--   * reads never return lease tokens: they fence a worker's writes, an operator needs
--     the owner and expiry, never the token.
--
-- Argument bounds (anything outside, or NULL where required, raises 22023):
--   actor                 1 .. 200 characters
--   reason                at most 500 characters (NULL allowed)
--   job ids               1 .. 1000 per call (NULL = no filter)
--   kind filter           1 .. 128 characters (NULL = no filter)
--   redrive/cancel limit  1 .. 1000 per call
--   prune age             0 seconds .. 3650 days; prune limit 1 .. 10000 per call
--   dead list limit       1 .. 1000; timeline limit 1 .. 10000 events

alter type app.job_state add value if not exists 'cancelled';

-- Finished jobs by completion time: prune walks it oldest first, the dead list newest
-- first. Only finished rows are in it (one index entry per completion).
create index if not exists jobs_completed_idx
on app.jobs (completed_at)
where completed_at is not null;

create function app.check_filters(p_job_ids uuid[], p_kind text, p_limit integer)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_job_ids is not null then
    perform app.check_range('number of job ids', cardinality(p_job_ids), 1, 1000);
    if array_position(p_job_ids, null) is not null then
      perform app.raise_invalid('p_job_ids must not contain NULL');
    end if;
  end if;
  if p_kind is not null and (btrim(p_kind) = '' or length(p_kind) > 128) then
    perform app.raise_invalid('p_kind must be a non-blank text of at most 128 characters');
  end if;
  perform app.check_range('p_limit', p_limit, 1, 1000);
end;
$$;

create function app.check_reason(p_reason text)
returns void
language plpgsql
immutable
set search_path = ''
as $$
begin
  if p_reason is not null and length(p_reason) > 500 then
    perform app.raise_invalid(format('p_reason must be at most 500 characters (got %s)',
      length(p_reason)));
  end if;
end;
$$;

-- Redrive ------------------------------------------------------------------------------

-- Dead jobs matching every given filter (NULL = any) go back to pending, available now,
-- with attempts reset to 0, oldest death first, at most p_limit per call. Each gets a
-- 'redriven' event naming p_actor. Returns the jobs redriven.
create function app.redrive_jobs(
  p_actor text,
  p_tenant_id uuid default null,
  p_job_ids uuid[] default null,
  p_kind text default null,
  p_limit integer default 100,
  p_reason text default null
)
returns table (job_id uuid, tenant_id uuid, kind text)
language plpgsql
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  perform app.check_owner(p_actor);
  perform app.check_filters(p_job_ids, p_kind, p_limit);
  perform app.check_reason(p_reason);

  return query
  with victims as materialized (
    select j.id, j.attempts as previous_attempts
    from app.jobs j
    where j.state = 'dead'
      and (p_tenant_id is null or j.tenant_id = p_tenant_id)
      and (p_job_ids is null or j.id = any (p_job_ids))
      and (p_kind is null or j.kind = p_kind)
    order by j.completed_at, j.id
    for update skip locked
    limit p_limit
  ), redriven as (
    update app.jobs j
    set state = 'pending',
        attempts = 0,
        available_at = v_now,
        completed_at = null,
        updated_at = v_now
    from victims v
    where j.id = v.id
    returning j.id, j.tenant_id, j.kind, v.previous_attempts
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select r.tenant_id, r.id, 'redriven', p_actor,
           jsonb_strip_nulls(jsonb_build_object(
             'previousAttempts', r.previous_attempts,
             'reason', p_reason)),
           v_now
    from redriven r
  )
  select r.id, r.tenant_id, r.kind from redriven r order by r.id;
end;
$$;

-- Cancel -------------------------------------------------------------------------------

-- Pending and retry_wait jobs matching every given filter become 'cancelled' (terminal,
-- completed now), at most p_limit per call, each with a 'cancelled' event. Jobs a
-- claimer holds locked right now are skipped: they are about to run.
create function app.cancel_jobs(
  p_actor text,
  p_tenant_id uuid default null,
  p_job_ids uuid[] default null,
  p_kind text default null,
  p_limit integer default 100,
  p_reason text default null
)
returns table (job_id uuid, tenant_id uuid, kind text)
language plpgsql
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  perform app.check_owner(p_actor);
  perform app.check_filters(p_job_ids, p_kind, p_limit);
  perform app.check_reason(p_reason);

  return query
  with victims as materialized (
    select j.id, j.state as previous_state
    from app.jobs j
    where j.state in ('pending', 'retry_wait')
      and (p_tenant_id is null or j.tenant_id = p_tenant_id)
      and (p_job_ids is null or j.id = any (p_job_ids))
      and (p_kind is null or j.kind = p_kind)
    order by j.available_at, j.id
    for update skip locked
    limit p_limit
  ), cancelled as (
    update app.jobs j
    set state = 'cancelled',
        completed_at = v_now,
        updated_at = v_now
    from victims v
    where j.id = v.id
    returning j.id, j.tenant_id, j.kind, j.attempts, v.previous_state
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select c.tenant_id, c.id, 'cancelled', p_actor,
           jsonb_strip_nulls(jsonb_build_object(
             'previousState', c.previous_state,
             'attempts', c.attempts,
             'reason', p_reason)),
           v_now
    from cancelled c
  )
  select c.id, c.tenant_id, c.kind from cancelled c order by c.id;
end;
$$;

-- Prune --------------------------------------------------------------------------------

-- One bounded batch: finished jobs (succeeded, dead, cancelled) completed more than
-- p_older_than ago, oldest first, with their events. Rows locked by someone else are
-- skipped, so a batch never waits; callers loop until jobs_deleted < p_limit. Each call
-- is its own short transaction holding row locks on at most p_limit jobs.
create function app.prune_jobs(
  p_older_than interval,
  p_limit integer default 1000
)
returns table (jobs_deleted integer, events_deleted integer)
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_cutoff timestamptz;
  v_jobs integer;
  v_events integer;
begin
  perform app.check_interval('p_older_than', p_older_than, interval '0 seconds',
                             interval '3650 days');
  perform app.check_range('p_limit', p_limit, 1, 10000);
  v_cutoff := clock_timestamp() - p_older_than;

  with victims as materialized (
    select j.id, j.tenant_id
    from app.jobs j
    where j.completed_at is not null
      and j.completed_at < v_cutoff
      and j.state in ('succeeded', 'dead', 'cancelled')
    order by j.completed_at
    for update skip locked
    limit p_limit
  ), gone_events as (
    delete from app.job_events e
    using victims v
    where e.tenant_id = v.tenant_id and e.job_id = v.id
    returning 1
  ), gone_jobs as (
    delete from app.jobs j
    using victims v
    where j.id = v.id
    returning 1
  )
  select (select count(*) from gone_jobs), (select count(*) from gone_events)
  into v_jobs, v_events;

  jobs_deleted := v_jobs;
  events_deleted := v_events;
  return next;
end;
$$;

-- Reads for operators ------------------------------------------------------------------

-- Per tenant and state: how many jobs, how many of them are ready to run now, how long
-- the oldest ready one has waited, and how soon the next one not yet ready will be.
-- Scans app.jobs: an operator's query, not a hot-path one. p_tenant_id NULL means every
-- tenant.
create function app.queue_status(p_tenant_id uuid default null)
returns table (
  tenant_id uuid,
  state app.job_state,
  jobs bigint,
  ready_jobs bigint,
  oldest_ready_age interval,
  next_ready_in interval
)
language plpgsql
stable
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  return query
  select j.tenant_id,
         j.state,
         count(*),
         count(*) filter (where j.state in ('pending', 'retry_wait') and j.available_at <= v_now),
         v_now - min(j.available_at)
           filter (where j.state in ('pending', 'retry_wait') and j.available_at <= v_now),
         min(j.available_at)
           filter (where j.state in ('pending', 'retry_wait') and j.available_at > v_now) - v_now
  from app.jobs j
  where p_tenant_id is null or j.tenant_id = p_tenant_id
  group by j.tenant_id, j.state
  order by j.tenant_id, j.state;
end;
$$;

-- One job, without its lease token. No row when the id is unknown.
create function app.get_job(p_job_id uuid)
returns table (
  id uuid,
  tenant_id uuid,
  operation_key text,
  kind text,
  payload jsonb,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  lease_owner text,
  lease_expires_at timestamptz,
  last_error jsonb,
  result jsonb,
  correlation_id text,
  created_at timestamptz,
  updated_at timestamptz,
  completed_at timestamptz
)
language plpgsql
stable
security definer
set search_path = ''
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_job_id', p_job_id);
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.payload, j.state, j.attempts,
         j.max_attempts, j.available_at, j.lease_owner, j.lease_expires_at, j.last_error,
         j.result, j.correlation_id, j.created_at, j.updated_at, j.completed_at
  from app.jobs j
  where j.id = p_job_id;
end;
$$;

-- A job's audit trail in the order it was written (first p_limit events).
create function app.job_timeline(p_job_id uuid, p_limit integer default 1000)
returns table (
  sequence bigint,
  event_type text,
  actor text,
  details jsonb,
  created_at timestamptz
)
language plpgsql
stable
security definer
set search_path = ''
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_job_id', p_job_id);
  perform app.check_range('p_limit', p_limit, 1, 10000);
  return query
  select e.sequence, e.event_type, e.actor, e.details, e.created_at
  from app.jobs j
  join app.job_events e on e.tenant_id = j.tenant_id and e.job_id = j.id
  where j.id = p_job_id
  order by e.sequence
  limit p_limit;
end;
$$;

-- Dead jobs, most recent death first, with the reason their 'dead' event recorded.
create function app.dead_jobs(
  p_tenant_id uuid default null,
  p_kind text default null,
  p_limit integer default 100
)
returns table (
  id uuid,
  tenant_id uuid,
  kind text,
  operation_key text,
  attempts integer,
  max_attempts integer,
  reason text,
  last_error jsonb,
  completed_at timestamptz
)
language plpgsql
stable
security definer
set search_path = ''
as $$
#variable_conflict use_column
begin
  perform app.check_filters(null, p_kind, p_limit);
  return query
  select j.id, j.tenant_id, j.kind, j.operation_key, j.attempts, j.max_attempts,
         d.reason, j.last_error, j.completed_at
  from app.jobs j
  left join lateral (
    select e.details ->> 'reason' as reason
    from app.job_events e
    where e.tenant_id = j.tenant_id and e.job_id = j.id and e.event_type = 'dead'
    order by e.sequence desc
    limit 1
  ) d on true
  where j.completed_at is not null
    and j.state = 'dead'
    and (p_tenant_id is null or j.tenant_id = p_tenant_id)
    and (p_kind is null or j.kind = p_kind)
  order by j.completed_at desc, j.id
  limit p_limit;
end;
$$;

-- Privileges: service_role only (0004 already keeps PUBLIC out of new functions; the
-- revokes say so explicitly for anyone reading this file alone).

revoke all on function
  app.check_filters(uuid[], text, integer),
  app.check_reason(text),
  app.redrive_jobs(text, uuid, uuid[], text, integer, text),
  app.cancel_jobs(text, uuid, uuid[], text, integer, text),
  app.prune_jobs(interval, integer),
  app.queue_status(uuid),
  app.get_job(uuid),
  app.job_timeline(uuid, integer),
  app.dead_jobs(uuid, text, integer)
from public;

grant execute on function
  app.redrive_jobs(text, uuid, uuid[], text, integer, text),
  app.cancel_jobs(text, uuid, uuid[], text, integer, text),
  app.prune_jobs(interval, integer),
  app.queue_status(uuid),
  app.get_job(uuid),
  app.job_timeline(uuid, integer),
  app.dead_jobs(uuid, text, integer)
to service_role;
