-- leaseq functions: reads for operators and the command line.
--
-- Reads never return lease tokens: they fence a worker's writes; an operator needs the
-- owner and expiry, never the token. Dead list limit 1 .. 1000; timeline 1 .. 10000
-- events.

-- Per tenant and state: how many jobs, how many of them are ready to run now, how long
-- the oldest ready one has waited, and how soon the next one not yet ready will be.
-- Scans app.jobs: an operator's query, not a hot-path one. p_tenant_id NULL means every
-- tenant.
create or replace function app.queue_status(p_tenant_id uuid default null)
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
set search_path = pg_catalog, pg_temp
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
revoke all on function app.queue_status(uuid) from public, service_role;
grant execute on function app.queue_status(uuid) to leaseq_operator;

-- One job, without its lease token. No row when the id is unknown.
create or replace function app.get_job(p_job_id uuid)
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
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_job_id', p_job_id);
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.payload::jsonb, j.state, j.attempts,
         j.max_attempts, j.available_at, j.lease_owner, j.lease_expires_at, j.last_error,
         j.result, j.correlation_id, j.created_at, j.updated_at, j.completed_at
  from app.jobs j
  where j.id = p_job_id;
end;
$$;
revoke all on function app.get_job(uuid) from public, service_role;
grant execute on function app.get_job(uuid) to leaseq_operator;

-- A job's audit trail in the order it was written (first p_limit events).
create or replace function app.job_timeline(p_job_id uuid, p_limit integer default 1000)
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
set search_path = pg_catalog, pg_temp
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
revoke all on function app.job_timeline(uuid, integer) from public, service_role;
grant execute on function app.job_timeline(uuid, integer) to leaseq_operator;

-- Dead jobs, most recent death first, with the reason their 'dead' event recorded.
create or replace function app.dead_jobs(
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
set search_path = pg_catalog, pg_temp
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
revoke all on function app.dead_jobs(uuid, text, integer) from public, service_role;
grant execute on function app.dead_jobs(uuid, text, integer) to leaseq_operator;
