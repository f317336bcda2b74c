-- leaseq functions: enqueue.
--
-- Idempotent on (tenant_id, operation_key). Argument bounds (outside, or NULL, is 22023):
--   enqueue batch      1 .. 1000 jobs
--   available_at       clamped to now when in the past, at most 365 days ahead
--   max_attempts       1 .. 20
--   payload            a JSON object of at most 256 KiB (as text), nested at most 100
--                      levels deep (deeper cannot be decoded by a worker)

-- Set-based enqueue of up to 1000 jobs. Each input position gets one output row:
--   status 'created'  a new job, with exactly one 'created' event;
--   status 'existing' (tenant_id, operation_key) already names a job with the same kind
--                     and payload (whatever its state): no new row, no new event;
--   status 'conflict' it names a job with a different kind or payload: nothing written.
create or replace function app.enqueue_jobs(
  p_tenant_ids uuid[],
  p_operation_keys text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_available_ats timestamptz[] default null,
  p_max_attempts integer[] default null,
  p_correlation_ids text[] default null
)
returns table (ord integer, job_id uuid, status text, state app.job_state)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_count integer := coalesce(cardinality(p_tenant_ids), 0);
  v_item record;
  v_created uuid[];
  v_new_tenants uuid[];
  v_new_ats timestamptz[];
begin
  perform app.check_range('number of jobs', v_count, 1, 1000);
  if coalesce(cardinality(p_operation_keys), -1) <> v_count
     or coalesce(cardinality(p_kinds), -1) <> v_count
     or coalesce(cardinality(p_payloads), -1) <> v_count
     or (p_available_ats is not null and cardinality(p_available_ats) <> v_count)
     or (p_max_attempts is not null and cardinality(p_max_attempts) <> v_count)
     or (p_correlation_ids is not null and cardinality(p_correlation_ids) <> v_count) then
    perform app.raise_invalid('enqueue arrays must all have the same length');
  end if;

  for v_item in
    select * from unnest(p_tenant_ids, p_operation_keys, p_kinds, p_payloads)
      with ordinality as u(tenant_id, operation_key, kind, payload, n)
  loop
    if v_item.tenant_id is null then
      perform app.raise_invalid(format('job %s: tenant_id is required (got NULL)', v_item.n));
    end if;
    if v_item.operation_key is null or v_item.operation_key ~ '^\s*$' or length(v_item.operation_key) > 255 then
      perform app.raise_invalid(format('job %s: operation_key must be a non-blank text of at most 255 characters', v_item.n));
    end if;
    if v_item.kind is null or v_item.kind ~ '^\s*$' or length(v_item.kind) > 128 then
      perform app.raise_invalid(format('job %s: kind must be a non-blank text of at most 128 characters', v_item.n));
    end if;
    if v_item.payload is null or jsonb_typeof(v_item.payload) <> 'object' then
      perform app.raise_invalid(format('job %s: payload must be a JSON object (got %s)',
        v_item.n, coalesce(jsonb_typeof(v_item.payload), 'NULL')));
    end if;
    if jsonb_path_exists(v_item.payload, '$.**{101}') then
      perform app.raise_invalid(format('job %s: payload must nest at most 100 levels below the top-level object', v_item.n));
    end if;
    if octet_length(v_item.payload::text) > 262144 then
      perform app.raise_invalid(format('job %s: payload must be at most 262144 bytes as JSON text (got %s)',
        v_item.n, octet_length(v_item.payload::text)));
    end if;
    if p_available_ats is not null and p_available_ats[v_item.n] > v_now + interval '365 days' then
      perform app.raise_invalid(format('job %s: available_at must be at most 365 days ahead (got %s)',
        v_item.n, p_available_ats[v_item.n]));
    end if;
    if p_max_attempts is not null then
      perform app.check_range(format('job %s: max_attempts', v_item.n),
        coalesce(p_max_attempts[v_item.n], 6), 1, 20);
    end if;
    if p_correlation_ids is not null and length(p_correlation_ids[v_item.n]) not between 1 and 200 then
      perform app.raise_invalid(format('job %s: correlation_id must have 1 to 200 characters', v_item.n));
    end if;
  end loop;

  with input as (
    select u.*
    from unnest(
      p_tenant_ids, p_operation_keys, p_kinds, p_payloads,
      coalesce(p_available_ats, array_fill(null::timestamptz, array[v_count])),
      coalesce(p_max_attempts, array_fill(null::integer, array[v_count])),
      coalesce(p_correlation_ids, array_fill(null::text, array[v_count]))
    ) with ordinality as u(tenant_id, operation_key, kind, payload, available_at, max_attempts, correlation_id, n)
  ), inserted as (
    insert into app.jobs (
      tenant_id, operation_key, kind, payload, available_at, max_attempts,
      correlation_id, created_at, updated_at
    )
    select i.tenant_id, i.operation_key, i.kind, i.payload,
           greatest(coalesce(i.available_at, v_now), v_now),
           coalesce(i.max_attempts, 6), i.correlation_id, v_now, v_now
    from input i
    order by i.n
    on conflict (tenant_id, operation_key) do nothing
    returning id, tenant_id, kind, available_at, max_attempts, correlation_id
  )
  , audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select ins.tenant_id, ins.id, 'created', 'enqueue',
           jsonb_strip_nulls(jsonb_build_object(
             'kind', ins.kind,
             'availableAt', ins.available_at,
             'maxAttempts', ins.max_attempts,
             'correlationId', ins.correlation_id)),
           v_now
    from inserted ins
  )
  select coalesce(array_agg(ins.id), '{}'), array_agg(ins.tenant_id), array_agg(ins.available_at)
  into v_created, v_new_tenants, v_new_ats
  from inserted ins;
  -- The new jobs' tenants are due a turn by their available_at (app.wake_tenants).
  if v_new_tenants is not null then
    perform app.wake_tenants(v_new_tenants, v_new_ats);
  end if;

  -- A new statement, so it sees the rows the insert above wrote and those that
  -- concurrent enqueues committed while it waited on their unique-key conflict.
  return query
  select i.n::integer,
         j.id,
         case
           when j.id = any (v_created)
                and i.n = min(i.n) over (partition by i.tenant_id, i.operation_key)
             then 'created'
           when j.kind = i.kind and j.payload = i.payload then 'existing'
           else 'conflict'
         end,
         j.state
  from unnest(p_tenant_ids, p_operation_keys, p_kinds, p_payloads)
         with ordinality as i(tenant_id, operation_key, kind, payload, n)
  join app.jobs j on j.tenant_id = i.tenant_id and j.operation_key = i.operation_key
  order by i.n;
end;
$$;
revoke all on function app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[], integer[], text[]) from public;
grant execute on function app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[], integer[], text[]) to service_role;

create or replace function app.enqueue_job(
  p_tenant_id uuid,
  p_operation_key text,
  p_kind text,
  p_payload jsonb,
  p_available_at timestamptz default null,
  p_max_attempts integer default 6
)
returns app.jobs
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_result record;
  v_job app.jobs;
begin
  perform app.check_range('p_max_attempts', p_max_attempts, 1, 20);
  select * into v_result
  from app.enqueue_jobs(array[p_tenant_id], array[p_operation_key], array[p_kind],
                        array[p_payload], array[p_available_at], array[p_max_attempts]);
  select * into v_job from app.jobs where id = v_result.job_id and tenant_id = p_tenant_id;
  if v_result.status = 'conflict' then
    raise exception using
      errcode = '23505',
      message = format('operation_key %L of tenant %s already names job %s (kind %L) with a different kind or payload',
                       p_operation_key, p_tenant_id, v_job.id, v_job.kind),
      hint = 'Use a new operation_key for a different job, or repeat the original kind and payload.';
  end if;
  -- A producer learns the job's state, never the lease that a worker holds on it.
  v_job.lease_token := null;
  return v_job;
end;
$$;
revoke all on function app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer) from public;
grant execute on function app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer) to service_role;
